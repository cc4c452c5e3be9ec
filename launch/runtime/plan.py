"""What one process runs where, resolved from the job before any graph is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import tensorflow as tf

import models
import towers
from launch import data, modelref
from launch.config import JobConfig, TowersConfig
from launch.devices import (
    list_gpus,
    num_cpu_devices,
    on_cpus,
    param_device,
    session_config,
    tower_devices,
)
from launch.errors import BadInput

V1 = tf.compat.v1


class Share(NamedTuple):
    """This process's part of a job of ``count`` processes that split every global batch
    and the data between them (ps/worker workers, collective workers, Horovod ranks):
    the ``index``-th share. One process alone: (0, 1)."""

    index: int = 0
    count: int = 1


ALONE = Share()


@dataclass(frozen=True)
class Plan:
    """The facts one process needs, resolved once: what it trains, reads and computes on.

    model: its input_spec always set (a model that declares none gets the data's).
    source: the job's data (launch.data.sources), read for that spec.
    devices: the tower devices. param_device: where variables live, a device,
    "least_loaded", or a device function (a ps/worker job's replica_device_setter).
    session: the session's options. precision: what the towers compute and send in.
    share: this process's part of every global batch and of the data;
    process_batch_size: its examples of each global batch (train.batch_size split
    across the processes by towers.shard_sizes, the towers' own rule).
    sharing: how the towers inside this process share variables and gradients
    (towers.variable_update). host: where the input pipeline and other host-side ops
    run. aggregation: where tower gradients are summed (None: on each variable's device).

    The arrangement of processes adds, where its processes combine their steps
    (collective workers, Horovod ranks): reduce_gradients, how this process's summed
    gradients, loss and metrics are combined with the others'; global_step_examples,
    the examples one advance of the global step stands for, every process's together
    (launch.metrics.throughput.job_examples_per_global_step; 0: process_batch_size, a
    job of one process); sum_across_processes, a plain sum over the
    processes (synchronized batch norm's statistics); pack_bytes,
    towers.pack_gradients_bytes where towers packs gradients (its reduction across
    processes; towers.resolve_variable_update says where), 0 for Horovod ranks, which
    fuse tensors themselves.
    """

    model: models.Model
    source: data.Source
    devices: list[str]
    param_device: str | towers.DeviceFn
    session: V1.ConfigProto
    precision: towers.Precision
    share: Share = ALONE
    process_batch_size: int = 0
    sharing: str = "parameter_server"
    host: str = "/cpu:0"
    aggregation: str | None = None
    reduce_gradients: towers.GradientsFn | None = None
    global_step_examples: float = 0.0
    sum_across_processes: Callable[[tf.Tensor], tf.Tensor] | None = None
    pack_bytes: int = 0

    def variable_update(self) -> towers.VariableUpdate:
        """The update mode: this process's sharing, composed with the reduction across
        processes when there is one (towers.resolve_variable_update). Call it once per
        graph: a least_loaded parameter device keeps its balance in the object."""
        return towers.resolve_variable_update(
            self.sharing, self.param_device, self.devices,
            aggregation_device=self.aggregation, reduce=self.reduce_gradients,
            sum_across_processes=self.sum_across_processes, pack_bytes=self.pack_bytes)

    @property
    def variables_on_ps(self) -> bool:
        """The variables live on a ps/worker job's ps tasks (param_device is its
        replica_device_setter), which other processes share; else on this process's own
        devices."""
        return callable(self.param_device)

    @property
    def job_examples_per_step(self) -> float:
        """The examples one global step stands for, all processes together."""
        return self.global_step_examples or self.process_batch_size


class BatchSizeError(BadInput):
    """train.batch_size leaves a tower without examples (towers.batch_shortfall)."""


def make_plan(job: JobConfig, share: Share = ALONE) -> Plan:
    """This host's plan for the job, as the ``share`` of its processes; raises on bad input.

    An arrangement of several processes moves it onto its own devices and adds how the
    processes combine (launch/distributed/arrangements/).
    """
    devices, param, config = resolve_devices(job, share.count)
    model = resolve_model(job)
    batch = towers.shard_sizes(job.train.batch_size, share.count)[share.index]
    return Plan(model, data.source_of(job.data), devices, param, config,
                precision(job.towers), share, batch, sharing=job.towers.variable_update,
                pack_bytes=job.towers.pack_gradients_bytes)


def resolve_devices(job: JobConfig, processes: int = 1
                    ) -> tuple[list[str], str, V1.ConfigProto]:
    """The tower devices, where the variables live and the session options; raises
    BatchSizeError once the number of towers is known and the batch cannot feed them."""
    num_gpus = len(list_gpus(job.session))
    devices = tower_devices(job.towers, num_gpus)
    param = param_device(job.towers, num_gpus)
    config = session_config(job.session, num_cpu_devices(devices, param), on_cpus(devices))
    _check_batch_size(job, len(devices), processes)
    return devices, param, config


def _check_batch_size(job: JobConfig, num_towers: int, processes: int = 1) -> None:
    """train.batch_size against the towers once their number is known (`devices: auto`
    resolved), times the processes of a multi-process job: the one place a job's batch
    is checked, by the rule towers.batch_shortfall owns. Not in launch.config: the
    towers package imports TensorFlow, and a job file's own mistakes are found
    before that."""
    shortfall = towers.batch_shortfall(job.train.batch_size, num_towers,
                                       job.train.accumulate_steps, processes)
    if shortfall:
        raise BatchSizeError(f"train.batch_size: {shortfall}")


def resolve_model(job: JobConfig) -> models.Model:
    """The job's model (modelref.resolve) with the input spec its towers are fed:
    the one it declares, checked against what the data says it holds, or, for a
    model that declares none, the data's (launch.data.resolve_input_spec)."""
    model = modelref.resolve(job.model)
    _check_feature_dtype(model)
    spec = data.resolve_input_spec(model.name, model.input_spec, job.data)
    return dataclasses.replace(model, input_spec=spec)


def _check_feature_dtype(model: models.Model) -> None:
    """A model declaring float64 features is refused: towers trains in float32 (or 16
    bits), variables and checkpoints float32, and casts float features to that at the
    towers' edge, so a model computing in float64 would meet float32 features (a type
    error inside its first layer). Float64 data are read as float32 for any other model."""
    spec = model.input_spec
    if spec is not None and spec.feature_dtype == tf.float64:
        raise modelref.ModelRefError(
            f"{model.name}: its input_spec declares feature_dtype float64, which towers "
            f"does not train in (towers.precision is float32 or a 16-bit mix, with float32 "
            f"variables; float64 is towers verify's alone): declare feature_dtype float32 "
            f"(float64 data are read as float32) and let the model's variables take the "
            f"towers' type", "input_spec")


def precision(cfg: TowersConfig) -> towers.Precision:
    """What the towers compute, send gradients and scale the loss in."""
    scale = None
    if cfg.precision == "mixed_float16":
        scale = towers.DynamicLossScale(cfg.loss_scale.initial, cfg.loss_scale.growth_steps)
    return towers.Precision(cfg.precision, cfg.gradient_dtype, scale)
