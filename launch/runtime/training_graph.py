"""The training graph of a job: input, towers, optimizer, summaries, warm start, saver."""

from __future__ import annotations

import contextlib
import os
import random
import warnings
from collections.abc import Callable, Iterator
from typing import NamedTuple

import tensorflow as tf

import towers
from launch import data
from launch.config import JobConfig
from launch.log import log
from launch.runtime import checkpoints
from launch.runtime.data_state import DataState
from launch.runtime.input_watch import count_batches
from launch.runtime.inputs import TrainingInput, training_input
from launch.runtime.optim import learning_rate, make_optimizer
from launch.runtime.plan import Plan
from launch.runtime.positions_saver import positions_saver
from launch.runtime.worker_positions import WorkerPositions

V1 = tf.compat.v1


OptimizerWrapper = Callable[[V1.train.Optimizer], V1.train.Optimizer]


class TrainingGraph(NamedTuple):
    """What the loop runs: the step's ops, the scaffold (saver, initialisers), the
    learning rate; the input (started at position 0 by the scaffold's local
    initialiser, and where the data stands by launch.runtime.data_state's hook) and the
    data state the checkpoint keeps."""

    ops: towers.TrainOps
    scaffold: V1.train.Scaffold
    rate: tf.Tensor
    input: TrainingInput
    data_state: DataState
    positions: WorkerPositions | None = None  # an asynchronous ps/worker job's


def build_training_graph(
    job: JobConfig, plan: Plan, wrap_optimizer: OptimizerWrapper | None = None,
    skipped: data.SkippedRecords | None = None, write: Callable[[str], None] = log,
) -> TrainingGraph:
    """The whole training graph of ``job`` as ``plan`` places it, in the default graph.

    wrap_optimizer: e.g. SyncReplicasOptimizer for a synchronous ps/worker job.
    skipped: counts the input records skipped (data.on_bad_record: skip).
    write: where the build's notices go (a warm start, the library's warnings).
    """
    # Each process of a job (Horovod rank, worker) draws its own random stream, process 0
    # the seed's own: otherwise every rank would apply the same dropout masks. Initial
    # values need not agree (rank 0's are broadcast, the chief's are the ps's).
    seed = job.train.seed + plan.share.index
    V1.set_random_seed(seed)
    # Keras draws its layers' seeds (dropout, initial weights) from Python's generator.
    random.seed(seed)
    feed = training_input(plan, job.train.batch_size, skipped)

    mode = plan.variable_update()
    step_device = mode.step_device(plan.devices)
    with V1.device(step_device):
        global_step = V1.train.get_or_create_global_step()
    state = DataState(feed, job.train.batch_size, job.data.seed, step_device)
    positions = WorkerPositions(plan.share.count, plan.share.index, job.train.batch_size,
                                step_device) if asynchronous(job, plan) else None
    rate = learning_rate(job.optimizer, global_step, job.train.batch_size)
    optimizer = make_optimizer(job.optimizer, rate)
    if wrap_optimizer is not None:
        optimizer = wrap_optimizer(optimizer)
    with told_as_lines(write):
        # Each example's dropout drawn from (seed, position).
        ops = build_step(job, plan, feed.features, feed.labels, optimizer, mode, global_step,
                         positions=feed.positions)
    ops = ops._replace(train_op=tf.group(ops.train_op, count_batches(feed.features, plan.host)))
    if positions is not None:
        ops = ops._replace(train_op=positions.advanced_by(ops.train_op))
    _add_summaries(ops, rate, job.train.histograms)
    if job.train.warm_start is not None:
        kept = {id(v) for v in (*optimizer.variables(), global_step,
                                *state.variables.values(),
                                *V1.get_collection(checkpoints.RESTORED_APART))}
        model_vars = [v for v in V1.global_variables() if id(v) not in kept]
        # A weight average the checkpoint lacks starts from its weight's value there.
        averaged = {name: w.op.name
                    for name, w in towers.average_names(V1.trainable_variables()).items()
                    } if job.train.moving_average_decay else None
        checkpoints.warm_start(job.train.warm_start, model_vars, write, averaged)
    saving = dict(max_to_keep=job.train.max_to_keep,
                  keep_checkpoint_every_n_hours=job.train.keep_checkpoint_every_n_hours,
                  save_relative_paths=True)
    saver = V1.train.Saver(**saving) if positions is None else \
        positions_saver(positions, state, global_step, **saving)
    scaffold = V1.train.Scaffold(
        saver=saver,
        local_init_op=tf.group(V1.train.Scaffold.default_local_init_op(), ops.sync_op,
                               feed.initializer),
        **_readiness_checks(plan),
    )
    return TrainingGraph(ops, scaffold, rate, feed, state, positions)


