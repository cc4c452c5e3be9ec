"""CSV sources: the class count from the labels, chosen columns, and a bad row anywhere
named by file, line, column and cause before training (or skipped, and named)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers.data_files import read_all

from launch.config import load_job
from launch.data import (
    DataError,
    SkippedRecords,
    check_source,
    csv_table,
    load_arrays,
    make_dataset,
    resolve_input_spec,
)
from models import InputSpec

# The case that was reported: 12 numeric features, 3 classes, 2,000 rows.
FEATURES = [f"x{i}" for i in range(12)]
TABLE = InputSpec((12,), tf.float32, (), tf.int32, 3)
TEN_CLASSES = InputSpec((12,), tf.float32, (), tf.int32, 10)


def write_table(path, rows: int = 2000, seed: int = 0, spoil: dict | None = None,
                header: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A CSV of ``rows`` rows: x0..x11 then label (0, 1, 2). spoil: {data row index (0
    is line 2): the line's text}. Returns the features [rows, 12] and labels [rows]."""
    rng = np.random.default_rng(seed)
    features = np.round(rng.normal(size=(rows, 12)), 4)
    labels = np.arange(rows) % 3
    lines = [",".join(header or [*FEATURES, "label"])]
    lines += [",".join([*(repr(float(v)) for v in row), str(label)])
              for row, label in zip(features, labels, strict=True)]
    for row, text in (spoil or {}).items():
        lines[row + 1] = text
    path.write_text("\n".join(lines) + "\n")
    return features, labels


def with_cell(path, row: int, column: int, value: str) -> str:
    """The text of data row ``row`` of ``path`` with one cell replaced."""
    cells = path.read_text().splitlines()[row + 1].split(",")
    cells[column] = value
    return ",".join(cells)


def _data(*overrides: str):
    return load_job(None, [f"data.{o}" for o in overrides]).data


