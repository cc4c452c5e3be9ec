"""Every mistake in a job file or on the command line: exit 2, one line naming it, nothing written.

Each case runs the command's own main() in the test process (a new process would spend
seconds importing TensorFlow for a run that ends before any work); a few cases run the
real command in a subprocess too, where TensorFlow's own notices could reach stderr.
"""

import os
import socket
from dataclasses import dataclass, field

import numpy as np
import pytest
import tensorflow as tf
from helpers.commands import run_in_process, run_towers
from helpers.data_files import class_images, encode, image_feature_map, write_examples


@dataclass(frozen=True)
class Case:
    id: str
    job: str | None  # job file text, or None for the built-in job
    says: tuple[str, ...]  # each must appear in the error line (key, path, ...)
    args: tuple[str, ...] = ()
    setup: str | None = None  # a function below preparing the case dir; may return
    # {placeholder: text} to substitute in the job file
    command: tuple[str, ...] = ("train",)
    extra: dict = field(default_factory=dict)


def corrupt_tfrecord(case_dir):
    path = os.path.join(case_dir, "bad.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(20):
            example = tf.train.Example(features=tf.train.Features(feature={
                "features": tf.train.Feature(float_list=tf.train.FloatList(value=[0.0] * 8)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
            }))
            writer.write(example.SerializeToString())
    data = bytearray(open(path, "rb").read())
    middle = len(data) // 2
    data[middle:middle + 8] = b"\xff" * 8
    open(path, "wb").write(bytes(data))


def npz_with_five_features(case_dir):
    np.savez(os.path.join(case_dir, "five.npz"), features=np.zeros((8, 5), np.float32),
             labels=np.zeros(8, np.int64))


def npz_with_nan_features(case_dir):
    """As reported: an npz whose features hold NaN, which trained until the first step
    diverged and blamed the learning rate."""
    features = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    features[3:7, 2] = np.nan
    np.savez(os.path.join(case_dir, "nan.npz"), features=features,
             labels=np.arange(40) % 10)


def csv_with_class_names(case_dir):
    rows = "".join(f"{i}.5,{i},class_{i % 3}\n" for i in range(133))
    open(os.path.join(case_dir, "d.csv"), "w").write("x0,x1,label\n" + rows)


def garbage_npz(case_dir):
    open(os.path.join(case_dir, "garbage.npz"), "wb").write(b"this is not a zip archive")


def csv_without_label(case_dir):
    rows = "a,b,c,d,e,f,g,h,target\n" + "0,0,0,0,0,0,0,0,1\n" * 4
    open(os.path.join(case_dir, "d.csv"), "w").write(rows)


def table_csv(case_dir, name="d.csv", rows=2000, spoil=None):
    """The case that was reported: 12 numeric features x0..x11, labels 0, 1, 2.
    spoil(cells of each data row) may break some."""
    rng = np.random.default_rng(0)
    table = [[f"{v:.4f}" for v in rng.normal(size=12)] + [str(i % 3)] for i in range(rows)]
    if spoil:
        spoil(table)
    lines = [",".join([f"x{i}" for i in range(12)] + ["label"])] + [",".join(r) for r in table]
    open(os.path.join(case_dir, name), "w").write("\n".join(lines) + "\n")


def csv_blank_cell_late(case_dir):
    table_csv(case_dir, spoil=lambda table: table[1233].__setitem__(3, ""))


def csv_short_row_late(case_dir):
    table_csv(case_dir, spoil=lambda table: table[1233].pop())


def csv_label_out_of_range_late(case_dir):
    table_csv(case_dir, spoil=lambda table: table[1900].__setitem__(12, "3"))


def csv_header_only(case_dir):
    table_csv(case_dir, rows=0)


def csv_header_only_eval_set(case_dir):
    table_csv(case_dir)
    table_csv(case_dir, "test.csv", rows=0)


def empty_npz(case_dir):
    np.savez(os.path.join(case_dir, "empty.npz"), features=np.zeros((0, 8), np.float32),
             labels=np.zeros(0, np.int64))


def tfrecord_without_records(case_dir):
    with tf.io.TFRecordWriter(os.path.join(case_dir, "empty.tfrecord")):
        pass


def tfrecord_late_record_missing_key(case_dir):
    with tf.io.TFRecordWriter(os.path.join(case_dir, "late.tfrecord")) as writer:
        for i in range(40):
            feature = {"features": tf.train.Feature(float_list=tf.train.FloatList(
                value=[0.0] * 8))}
            if i != 30:
                feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))
            writer.write(tf.train.Example(features=tf.train.Features(
                feature=feature)).SerializeToString())


