"""The job file: parsed and validated once, at the edge, into frozen dataclasses.

``load_job`` reads a job file, applies ``--set key=value`` overrides and returns a
``JobConfig``; everything downstream takes these objects and never looks at YAML again.

Modules, lowest first:

* ``checks``: value checks and combinators (numbers in bounds, choices, device strings,
  host:port ...), the ``Invalid`` failure they raise, and ``build``, which makes a
  section dataclass from a mapping by running its fields' checks and its cross check.
* ``model_section``: ``model`` (a name, a code path and the model's parameters).
* ``data_options``: the data section's nested keys, ``data.schema`` (a TFRecord's
  feature layout, or a preset of one) and ``data.image`` (decoding, augmentation).
* ``sources``: the data keys each ``data.source`` uses (``SOURCE_KEYS``, a line each).
* ``training``: the sections of how a job trains (``towers``, ``optimizer``, ``train``,
  ``eval``) and their vocabularies (``OPTIMIZERS``, ``PRECISIONS`` ...).
* ``job``: ``JobConfig`` and the rest of its sections (``run``, ``data``, ``session``,
  ``metrics``, ``cluster``), each dataclass with its fields, defaults and cross check;
  ``derived_comments``, the values a job implies but no key holds.
* ``arrangements``: what each ``cluster.backend`` (in_process, ps_worker, collective,
  horovod) refuses, and which one a command runs a job under (``choose``,
  ``train_is_task``).
* ``loading``: YAML (duplicate and merge keys), ``--set`` overrides, ``ConfigError`` and
  which source a failure is blamed on, ``load_job``, ``from_dict``, ``to_dict``,
  ``dump_yaml`` and ``raw_job``.

The names below are the package's interface; import them from ``launch.config``.
"""

from launch.config.arrangements import ARRANGEMENTS, BACKENDS, choose, train_is_task
from launch.config.checks import AUTO
from launch.config.data_options import (
    FEATURE_KINDS,
    PIXEL_KINDS,
    SCHEMA_PRESETS,
    ImageConfig,
    RecordSchemaConfig,
)
from launch.config.job import (
    ClusterConfig,
    DataConfig,
    JobConfig,
    MetricsConfig,
    RunConfig,
    SessionConfig,
    derived_comments,
)
from launch.config.loading import (
    ConfigError,
    dump_yaml,
    from_dict,
    load_job,
    raw_job,
    to_dict,
)
from launch.config.model_section import ModelConfig
from launch.config.sources import SOURCE_KEYS, SourceKeys
from launch.config.training import (
    EvalConfig,
    LossScaleConfig,
    OptimizerConfig,
    ScheduleConfig,
    TowersConfig,
    TrainConfig,
    WarmStartConfig,
)

__all__ = [
    "ARRANGEMENTS",
    "AUTO",
    "BACKENDS",
    "FEATURE_KINDS",
    "PIXEL_KINDS",
    "SCHEMA_PRESETS",
    "SOURCE_KEYS",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ImageConfig",
    "JobConfig",
    "LossScaleConfig",
    "MetricsConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RecordSchemaConfig",
    "RunConfig",
    "ScheduleConfig",
    "SessionConfig",
    "SourceKeys",
    "TowersConfig",
    "TrainConfig",
    "WarmStartConfig",
    "choose",
    "derived_comments",
    "dump_yaml",
    "from_dict",
    "load_job",
    "raw_job",
    "to_dict",
    "train_is_task",
]