def _readiness_checks(plan: Plan) -> dict[str, tf.Tensor]:
    """The scaffold's checks that every variable is initialised as a session starts: its
    default ones (TensorFlow's report of uninitialised variables) where the variables
    live on ps tasks, which a worker must wait for the chief to initialise; elsewhere
    none.

    Only this process initialises (or restores) a variable that is not on a ps: an
    in-process job, each collective worker and Horovod rank its own copy. There the
    default checks, two session runs over every variable, find nothing: 0.4-0.5 s of a
    2-tower resnet20 start on a loaded 2-core CPU. An empty report is the scaffold's
    way to say "ready" (tf.compat.v1.train.Scaffold's ready_op).
    """
    if plan.variables_on_ps:
        return {}
    ready = tf.constant([], tf.string, name="initialised_here")
    return {"ready_op": ready, "ready_for_local_init_op": ready}


def asynchronous(job: JobConfig, plan: Plan) -> bool:
    """An asynchronous ps/worker job of several workers: each worker's step moves the
    global step, and each trains its part of the global batches at its own pace."""
    return plan.variables_on_ps and plan.share.count > 1 and not job.train.sync


def build_step(job: JobConfig, plan: Plan, features: towers.Features, labels: tf.Tensor,
               optimizer: V1.train.Optimizer, mode: towers.VariableUpdate,
               global_step: tf.Variable, positions: tf.Tensor | None = None
               ) -> towers.TrainOps:
    """The job's training step over the plan's towers (towers.build_train_op with the job's
    settings): the one place it is built, for training and for `towers verify`.
    features [B, ...], labels [B, ...]: a global batch; positions: int64 [B], its
    examples' positions in the data (None: the model draws its randomness as it likes)."""
    return towers.build_train_op(
        plan.model.model_fn,
        features,
        labels,
        optimizer,
        plan.devices,
        variable_update=mode,
        clip_norm=job.optimizer.clip_norm,
        global_step=global_step,
        nonfinite="raise" if job.train.on_nonfinite == "stop" else "skip",
        precision=plan.precision,
        accumulate_steps=job.train.accumulate_steps,
        xla=job.towers.xla,
        batch_norm=job.towers.batch_norm,
        positions=positions,
        seed=job.train.seed,
        moving_average_decay=job.train.moving_average_decay,
    )


# The library's names for the settings a warning names, and the job file's.
_SETTINGS = {"batch_norm='sync'": "towers.batch_norm: sync",
             "pass batch_norm='local'": "set towers.batch_norm: local"}


@contextlib.contextmanager
def told_as_lines(write: Callable[[str], None]) -> Iterator[None]:
    """What the towers library warns about while the graph is built (a UserWarning, on
    stderr as Python prints it, traceback line and all), written as one 'warning:' line
    naming the job file's settings. Others' warnings pass on as they were."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        # The library warns at its caller's line (stacklevel), which is here.
        if not (warning.filename == __file__ or warning.filename.startswith(_TOWERS_DIR)):
            warnings.showwarning(warning.message, warning.category, warning.filename,
                                 warning.lineno)
            continue
        text = str(warning.message)
        for library, job_file in _SETTINGS.items():
            text = text.replace(library, job_file)
        write(f"warning: {text}")


_TOWERS_DIR = os.path.dirname(towers.__file__)


def _add_summaries(ops: towers.TrainOps, rate: tf.Tensor, histograms: bool) -> None:
    V1.summary.scalar("loss", ops.loss)
    V1.summary.scalar("learning_rate", rate)
    V1.summary.scalar("gradient_norm", ops.gradient_norm)
    if ops.loss_scale is not None:
        V1.summary.scalar("loss_scale", ops.loss_scale)
    for name, value in ops.metrics.items():
        V1.summary.scalar(name, value)
    if histograms:
        for var in V1.trainable_variables():
            V1.summary.histogram(var.op.name, var)