def checkpoint_of_other_model(case_dir):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("other/kernel", [3, 3])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().save(sess, os.path.join(case_dir, "ckpt", "model.ckpt"))


def file_in_place_of_dir(case_dir):
    open(os.path.join(case_dir, "not_a_dir"), "w").write("x")


def imagenet_records(case_dir, spoil=None):
    """Four ImageNet-layout records of 12x12 JPEGs; spoil(feature_maps) breaks one."""
    images, labels = class_images(4, size=12)
    maps = [image_feature_map(encode(image), int(label))
            for image, label in zip(images, labels, strict=True)]
    if spoil:
        spoil(maps)
    write_examples(os.path.join(case_dir, "images.tfrecord"), maps)


def corrupt_image(case_dir):
    imagenet_records(case_dir, lambda maps: maps.__setitem__(
        1, image_feature_map(b"\xff\xd8\xff\xe0 not the rest of a JPEG", 0)))


def record_missing_label(case_dir):
    imagenet_records(case_dir, lambda maps: maps[2].pop("image/class/label"))


def label_out_of_range(case_dir):
    imagenet_records(case_dir, lambda maps: maps[3]["image/class/label"].int64_list.value.
                     __setitem__(0, 12))


USER_MODEL = """
import tensorflow as tf

CONFIG = {"hidden": 4}


def build(hidden=8):
    def model_fn(features, labels, ctx):
        w = tf.compat.v1.get_variable("w", [64, 10])
        return tf.reduce_mean(tf.matmul(features, w))
    return model_fn


build.input_spec = {"feature_shape": [64], "num_classes": 10}
"""


def user_model(case_dir):
    """A model file of the user's own beside the job file."""
    open(os.path.join(case_dir, "user_model.py"), "w").write(USER_MODEL)


def user_model_and_five_features(case_dir):
    user_model(case_dir)
    npz_with_five_features(case_dir)


HELD_SOCKETS: list[socket.socket] = []  # closed once every case has run


