"""The input spec the data implies, known without the model, and the two checked.

A model may declare its input (``models.InputSpec``) or leave it to the data. The data
section tells what it will produce as far as it can: a TFRecord schema gives shapes,
dtypes and classes; npz arrays their shapes and dtypes, a CSV source its feature
columns; both give the class count, ``data.num_classes`` or else the largest training
label plus one, which a model must then have; a TFRecord without a schema its first
record's lists; the generated sources nothing (they make whatever the model takes).

    spec = resolve_input_spec("mynet", model.input_spec, job.data)  # None: the data's

Features come as float32 (float lists, images, raw pixels) or int32 (integer lists),
labels as int32, as every built-in model takes them.
"""

from __future__ import annotations

import math

from launch.config import DataConfig
from launch.data.errors import DataError
from launch.data.sources import DataSpec, source_of
from models import InputSpec


def data_spec(cfg: DataConfig) -> DataSpec:
    """What ``cfg`` will produce per example, from the data section and file headers."""
    return source_of(cfg).data_spec()


def resolve_input_spec(model_name: str, declared: InputSpec | None,
                       cfg: DataConfig) -> InputSpec:
    """The input spec the job trains with: the model's, checked against the data; or,
    for a model that declares none, the data's. Raises DataError naming both."""
    data = data_spec(cfg)
    if declared is None:
        spec = data.input_spec()
        if spec is None:
            raise DataError(
                f"model {model_name} declares no input_spec and {data.where} does not give "
                f"its {', '.join(data.missing())}: set them in data.schema (a TFRecord "
                f"source) or declare one on {model_name} (a models.InputSpec or a mapping "
                "of its fields)")
        return spec
    check_agreement(model_name, declared, data)
    return declared


def check_agreement(model_name: str, declared: InputSpec, data: DataSpec) -> None:
    """DataError, one line naming the model and the data, if they disagree."""
    problems = []
    if data.feature_shape is not None:
        same = (tuple(data.feature_shape) == declared.feature_shape if data.exact
                else math.prod(data.feature_shape) == declared.num_features)
        if not same:
            problems.append(f"features {list(declared.feature_shape)} vs "
                            f"{list(data.feature_shape)}")
    if data.feature_dtype is not None and (
            data.feature_dtype.is_integer != declared.feature_dtype.is_integer):
        problems.append(f"features {declared.feature_dtype.name} vs {data.feature_dtype.name}")
    if data.label_shape is not None and math.prod(data.label_shape) != declared.num_labels:
        problems.append(f"labels {list(declared.label_shape)} vs {list(data.label_shape)}")
    if data.num_classes is not None and data.num_classes != declared.num_classes:
        problems.append(_classes_problem(declared.num_classes, data))
    if problems:
        raise DataError(f"model {model_name!r} and the data ({data.where}) disagree, model vs "
                        f"data: {'; '.join(problems)}")


def _classes_problem(declared: int, data: DataSpec) -> str:
    """'10 vs 3 classes (...)': with, for classes counted from the labels, where the
    count came from and how to state another."""
    text = f"{declared} vs {data.num_classes} classes"
    if not data.classes_from:
        return text
    if data.classes_from == "data.num_classes":
        return f"{text} (data.num_classes)"
    return (f"{text} ({data.classes_from}; set the model's class count to "
            f"{data.num_classes}, or data.num_classes if the training labels leave out the "
            "last classes)")
