"""What a job runs where, resolved before any graph is built: the plan, its checks, its input."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

import models
import towers
from launch import data, modelref
from launch.config import JobConfig
from launch.devices import list_gpus, num_cpu_devices, param_device, session_config, tower_devices
from launch.errors import BadInput
from launch.runtime import checkpoints

V1 = tf.compat.v1


@dataclass(frozen=True)
class Plan:
    """Everything resolved about a job before a graph is built: what runs where.

    The job's `towers.variable_update` names two choices at once; the plan holds them
    apart. sharing: how the towers inside this process share variables and
    gradients (parameter_server or replicated; in_process_sharing). reduce_gradients:
    how this process's summed gradients, loss and metrics are combined with other
    processes' (Horovod ranks' all-reduce); None in a job of one process, and in a
    ps/worker job, whose processes share variables on the ps tasks instead.

    devices: the tower devices. param_device: where variables live, a device,
    "least_loaded", or a device function (a ps/worker job's replica_device_setter).
    host: where the input pipeline and other host-side ops run. aggregation: where
    tower gradients are summed (None: on each variable's device). batch_size and
    shard: this process's part of every global batch and of the data.
    step_examples: examples a step stands for in the reported rates (0: batch_size);
    Horovod ranks step in lockstep, so each reports the whole job's rate.
    sum_across_processes: a plain sum over the processes (Horovod ranks) for
    synchronized batch norm's statistics; None in a job of one process.
    pack_bytes: towers.pack_gradients_bytes, where towers packs gradients
    (towers.resolve_variable_update says where: the reduction across processes);
    0 for Horovod ranks, which fuse tensors themselves.
    model.input_spec is always set: a model that declares none gets the data's.
    """

    job: JobConfig
    model: models.Model
    devices: list[str]
    param_device: str | towers.DeviceFn
    session: V1.ConfigProto
    sharing: str = "parameter_server"
    host: str = "/cpu:0"
    aggregation: str | None = None
    batch_size: int = 0
    shard: tuple[int, int] = (0, 1)
    reduce_gradients: towers.GradientsFn | None = None
    step_examples: int = 0
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

    def precision(self) -> towers.Precision:
        """What the towers compute, send gradients and scale the loss in."""
        cfg = self.job.towers
        scale = None
        if cfg.precision == "mixed_float16":
            scale = towers.DynamicLossScale(cfg.loss_scale.initial, cfg.loss_scale.growth_steps)
        return towers.Precision(cfg.precision, cfg.gradient_dtype, scale)

    @property
    def examples_per_step(self) -> int:
        return self.step_examples or self.batch_size


class BatchSizeError(BadInput):
    """train.batch_size leaves a tower without examples (towers.batch_shortfall)."""


def make_plan(job: JobConfig, processes: int = 1) -> Plan:
    """Resolve the model, the devices and the session options; raises on bad input.

    processes: how many processes share each global batch (ps/worker workers, Horovod
    ranks), each running the job's towers.
    """
    devices, param, config = resolve_devices(job, processes)
    model = resolve_model(job)
    return Plan(job, model, devices, param, config, sharing=in_process_sharing(job),
                batch_size=job.train.batch_size, pack_bytes=job.towers.pack_gradients_bytes)


def resolve_devices(job: JobConfig, processes: int = 1
                    ) -> tuple[list[str], str, V1.ConfigProto]:
    """The tower devices, where the variables live and the session options; raises
    BatchSizeError once the number of towers is known and the batch cannot feed them."""
    num_gpus = len(list_gpus(job.session))
    devices = tower_devices(job.towers, num_gpus)
    param = param_device(job.towers, num_gpus)
    _check_batch_size(job, len(devices), processes)
    return devices, param, session_config(job.session, num_cpu_devices(devices, param))


def in_process_sharing(job: JobConfig) -> str:
    """How the towers inside each process share variables and gradients. The job
    file's `towers.variable_update` also says how processes are arranged: `horovod`
    runs Horovod ranks, each sharing its towers' variables as parameter_server does
    (the ranks then combine through Plan.reduce_gradients)."""
    choice = job.towers.variable_update
    return "parameter_server" if choice == "horovod" else choice


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
    spec = data.resolve_input_spec(model.name, model.input_spec, job.data)
    return dataclasses.replace(model, input_spec=spec)


def preflight(plan: Plan, is_chief: bool = True) -> None:
    """Check what can be checked before anything is written: data, and for the chief
    (the only process that writes them) the checkpoint paths."""
    job = plan.job
    try:
        data.source_of(job.data).check(plan.model.input_spec, shard=plan.shard)
    except data.DataError as err:
        if plan.model.source == "built-in":
            raise
        # The user's model and the data disagree: name both sides.
        raise data.DataError(
            f"{err} (model {plan.model.name} takes "
            f"{models.describe_spec(plan.model.input_spec)})"
        ) from None
    if not is_chief:
        return
    checkpoints.check_writable_dir(job.train.checkpoint_dir, "train.checkpoint_dir")
    if job.train.warm_start is not None:
        checkpoints.resolve(job.train.warm_start.path, "train.warm_start.path")


def data_where(job: JobConfig, training: bool = True) -> str:
    """The data a job reads, for messages: its paths, or its generated source."""
    return data.source_of(job.data).where(training)


def input_line(plan: Plan) -> str | None:
    """What this process reads when it reads a share of a job's files (ps/worker,
    Horovod): its files, or every n-th record when there are fewer files than readers."""
    return data.source_of(plan.job.data).reader_line(plan.shard)


def check_eval_data(plan: Plan) -> None:
    """The evaluation data checked as preflight checks the training data."""
    data.source_of(plan.job.data).check(plan.model.input_spec, training=False)


def input_tensors(plan: Plan, training: bool, batch_size: int,
                  skipped: data.SkippedRecords | None = None):
    """features, labels of one global batch, produced on the host CPU: [B, ...], B =
    batch_size, except an evaluation's last batch, which holds what is left.

    skipped: where to count records skipped under ``data.on_bad_record: skip``.
    """
    source, spec = data.source_of(plan.job.data), plan.model.input_spec
    with tf.device(plan.host):
        if training:
            dataset = source.training_dataset(spec, batch_size, plan.shard, skipped)
        else:
            dataset = source.eval_dataset(spec, batch_size, skipped)
        return data.input_tensors(dataset)
