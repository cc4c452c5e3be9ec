"""`towers eval`: score a checkpoint, or every new one as training writes them.

An evaluation scores every example of the evaluation data (data.eval_path, else
data.path) exactly once: the last, partial batch included, each batch's loss and
metrics weighed by its number of examples. eval.steps, when set, stops it after that
many batches. A generated source (synthetic, builtin) is scored on a fixed number of
batches instead, which the log and the result say.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

import towers
from launch import data, metrics
from launch.config import JobConfig, SessionConfig
from launch.log import log
from launch.runtime import checkpoint_lock, checkpoints, weight_averages
from launch.runtime.inputs import input_tensors
from launch.runtime.out_of_memory import out_of_memory, tower_batch
from launch.runtime.plan import Plan, make_plan
from launch.runtime.preflight import check_data
from launch.runtime.signals import StopSignals, raised_as_itself, work_done

V1 = tf.compat.v1

# A stopped evaluator waits at most this long for a trainer still writing the checkpoint
# directory (the chief of a job stopped with it) to save its final checkpoint, then
# scores that one: a job's last checkpoint is the one most worth a score.
WRITER_WAIT_SECS = 20.0


class _Stop(BaseException):
    """Raised on a stop signal to leave the watch loop between evaluations: no Exception,
    so no `except Exception` of the code it meets (TensorFlow's, a model's) takes it for
    an error of its own (the same as launch.cli's stop before the start)."""


@dataclass(frozen=True)
class _Extent:
    """How much of the evaluation data one evaluation reads.

    max_batches: None reads the data to its end. note: for a generated source, what is
    scored instead of a pass over a data set (in the log and the result).
    """

    max_batches: int | None
    note: str | None = None


def _extent(job: JobConfig, plan: Plan) -> _Extent:
    """eval.steps batches (None: to the data's end); a generated source, which has no
    end, says how many of its batches it scores instead."""
    return _Extent(*plan.source.eval_batches(job.eval.steps, job.eval.batch_size))


def _reading_line(job: JobConfig, plan: Plan, reads: _Extent) -> str:
    """What each evaluation of this job reads, said once at the start."""
    if reads.note:
        return reads.note
    where, batch = plan.source.where(training=False), job.eval.batch_size
    if reads.max_batches is None:
        return f"evaluating every example of {where} once, in batches of {batch}"
    return (f"evaluating at most {reads.max_batches} batches of {batch} of {where} "
            "(eval.steps)")


def _evaluating(plan: Plan, job: JobConfig) -> Plan:
    """The plan evaluation runs: in float32, as the exported model computes, unless
    eval.precision is training (towers.precision's)."""
    if job.eval.precision == "training":
        return plan
    return dataclasses.replace(plan, precision=towers.Precision("float32"))


def _precision_line(job: JobConfig) -> str:
    """What a 16-bit job's evaluation computes in, said once at the start."""
    if job.eval.precision == "training":
        return (f"evaluating in {job.towers.precision}, the training precision "
                "(eval.precision: training): scores differ from the exported model's, which "
                "computes in float32, by 16-bit rounding")
    return (f"evaluating in float32, as the exported model computes (eval.precision: "
            f"float32; 'training' computes in {job.towers.precision})")


def _build(job: JobConfig, plan: Plan, skipped: data.SkippedRecords,
           averages: bool) -> tuple[towers.EvalOps, V1.train.Saver]:
    features, labels = input_tensors(plan, batch_size=job.eval.batch_size,
                                     skipped=skipped)
    ops = towers.build_eval_ops(
        plan.model.model_fn, features, labels, plan.devices, param_device=plan.param_device,
        precision=plan.precision, xla=job.towers.xla,
    )
    return ops, weight_averages.model_saver(averages)


def _batches(sess: V1.Session, fetches, max_batches: int | None) -> Iterator:
    """sess.run(fetches) for each batch, until the input ends or after max_batches."""
    taken = 0
    while max_batches is None or taken < max_batches:
        try:
            yield sess.run(fetches)
        except tf.errors.OutOfRangeError:
            return
        taken += 1


def _score(plan: Plan, ops: towers.EvalOps, saver, checkpoint: str, reads: _Extent,
           predictions: str | None = None) -> dict:
    """Loss and metrics, each the mean over every example scored, from a fresh session.

    A fresh session restarts the input, so every checkpoint is scored on the same
    examples and scores are comparable across checkpoints. Each batch's means weigh
    by its number of examples, so a partial last batch counts for what it holds.
    predictions: a .npy path to write the model's predictions to, [examples, ...], one
    row per example scored, in the order the data holds them.
    """
    fetches = {"loss": ops.loss, **ops.metrics}
    sums = dict.fromkeys(fetches, 0.0)
    examples, predicted = 0, []
    with V1.Session(config=plan.session) as sess:
        saver.restore(sess, checkpoint)
        sess.run(V1.local_variables_initializer())
        run = [fetches, ops.num_examples, ops.predictions if predictions else []]
        for values, count, rows in _batches(sess, run, reads.max_batches):
            for name, value in values.items():
                sums[name] += float(value) * int(count)
            examples += int(count)
            predicted.append(rows)
    if examples == 0:
        key = "data.eval_path" if plan.source.cfg.eval_path else "data.path"
        raise data.DataError(f"{key}: {plan.source.where(training=False)} holds no examples "
                             "to evaluate")
    result = {"global_step": checkpoints.step_of(checkpoint), "examples": examples,
              "precision": plan.precision.name}
    result.update({name: total / examples for name, total in sums.items()})
    if predictions:
        np.save(predictions, np.concatenate(predicted))
    return result


def _write_summaries(summary_dir: str, result: dict, names: list[str]) -> None:
    writer = V1.summary.FileWriterCache.get(summary_dir)
    values = [V1.Summary.Value(tag=f"eval/{name}", simple_value=result[name]) for name in names]
    writer.add_summary(V1.Summary(value=values), result["global_step"])
    writer.flush()


def evaluate(
    job: JobConfig,
    checkpoint: str | None = None,
    watch: bool = False,
    timeout: float | None = None,
    *,
    exporter: metrics.Exporter | None = None,
    write: Callable[[str], None] = log,
    predictions: str | None = None,
    averages: bool = False,
) -> dict:
    """Evaluate one checkpoint (default: the latest), or with watch=True each new one.

    Watching stops after the checkpoint at train.steps, after `timeout` seconds
    without a new checkpoint, or on SIGTERM/SIGINT, after scoring the newest
    checkpoint not yet scored (see _score_before_stopping). Returns the last result.
    exporter: where to publish each result (None: not serving).
    predictions: with one checkpoint, also write the model's predictions for the
    examples scored to this .npy file.
    averages: score each checkpoint's weight averages (train.moving_average_decay)
    instead of its weights.
    """
    plan = _evaluating(make_plan(job), job)
    check_data(plan, training=False)
    train_dir = job.train.checkpoint_dir
    summary_dir = os.path.join(train_dir, "eval")
    if not watch:
        path = checkpoints.newest_restorable(
            checkpoint or train_dir, "--checkpoint" if checkpoint else "train.checkpoint_dir",
            write,
        )
    reads = _extent(job, plan)
    where = plan.source.where(training=False)
    skipped = data.SkippedRecords(where, write)
    graph = tf.Graph()
    batch = job.eval.batch_size
    too_large = out_of_memory(
        f"at {tower_batch(batch, len(plan.devices))} examples per tower (eval.batch_size "
        f"{batch} over {len(plan.devices)} tower(s))", "lower eval.batch_size")
    with graph.as_default(), data.input_errors(where), too_large:
        ops, saver = _build(job, plan, skipped, averages)
        if predictions and ops.predictions is None:
            raise checkpoints.CheckpointError(
                f"--predictions: model {plan.model.name} returns no predictions "
                f"(towers.TowerOutputs(loss, metrics, predictions=...))")
        write(_reading_line(job, plan, reads))
        if job.towers.precision != "float32":
            write(_precision_line(job))
        scorer = _Scorer(plan, ops, saver, reads, summary_dir, job.session, exporter, write,
                         averages)
        result = scorer(path, predictions) if not watch else _watch(job, scorer, timeout, write)
    work_done()  # a stop signal from now on meets an evaluation that has ended
    return result


@dataclass
class _Scorer:
    """Scores one checkpoint and publishes the result (summaries, metrics, a log line)."""

    plan: Plan
    ops: towers.EvalOps
    saver: V1.train.Saver
    reads: _Extent
    summary_dir: str
    session: SessionConfig
    exporter: metrics.Exporter | None
    write: Callable[[str], None]
    averages: bool = False

    def __call__(self, path: str, predictions: str | None = None) -> dict:
        plan = self.plan
        if self.averages:
            weight_averages.check_averages(path)
        start = time.perf_counter()
        result = _score(plan, self.ops, self.saver, path, self.reads, predictions)
        result["examples_per_sec"] = result["examples"] / max(time.perf_counter() - start, 1e-9)
        result["checkpoint"] = path
        if self.averages:
            result["averages"] = True
        _write_summaries(self.summary_dir, result, ["loss", *self.ops.metrics])
        metrics.record_eval(self.exporter, result, len(plan.devices), self.session)
        shown = " ".join(f"{k}={v:.4g}" for k, v in result.items() if isinstance(v, float))
        self.write(f"eval step {result['global_step']}: {shown} ({result['examples']} examples)")
        if self.reads.note:
            result["note"] = self.reads.note
        if predictions:
            result["predictions"] = predictions
        return result


def _raise_stop(name: str) -> None:
    raise _Stop  # breaks out of the checkpoint iterator's wait


def _watch(job: JobConfig, score: _Scorer, timeout: float | None, write) -> dict:
    result: dict = {}
    directory = job.train.checkpoint_dir
    write(f"watching {directory} for checkpoints")
    with StopSignals(_raise_stop):
        try:
            with raised_as_itself(_Stop):
                for path in V1.train.checkpoints_iterator(
                    directory, min_interval_secs=job.eval.every_secs, timeout=timeout,
                ):
                    result = _score_restorable(score, path, write) or result
                    if result.get("global_step", -1) >= job.train.steps:
                        break
        except _Stop:
            result = _score_before_stopping(directory, score, result, write) or result
    if not result:
        raise checkpoints.CheckpointError(
            f"train.checkpoint_dir: no checkpoint appeared in {directory}"
        )
    return result


def _score_restorable(score: _Scorer, path: str, write) -> dict | None:
    """score(path), or None for a checkpoint damaged (a crash mid-write) or deleted by the
    trainer's max_to_keep since it was announced: passed over, as the trainer does at start."""
    problem = checkpoints.restore_problem(path)
    if problem is not None:
        write(f"checkpoint {path} cannot be restored: {problem}; skipping it")
        return None
    return score(path)


def _score_before_stopping(directory: str, score: _Scorer, last: dict,
                           write) -> dict | None:
    """On a stop request: once a trainer still writing checkpoint_dir (``directory``) has
    ended (at most WRITER_WAIT_SECS), score the newest checkpoint not scored yet, if there
    is one. One more evaluation at most; a second stop request ends it at once."""
    write("stopping on signal; a second one stops at once")
    with StopSignals(_raise_stop):
        try:
            with raised_as_itself(_Stop):
                _wait_for_writer(directory, write)
                newest = _newest_restorable(directory, write)
                if newest is None or checkpoints.step_of(newest) <= last.get("global_step", -1):
                    write("no checkpoint newer than the last one scored; stopping")
                    return None
                write(f"scoring {newest}, the newest checkpoint, before stopping")
                return score(newest)
        except _Stop:
            write("stopping now, on the second signal")
            return None


def _newest_restorable(directory: str, write) -> str | None:
    try:
        return checkpoints.newest_restorable(directory, "train.checkpoint_dir", write)
    except checkpoints.CheckpointError:  # none there, or none that restores
        return None


def _wait_for_writer(directory: str, write) -> None:
    """Wait while a trainer holds `directory` (it removes its lock file as it ends, after
    its final checkpoint), at most WRITER_WAIT_SECS. A file left by a trainer that was
    killed costs the wait, no more."""
    holder = checkpoint_lock.holder(directory)
    if holder is None:
        return
    write(f"waiting up to {WRITER_WAIT_SECS:g} s for the trainer writing {directory} "
          f"({holder}) to save its final checkpoint")
    deadline = time.monotonic() + WRITER_WAIT_SECS
    while checkpoint_lock.holder(directory) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