def port_in_use(case_dir):
    """A port another process listens on, held open while the case runs."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    HELD_SOCKETS.append(held)
    return {"PORT": str(held.getsockname()[1])}


MLP8 = "model: {name: mlp, input_dim: 8, hidden_units: [4]}\n"
MLP12 = "model: {name: mlp, input_dim: 12, hidden_units: [4], num_classes: 3}\n"
CSV = "data: {source: csv, path: CASE/d.csv}\n"
IMAGES = ("model: {name: convnet, image_size: 12, channels: 3, num_classes: 3, filters: [4]}\n"
          "data: {source: tfrecord, path: CASE/images.tfrecord, schema: imagenet}\n")

CASES = [
    Case("unknown-section", "trian: {steps: 5}\n", ("trian", "did you mean 'train'")),
    Case("unknown-key", "train: {stepz: 5}\n", ("train.stepz", "did you mean 'steps'")),
    Case("wrong-type", "train: {steps: many}\n", ("train.steps",)),
    Case("zero-batch", "train: {batch_size: 0}\n", ("train.batch_size",)),
    Case("negative-rate", "optimizer: {learning_rate: -1}\n", ("optimizer.learning_rate",)),
    Case("unknown-model", "model: {name: resnet21}\n", ("model.name", "resnet20")),
    Case("unknown-model-param", "model: {name: mlp, hiden_units: [3]}\n",
         ("model.hiden_units", "hidden_units")),
    Case("unknown-optimizer", "optimizer: {name: adm}\n", ("optimizer.name", "adam")),
    Case("unknown-schedule", "optimizer: {schedule: {name: linear}}\n",
         ("optimizer.schedule.name", "cosine")),
    Case("piecewise-lengths", "optimizer: {schedule: {name: piecewise, boundaries: [10], "
         "values: [0.1]}}\n", ("optimizer.schedule",)),
    Case("malformed-device", "towers: {devices: [gpu0]}\n", ("towers.devices", "gpu0")),
    Case("absent-gpu", "towers: {devices: ['/gpu:0']}\n", ("towers.devices", "/gpu:0")),
    Case("more-towers-than-examples", "towers: {devices: 4}\ntrain: {batch_size: 2}\n",
         ("train.batch_size",)),
    Case("validate-more-towers-than-examples", "towers: {devices: 4}\ntrain: {batch_size: 2}\n",
         ("train.batch_size", "cannot give each of 4 towers"), command=("validate",)),
    Case("unknown-variable-update", "towers: {variable_update: ring}\n",
         ("towers.variable_update", "replicated")),
    Case("unknown-source", "data: {source: parquet}\n", ("data.source", "tfrecord")),
    Case("missing-data-file", "data: {source: npz, path: /nonexistent/train.npz}\n",
         ("/nonexistent/train.npz",)),
    Case("glob-matches-nothing", "data: {source: tfrecord, path: '/nonexistent/*.tfrecord'}\n",
         ("/nonexistent/*.tfrecord",)),
    Case("unreadable-npz", MLP8 + "data: {source: npz, path: CASE/garbage.npz}\n",
         ("garbage.npz",), setup="garbage_npz"),
    Case("npz-wrong-shape", MLP8 + "data: {source: npz, path: CASE/five.npz}\n",
         ("five.npz",), setup="npz_with_five_features"),
    Case("npz-features-not-finite", MLP8 + "data: {source: npz, path: CASE/nan.npz}\n",
         ("nan.npz: example 3 (counted from 0) has a feature that is not a finite number (nan)",
          "as do 4 of its 40 examples"), setup="npz_with_nan_features"),
    Case("csv-class-names", "model: {name: mlp, input_dim: 2, num_classes: 3}\n" + CSV,
         ("line 2, column 'label': 'class_0' is not a class id", "number the classes",
          "(and every other row)"), setup="csv_with_class_names"),
    Case("csv-missing-label", MLP8 + "data: {source: csv, path: CASE/d.csv}\n",
         ("d.csv", "label"), setup="csv_without_label"),
    Case("csv-classes-disagree", MLP12.replace(", num_classes: 3", "") + CSV,
         ("model 'mlp' and the data", "10 vs 3 classes", "d.csv line 4", "data.num_classes"),
         setup="table_csv"),
    Case("csv-blank-cell-late", MLP12 + CSV,
         ("d.csv: line 1235, column 'x3': the cell is blank",), setup="csv_blank_cell_late"),
    Case("csv-short-row-late", MLP12 + CSV,
         ("d.csv: line 1235: 12 fields, the header has 13 columns",),
         setup="csv_short_row_late"),
    Case("csv-stray-label-late", MLP12 + CSV,
         ("3 vs 4 classes (the largest label, 3, at", "d.csv line 1902;"),
         setup="csv_label_out_of_range_late"),
    Case("csv-label-out-of-range-late",
         MLP12 + "data: {source: csv, path: CASE/d.csv, num_classes: 3}\n",
         ("d.csv: line 1902, column 'label': label 3 is outside [0, 3)",),
         setup="csv_label_out_of_range_late"),
    Case("csv-header-only", MLP12 + CSV,
         ("d.csv: no examples: a header row and no data rows",), setup="csv_header_only"),
    Case("csv-header-only-eval-set", MLP12 + "data: {source: csv, path: CASE/d.csv, "
         "eval_path: CASE/test.csv}\n", ("test.csv: no examples",),
         setup="csv_header_only_eval_set", command=("eval",)),
    Case("npz-without-examples", MLP8 + "data: {source: npz, path: CASE/empty.npz}\n",
         ("empty.npz: no examples",), setup="empty_npz"),
    Case("tfrecord-without-records", MLP8 + "data: {source: tfrecord, path: CASE/empty.tfrecord}\n",
         ("empty.tfrecord: no examples: no records in any file",),
         setup="tfrecord_without_records"),
    Case("tfrecord-late-record-missing-key",
         MLP8 + "data: {source: tfrecord, path: CASE/late.tfrecord}\n",
         ("late.tfrecord: record 30 has no 'label' feature",),
         setup="tfrecord_late_record_missing_key"),
    Case("corrupt-tfrecord", MLP8 + "data: {source: tfrecord, path: CASE/bad.tfrecord}\n",
         ("bad.tfrecord", "record"), setup="corrupt_tfrecord"),
    Case("corrupt-image", IMAGES, ("images.tfrecord: record 1: the image does not decode: "
                                   "jpeg::Uncompress failed",),
         setup="corrupt_image"),
    Case("record-missing-key", IMAGES, ("images.tfrecord: record 2 has no 'image/class/label'",),
         setup="record_missing_label"),
    Case("label-out-of-range", IMAGES, ("images.tfrecord: record 3", "[12], outside [0, 3)"),
         setup="label_out_of_range"),
    Case("model-data-mismatch", "data: {source: tfrecord, path: x.tfrecord, schema: {preset: "
         "imagenet, shape: [32, 32, 3], num_classes: 10}}\n",
         ("model 'convnet' and the data (data.schema) disagree", "[28, 28, 1] vs [32, 32, 3]")),
    Case("checkpoint-of-other-model", None, ("different model", "convnet/"),
         setup="checkpoint_of_other_model"),
    Case("checkpoint-dir-is-a-file", "train: {checkpoint_dir: CASE/not_a_dir}\n",
         ("train.checkpoint_dir", "not_a_dir"), setup="file_in_place_of_dir"),
    Case("missing-warm-start", "train: {warm_start: {path: /nonexistent/ckpt}}\n",
         ("train.warm_start.path", "/nonexistent/ckpt")),
    Case("duplicate-key", "train: {steps: 5}\ntrain: {steps: 6}\n", ("train", "duplicate")),
    Case("yaml-syntax", "train: {steps: [5\n", ("job.yaml", "line")),
    Case("gpu-memory-fraction", "session: {per_process_gpu_memory_fraction: 1.5}\n",
         ("session.per_process_gpu_memory_fraction",)),
    Case("metrics-port", "metrics: {port: 70000}\n", ("metrics.port",)),
    Case("metrics-port-in-use", "metrics: {port: PORT}\n", ("metrics.port", "in use"),
         setup="port_in_use"),
    Case("eval-metrics-port-in-use", "metrics: {port: PORT}\n", ("metrics.port", "in use"),
         setup="port_in_use", command=("eval",)),
    Case("metrics-addr-invalid", "metrics: {port: 0, addr: 'local host'}\n",
         ("metrics.addr", "local host")),
    Case("metrics-addr-not-local", "metrics: {port: 0, addr: 192.0.2.1}\n",
         ("metrics.addr", "192.0.2.1")),
    Case("metrics-missing-certfile", "metrics: {port: 0, certfile: /nonexistent/cert.pem, "
         "keyfile: /nonexistent/key.pem}\n", ("metrics.certfile", "/nonexistent/cert.pem")),
    Case("bad-override", None, ("--set", "trainsteps"), args=("--set", "trainsteps")),
    Case("override-type", None, ("--set", "train.steps"), args=("--set", "train.steps=lots")),
    Case("missing-job-file", None, ("/nonexistent/job.yaml",),
         args=("-c", "/nonexistent/job.yaml")),
    Case("user-module-missing", "model: {name: 'no_such_module:build'}\n",
         ("model.name", "no module named 'no_such_module'")),
    Case("user-attribute-missing", "model: {name: 'user_model:biuld'}\n",
         ("model.name", "'biuld'", "did you mean 'build'"), setup="user_model"),
    Case("user-attribute-not-callable", "model: {name: 'user_model:CONFIG'}\n",
         ("model.name", "user_model:CONFIG is a dict, not callable"), setup="user_model"),
    Case("user-builder-parameter", "model: {name: 'user_model:build', hiden: 3}\n",
         ("model.hiden", "takes no parameter 'hiden'", "it takes: hidden"),
         setup="user_model"),
    Case("user-model-and-data-disagree",
         "model: {name: 'user_model:build'}\ndata: {source: npz, path: CASE/five.npz}\n",
         ("model 'user_model:build' and the data (", "five.npz) disagree",
          "features [64] vs [5]"),
         setup="user_model_and_five_features"),
    Case("eval-missing-checkpoint", None, ("--checkpoint", "/nonexistent/model.ckpt-5"),
         command=("eval",), args=("--checkpoint", "/nonexistent/model.ckpt-5")),
    Case("export-missing-checkpoint", None, ("--checkpoint", "/nonexistent/model.ckpt-5"),
         command=("export",), args=("--checkpoint", "/nonexistent/model.ckpt-5",
                                    "--out", "/nonexistent/served")),
]


def run_case(case: Case, case_dir: str, run=run_in_process):
    os.makedirs(case_dir, exist_ok=True)
    substitutions = {"CASE": case_dir}
    if case.setup:
        substitutions.update(globals()[case.setup](case_dir) or {})
    args = list(case.command)
    if case.job is not None:
        job = os.path.join(case_dir, "job.yaml")
        text = case.job
        for placeholder, value in substitutions.items():
            text = text.replace(placeholder, value)
        with open(job, "w") as f:
            f.write(text)
        args += ["-c", job]
    if "checkpoint_dir" not in (case.job or ""):
        args += ["--set", f"train.checkpoint_dir={os.path.join(case_dir, 'ckpt')}"]
    args += list(case.args)
    before = snapshot(case_dir)
    result = run(*args, cwd=case_dir)
    return result, before, snapshot(case_dir)


def snapshot(case_dir):
    """Every file under case_dir, but Python's bytecode cache of a model file imported."""
    return sorted(
        os.path.relpath(os.path.join(root, name), case_dir)
        for root, _, names in os.walk(case_dir) for name in names
        if "__pycache__" not in root
    )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad_input")
    try:
        return {c.id: run_case(c, str(base / c.id)) for c in CASES}
    finally:
        for held in HELD_SOCKETS:
            held.close()


def assert_one_clear_line_and_nothing_written(case, result, before, after):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("towers: error: ")
    for expected in case.says:
        assert expected in lines[0], (expected, lines[0])
    assert before == after, "a failed run wrote files"
    assert result.stdout == ""


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line_and_exit_2(outcomes, case):
    assert_one_clear_line_and_nothing_written(case, *outcomes[case.id])


# One mistake found before TensorFlow is imported, two in the data, one in a user's model.
IN_A_PROCESS = ("unknown-section", "npz-wrong-shape", "user-attribute-missing",
                "csv-blank-cell-late")


@pytest.mark.e2e
@pytest.mark.parametrize("case", [c for c in CASES if c.id in IN_A_PROCESS], ids=lambda c: c.id)
def test_the_command_in_its_own_process_prints_only_that_line(tmp_path, case):
    def towers(*args, cwd):
        return run_towers(*args, cwd=cwd, timeout=180)

    assert_one_clear_line_and_nothing_written(case, *run_case(case, str(tmp_path), towers))