def _error(path, spec=TABLE, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        check_source("csv", spec, str(path), **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def _read(dataset) -> tuple[np.ndarray, np.ndarray]:
    return read_all(dataset)


# ------------------------------------------------------------------- classes


def test_the_class_count_comes_from_the_labels_and_a_model_must_agree(tmp_path):
    write_table(tmp_path / "d.csv")
    cfg = _data("source=csv", f"path={tmp_path / 'd.csv'}")
    assert resolve_input_spec("mlp", TABLE, cfg) == TABLE
    with pytest.raises(DataError) as info:
        resolve_input_spec("mlp", TEN_CLASSES, cfg)
    message = str(info.value)
    assert "model 'mlp' and the data (" in message and "10 vs 3 classes" in message
    assert f"the largest label, 2, at {tmp_path / 'd.csv'} line 4" in message
    assert "data.num_classes" in message


def test_a_stray_label_is_named_where_it_skews_the_class_count(tmp_path):
    path = tmp_path / "d.csv"
    write_table(path)
    write_table(path, spoil={1233: with_cell(path, 1233, 12, "7")})
    with pytest.raises(DataError, match=r"3 vs 8 classes \(the largest label, 7, at .*d\.csv "
                                        r"line 1235;"):
        resolve_input_spec("mlp", TABLE, _data("source=csv", f"path={path}"))


def test_data_num_classes_states_classes_the_labels_leave_out(tmp_path):
    write_table(tmp_path / "d.csv")
    cfg = _data("source=csv", f"path={tmp_path / 'd.csv'}", "num_classes=10")
    assert resolve_input_spec("mlp", TEN_CLASSES, cfg) == TEN_CLASSES
    with pytest.raises(DataError, match=r"3 vs 10 classes \(data.num_classes\)"):
        resolve_input_spec("mlp", TABLE, cfg)


def test_a_model_that_declares_no_input_takes_the_tables(tmp_path):
    write_table(tmp_path / "d.csv")
    cfg = _data("source=csv", f"path={tmp_path / 'd.csv'}")
    assert resolve_input_spec("mine", None, cfg) == TABLE


def test_whole_float_labels_are_class_ids(graph, tmp_path):
    path = tmp_path / "d.csv"
    features, labels = write_table(path, rows=6)
    write_table(path, rows=6, spoil={2: with_cell(path, 2, 12, "2.0")})
    _, read = load_arrays("csv", TABLE, str(path))
    assert np.array_equal(read, labels)


@pytest.mark.parametrize("label, says", [
    ("2.5", "'2.5' is not a class id (labels are whole numbers from 0)"),
    ("setosa", "'setosa' is not a class id: labels are whole numbers from 0 (number the "
               "classes before training; names are not mapped)"),
])
def test_labels_that_are_not_class_ids_are_refused(tmp_path, label, says):
    path = tmp_path / "d.csv"
    write_table(path, rows=20)
    write_table(path, rows=20, spoil={4: with_cell(path, 4, 12, label)})
    assert f"d.csv: line 6, column 'label': {says}" in _error(path)


def test_class_names_for_labels_are_told_to_be_numbered_never_skipped(tmp_path):
    """Skipping would drop every row (and, where only some rows name their class, the
    rows of those classes): the hint is the fix, numbering the classes."""
    path = tmp_path / "d.csv"
    path.write_text("x0,x1,label\n" + "".join(f"{i}.5,{i},class_{i % 3}\n" for i in range(133)))
    every = _error(path, InputSpec((2,), tf.float32, (), tf.int32, 3))
    assert every.endswith("line 2, column 'label': 'class_0' is not a class id: labels are "
                          "whole numbers from 0 (number the classes before training; names "
                          "are not mapped) (and every other row)"), every
    write_table(path, rows=20)
    write_table(path, rows=20, spoil={4: with_cell(path, 4, 12, "setosa")})
    some = _error(path)
    assert some.endswith("(number the classes before training; names are not mapped) "
                         "(1 bad row)") and "skip" not in some, some


def test_a_cell_that_is_not_a_finite_number_is_a_bad_row(graph, tmp_path):
    path = tmp_path / "d.csv"
    features, _ = write_table(path, rows=20)
    write_table(path, rows=20, spoil={4: with_cell(path, 4, 3, "nan"),
                                      7: with_cell(path, 7, 0, "-inf")})
    assert _error(path).endswith("d.csv: line 6, column 'x3': nan is not a finite number "
                                 "(2 bad rows; data.on_bad_record: skip leaves bad rows out)")
    skipped = SkippedRecords(str(path), lambda line: None)
    read, _ = read_all(make_dataset("csv", TABLE, 18, path=str(path), training=False,
                                    repeat=False, skipped=skipped))
    assert skipped.count == 2 and np.allclose(read, np.delete(features, [4, 7], axis=0))


def test_a_blank_cell_among_good_rows_may_be_skipped(tmp_path):
    path = tmp_path / "d.csv"
    write_table(path, rows=20)
    write_table(path, rows=20, spoil={4: with_cell(path, 4, 3, "")})
    assert _error(path).endswith("the cell is blank (1 bad row; data.on_bad_record: skip "
                                 "leaves bad rows out)")


# ------------------------------------------------------------------- columns


def test_feature_columns_choose_the_features_and_their_order(graph, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id,name,b,label,a\n7,first row,1.5,2,-1\n8,\"second, quoted\",2.5,0,-2\n")
    spec = InputSpec((2,), tf.float32, (), tf.int32, 3)
    features, labels = load_arrays("csv", spec, str(path), feature_columns=["a", "b"])
    assert np.array_equal(features, [[-1, 1.5], [-2, 2.5]]) and np.array_equal(labels, [2, 0])
    # without them every named column but the label is a feature, and 'name' is text
    four = InputSpec((4,), tf.float32, (), tf.int32, 3)
    assert _error(path, four).endswith(
        "line 2, column 'name': 'first row' is not a number (and every other row; if 'name' "
        "is not a feature, leave it out: data.feature_columns names the features)")


def test_a_column_without_a_name_is_not_a_feature(graph, tmp_path):
    path = tmp_path / "d.csv"  # as pandas writes a frame with its index
    path.write_text(",a,b,label\n0,1.0,2.0,1\n1,3.0,4.0,0\n")
    features, _ = load_arrays("csv", InputSpec((2,), tf.float32, (), tf.int32, 2), str(path))
    assert np.array_equal(features, [[1, 2], [3, 4]])


def test_the_feature_count_must_be_the_models(tmp_path):
    write_table(tmp_path / "d.csv", rows=4)
    wide = InputSpec((13,), tf.float32, (), tf.int32, 3)
    assert ("12 feature columns (every named column but 'label'), the model takes 13"
            in _error(tmp_path / "d.csv", wide))
    assert "2 feature columns (data.feature_columns), the model takes 13" in _error(
        tmp_path / "d.csv", wide, feature_columns=["x0", "x1"])


@pytest.mark.parametrize("header, kwargs, says", [
    ("x0,x1,target", {}, "the CSV header has no label column 'label' (data.label_column); "
                         "it has: x0, x1, target"),
    ("x0,x1,label", {"feature_columns": ["x0", "x2"]},
     "the CSV header has no feature column 'x2' (data.feature_columns)"),
    ("x0,x0,label", {}, "the CSV header names the column 'x0' twice"),
    ("1.5,2.5,1", {}, "line 1 looks like data: the first line must be a header"),
])
def test_header_mistakes(tmp_path, header, kwargs, says):
    path = tmp_path / "d.csv"
    path.write_text(f"{header}\n1,2,1\n")
    assert says in _error(path, InputSpec((2,), tf.float32, (), tf.int32, 3), **kwargs)


def test_every_file_has_the_first_files_header(tmp_path):
    write_table(tmp_path / "a.csv", rows=3)
    write_table(tmp_path / "b.csv", rows=3, header=[*FEATURES[::-1], "label"])
    assert "b.csv: its CSV header differs from the first file's" in _error(tmp_path / "*.csv")


# ------------------------------------------------------------------ bad rows


def _late_bad_rows(path) -> dict[str, str]:
    """Each bad row the reported case met, at data row 1233 (line 1235)."""
    write_table(path)
    return {
        "blank": with_cell(path, 1233, 3, ""),
        "NA": with_cell(path, 1233, 3, "NA"),
        "short": ",".join(path.read_text().splitlines()[1234].split(",")[:-1]),
        "label": with_cell(path, 1233, 12, "3"),
    }


@pytest.mark.parametrize("case, says", [
    ("blank", "line 1235, column 'x3': the cell is blank"),
    ("NA", "line 1235, column 'x3': 'NA' is not a number"),
    ("short", "line 1235: 12 fields, the header has 13 columns"),
    ("label", "line 1235, column 'label': label 3 is outside [0, 3)"),
])
def test_a_bad_row_anywhere_is_named_before_training(graph, tmp_path, case, says):
    path = tmp_path / "d.csv"
    write_table(path, spoil={1233: _late_bad_rows(path)[case]})
    message = _error(path)
    assert message.startswith(f"{path}: {says} (1 bad row;"), message
    assert "data.on_bad_record: skip" in message
    with pytest.raises(DataError, match="line 1235"):
        make_dataset("csv", TABLE, 32, path=str(path))


def test_lines_count_blank_lines_and_the_header(tmp_path):
    path = tmp_path / "d.csv"
    write_table(path, rows=6)
    lines = path.read_text().splitlines()
    lines[4:4] = ["", "   "]
    lines[6] = "NA" + lines[6][lines[6].index(","):]
    path.write_text("\n".join(lines) + "\n")
    assert "line 7, column 'x0': 'NA' is not a number" in _error(path)


def test_integer_models_need_whole_numbers(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n1,2,0\n3,4.5,1\n")
    tokens = InputSpec((2,), tf.int32, (), tf.int32, 2)
    assert "line 3, column 'b': 4.5 is not a whole number (the model takes int32 features)" in (
        _error(path, tokens))


def test_skipping_leaves_bad_rows_out_and_names_the_first_ten(graph, tmp_path):
    path = tmp_path / "d.csv"
    write_table(path, rows=100)
    bad_rows = list(range(3, 100, 4))  # 25 rows
    write_table(path, rows=100, spoil={row: with_cell(path, row, 5, "NA") for row in bad_rows})
    check_source("csv", TABLE, str(path), on_bad_record="skip")
    lines, counted = [], []
    skipped = SkippedRecords(str(path), lines.append, counted.append)
    _, labels = _read(make_dataset("csv", TABLE, 16, path=str(path), training=False,
                                   repeat=False, skipped=skipped))
    assert len(labels) == 75 and skipped.count == 25 and sum(counted) == 25
    assert lines[0] == (f"data: skipped {path}: line 5, column 'x5': 'NA' is not a number "
                        "(the 1st record skipped; data.on_bad_record: skip)")
    assert "line 9," in lines[1] and "(the 2nd record skipped;" in lines[1]
    assert len(lines) == 11 and "(the 10th record skipped;" in lines[9]
    assert lines[10] == (f"data: skipped 25 records of {path} so far, the first 10 named above "
                         "(data.on_bad_record: skip)")


def test_the_start_up_checks_read_the_jobs_own_columns_and_skips(tmp_path):
    """What `towers train` checks before its first step is the data as the job reads it:
    a column of text left out by data.feature_columns, and a bad row data.on_bad_record
    leaves out, are no reason to refuse the job."""
    from helpers.commands import run_in_process

    path = tmp_path / "d.csv"
    path.write_text("a,b,note,label\n" + "".join(f"{i % 5},{i % 3},n{i},{i % 2}\n"
                                                  for i in range(40)) + "x,1,bad,0\n")
    result = run_in_process(
        "validate", "--set", "model.name=mlp", "--set", "model.input_dim=2",
        "--set", "model.num_classes=2", "--set", "data.source=csv",
        "--set", f"data.path={path}", "--set", "data.feature_columns=[a, b]",
        "--set", "data.on_bad_record=skip", "--set", "train.batch_size=8",
        "--set", f"train.checkpoint_dir={tmp_path / 'c'}")
    assert result.returncode == 0, result.stderr


def test_a_header_without_rows_has_no_examples(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(",".join([*FEATURES, "label"]) + "\n\n")
    assert _error(path) == f"{path}: no examples: a header row and no data rows"
    with pytest.raises(DataError, match="no examples"):
        resolve_input_spec("mine", None, _data("source=csv", f"path={path}"))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "empty file, expected a CSV header row" in _error(empty)


def test_skipping_every_row_leaves_no_examples(tmp_path):
    path = tmp_path / "d.csv"
    write_table(path, rows=2, spoil={0: "1,2", 1: "3,4"})
    message = _error(path, on_bad_record="skip")
    assert message.startswith(f"{path}: no examples: all 2 rows are bad, e.g. {path}: line 2:")


def test_a_source_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    write_table(tmp_path / "d.csv", rows=50)
    monkeypatch.setattr(csv_table, "MAX_CSV_BYTES", 1024)
    assert "a CSV source is read whole into memory, up to" in _error(tmp_path / "d.csv")


def test_a_changed_file_is_read_again(tmp_path):
    path = tmp_path / "d.csv"
    write_table(path, rows=10)
    check_source("csv", TABLE, str(path))
    write_table(path, rows=10, spoil={7: with_cell(path, 7, 0, "")})
    assert "line 9, column 'x0': the cell is blank" in _error(path)
