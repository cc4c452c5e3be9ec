"""`towers train`: build the towers for a job and run them in a MonitoredTrainingSession."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import tensorflow as tf

from launch import data, kernels, metrics, startup
from launch.config import JobConfig, TrainConfig
from launch.devices import bfloat16_units, on_cpus
from launch.errors import StopTimedOut
from launch.hard_exit import exit_now
from launch.log import log
from launch.runtime import checkpoint_lock, checkpoints
from launch.runtime.advice import Setup, advice, bfloat16_setup, bottleneck
from launch.runtime.data_state import DataPositionHook
from launch.runtime.hooks import (
    DataEndHook,
    LastStep,
    LossScaleHook,
    PlacementTraceHook,
    SkipNonFiniteHook,
    StopAtStepHook,
    latest_text,
    nonfinite_stops,
)
from launch.runtime.out_of_memory import out_of_memory, tower_batch
from launch.runtime.plan import Plan, make_plan
from launch.runtime.preflight import preflight
from launch.runtime.profile import ProfileHook, profile_dir
from launch.runtime.progress import ProgressHook
from launch.runtime.role import Role
from launch.runtime.signals import StopSignals, work_done
from launch.runtime.stall import StallWatch, example_bytes, host_memory_bytes, no_batch_text
from launch.runtime.startup_line import startup_line
from launch.runtime.step_phases import StepPhaseHook, StepPhases, shares_text
from launch.runtime.stop_deadline import StopDeadline
from launch.runtime.timeline import TimelineHook, timeline_path
from launch.runtime.training_graph import TrainingGraph, build_training_graph
from launch.runtime.worker_positions import OthersPartsHook

V1 = tf.compat.v1


@dataclass
class _Loop:
    """The hooks of one training session, and those whose state becomes the result."""

    hooks: list[V1.train.SessionRunHook]
    chief_hooks: list[V1.train.SessionRunHook]
    progress: ProgressHook
    stop_at: StopAtStepHook
    last: LastStep
    data: DataPositionHook
    data_end: DataEndHook
    phases: StepPhases
    stall: StallWatch
    loss_scale: LossScaleHook | None = None
    others_parts: OthersPartsHook | None = None


def train(
    job: JobConfig,
    *,
    plan: Plan | None = None,
    role: Role | None = None,
    exporter: metrics.Exporter | None = None,
    write: Callable[[str], None] = log,
) -> dict:
    """Train to job.train.steps (resuming from checkpoint_dir); return the final record.

    plan: what runs where (default: this host's devices, make_plan(job)).
    role: what kind of process this is (default: an in-process job, chief and
        writer). Only a role that writes checks, restores and saves checkpoints and
        summaries; a non-chief waits for the chief to initialise the variables.
    exporter: where to publish metrics (None: not serving).
    """
    plan = plan or make_plan(job)
    role = role or Role()
    preflight(job, plan, role.writes)
    startup.mark("plan")
    # The writer holds checkpoint_dir from before its first write into it until training
    # ends; a directory another process holds is bad input, found before anything is built.
    held = checkpoint_lock.hold(job.train.checkpoint_dir, write) if role.writes else nullcontext()
    with held:
        return _train(job, plan, role, exporter, write)


def _train(job: JobConfig, plan: Plan, role: Role, exporter: metrics.Exporter | None,
           write: Callable[[str], None]) -> dict:
    # Caught from when the session starts (until then the command's own handling
    # applies: nothing is built that a stop could save). Acknowledged as it arrives,
    # even while the main thread is inside a step, and bounded by the deadline.
    deadline = StopDeadline(job.train.stop_timeout_secs, lambda name: None)
    announce = _announce_stop(write, role.writes)
    stop = StopSignals(escalate=True, notify_threads=True,
                       on_arrival=lambda name: (announce(name), deadline.arm(name)))
    where = plan.source.where()
    skipped = data.SkippedRecords(where, write, _skip_counter(exporter))
    graph = tf.Graph()
    with graph.as_default():
        built = build_training_graph(job, plan, role.wrap_optimizer, skipped, write)
        startup.mark("graph")
        resumed = None
        if role.writes:
            resumed = checkpoints.fall_back_to_restorable(job.train.checkpoint_dir, write)
            checkpoints.check_compatible(job.train.checkpoint_dir)
        loop = _loop_hooks(job, plan, role, built, resumed, exporter, stop, write)
        deadline.expire = _stop_timed_out(
            deadline, loop.stall, job.train.checkpoint_dir if role.writes else None)
        write(startup_line(job, plan, built.ops.synchronized_statistics))
        note = _precision_note(job, plan, built.ops.train_op)
        if note:
            write(note)
        role.before_session(plan.session)
        with data.input_errors(where):
            with deadline:
                try:
                    _run_session(job.train, plan, role, built.ops, built.scaffold, loop, stop)
                finally:
                    # A session that raises calls no hook's end(): without this, the
                    # watch of a job that failed would go on warning, or abort, in a
                    # process that called train() and went on.
                    loop.stall.stop()
    # A stop signal from now on meets a job that has ended: what is left is its ending
    # (reports to its peers, bounded) and handing over its result.
    work_done()
    if loop.others_parts is not None:  # before the result: a job not done reports no end
        loop.others_parts.check_trained()
    result = _result(job, role, loop, stop)
    setup = _advice_setup(job, plan, built.ops.train_op)
    _report_phases(loop.phases, result, write, lambda shares: advice(
        shares, job, setup, role.stragglers(), loop.phases.step_secs()))
    if result.get("stopped_by") == "end of data" and result["steps_run"]:
        write(f"data.epochs: {job.data.epochs} pass(es) over the data done at step "
              f"{result['global_step']} (train.steps {job.train.steps}); training ends there")
    if job.data.on_bad_record == "skip":
        result["skipped_records"] = skipped.count
    return result


def _precision_note(job: JobConfig, plan: Plan, train_op) -> str | None:
    """The start-up warning of a 16-bit job whose kernels this machine runs slower than
    float32, measured (launch.kernels: timed once per machine)."""
    return kernels.startup_note(train_op, job.towers.precision, plan.devices,
                                _examples_per_tower(job.train, plan))


def _advice_setup(job: JobConfig, plan: Plan, train_op) -> Setup:
    """What the closing advice knows beyond the job file. Whether bfloat16 would pay off
    is what this machine measured for the model's kernels, if an earlier start-up timed
    them, else what the devices' flags say; XLA is for towers on GPUs."""
    measured = None
    if job.towers.precision == "float32":
        measured = kernels.cached_speedup(train_op, "bfloat16", plan.devices,
                                          _examples_per_tower(job.train, plan))
    bfloat16, why_not = bfloat16_setup(bfloat16_units(plan.devices), measured)
    return Setup(plan.variables_on_ps, plan.share.count, bfloat16, why_not,
                 xla_may_pay=not on_cpus(plan.devices))


def _examples_per_tower(cfg: TrainConfig, plan: Plan) -> int:
    return tower_batch(plan.process_batch_size, len(plan.devices), cfg.accumulate_steps)


def _skip_counter(exporter: metrics.Exporter | None) -> Callable[[int], None] | None:
    """towers_input_skipped_records_total's inc, one counter per process."""
    if exporter is None:
        return None
    return exporter.part("input_skips", lambda: exporter.counter(
        "towers_input_skipped_records",
        "Input records skipped because they failed to parse or decode")).inc


def _announce_stop(write: Callable[[str], None], saves: bool) -> Callable[[str], None]:
    doing = "saving a checkpoint and stopping" if saves else "stopping after this step"
    return lambda name: write(f"received {name}: {doing}")


def _stop_timed_out(deadline: StopDeadline, stall: StallWatch,
                    checkpoint_dir: str | None) -> Callable[[str], None]:
    """What ends a process whose stop did not take within train.stop_timeout_secs."""
    def expire(name: str) -> None:
        if checkpoint_dir is None:
            kept = "a restart resumes from the chief's latest checkpoint"
        else:
            latest = tf.train.latest_checkpoint(checkpoint_dir)
            kept = (f"a restart resumes from the latest, {latest}" if latest else
                    "none was written: a restart begins again")
        exit_now(StopTimedOut(
            f"received {name} {deadline.secs:g} s ago (train.stop_timeout_secs) and the "
            f"step under way has not finished: {stall.waits_for()}; ending without a final "
            f"checkpoint: {kept}"))

    return expire


def _loop_hooks(job, plan, role, built: TrainingGraph, resumed: str | None, exporter, stop,
                write) -> _Loop:
    """Every hook of the session, in the order they must run."""
    cfg = job.train
    ops, scaffold, rate = built.ops, built.scaffold, built.rate
    last = LastStep(cfg.steps)
    data_position = DataPositionHook(
        built.data_state, built.input, ops.global_step, job.data.epochs, last,
        rebases=role.is_chief, announce=role.writes, wait_secs=role.max_wait_secs,
        resumed_from=resumed, write=write, positions=built.positions)
    served = metrics.training_hooks(
        exporter, ops, rate, len(plan.devices), plan.process_batch_size, job.session,
        plan.job_examples_per_step if role.writes else None,  # one series per job
    )
    phases = StepPhases(served.on_phases)
    # With peers, an instant with no op running here is a wait for them.
    several = bool(role.master) or plan.reduce_gradients is not None
    timer = StepPhaseHook(phases, cfg.phase_sample_secs, "exchange" if several else "compute",
                          remote=bool(role.master))
    last_save = checkpoints.LastSave()
    progress = ProgressHook(
        {"loss": ops.loss, **ops.metrics},
        ops.step_started,
        plan.process_batch_size,
        last,
        cfg.log_every_steps,
        cfg.checkpoint_dir if role.writes else None,
        write,
        on_step=_on_step(served.on_step, metrics.data_gauges(exporter), data_position),
        phases=phases.window_text,
        job_examples_per_step=plan.job_examples_per_step,
        process=role.label or None,
        final_step=lambda: last_save.step,
    )
    stop_at = StopAtStepHook(last, write, job.data.epochs)
    data_end = DataEndHook(lambda: data_position.batches)
    no_batch = no_batch_text(plan.process_batch_size, example_bytes(
        built.input.features, built.input.labels), host_memory_bytes())
    stall = StallWatch(cfg.stall_warning_secs, cfg.stall_abort_secs, role.stall_cause, write,
                       exit_now, no_batch)
    hooks = [
        *role.start_hooks(ops),
        data_position,  # before any hook asks where the job stops
        *served.hooks,  # first, so its step timer starts right before the session run
        timer,  # before progress, so the step it reports is in the phases
        stop_at,
        progress,
        role.stop_hook(stop),
        data_end,
        *role.hooks(ops, data_end, phases, data_position.follow),
        stall,
    ]
    loss_scale = None
    if ops.loss_scale is not None:
        loss_scale = LossScaleHook(ops.overflow, ops.loss_scale, ops.step_started, write,
                                   served.on_overflow)
        hooks.append(loss_scale)
    if cfg.timeline:
        hooks.append(TimelineHook(timeline_path(cfg.timeline, role.label), cfg.timeline_steps,
                                  role.label, "exchange" if several else "compute",
                                  bool(role.master), write))
    if cfg.profile_steps:
        hooks.append(ProfileHook(profile_dir(cfg.checkpoint_dir, role.label), cfg.profile_steps,
                                 write))
    if cfg.on_nonfinite == "skip":
        hooks.append(SkipNonFiniteHook(ops.all_finite, ops.step_started,
                                       cfg.max_nonfinite_steps, write, ops.overflow))
    others_parts = _others_parts(built, data_position, stop, role, stall, write)
    if not role.writes:
        hooks.extend(others_parts)
    chief_hooks = [
        *others_parts,  # before the final save
        checkpoints.saver_hook(cfg, scaffold, write, [*served.listeners, last_save]),
        PlacementTraceHook(cfg.checkpoint_dir),
    ] if role.writes else []
    return _Loop(hooks, chief_hooks, progress, stop_at, last, data_position, data_end, phases,
                 stall, loss_scale, next(iter(others_parts), None))


def _others_parts(built: TrainingGraph, data_position: DataPositionHook, stop: StopSignals,
                  role: Role, stall: StallWatch, write) -> list[V1.train.SessionRunHook]:
    """An asynchronous worker's wait, once it has trained its parts of the data's passes,
    for the others' (so every task ends at once, and the chief's final checkpoint holds
    every part)."""
    if built.positions is None:
        return []
    return [OthersPartsHook(built.positions, data_position.parts_left, lambda: bool(stop),
                            role.max_wait_secs, write, on_wait=stall.stop)]


def _on_step(served, data_figures, data_position: DataPositionHook):
    """ProgressHook's callback: each step's fetched values to the metrics, and where the
    data stands to its gauges; None when not serving."""
    if served is None:
        return None

    def on_step(step: int, values) -> None:
        served(step, values)
        data_figures(data_position.epoch(step), data_position.examples_trained(step))

    return on_step


def _run_session(cfg: TrainConfig, plan: Plan, role: Role, ops, scaffold, loop: _Loop,
                 stop: StopSignals) -> None:
    # A diverged step raises; the session then closes without saving (no hook's end()).
    saved = cfg.checkpoint_dir if role.writes else None
    diverged = nonfinite_stops(saved)
    unwritable = checkpoints.write_failures(cfg.checkpoint_dir)  # one line, exit 4
    too_large = out_of_memory(_batch_text(cfg, plan), _MEMORY_FIX.format(cfg.accumulate_steps),
                              lambda: latest_text(saved))  # one line, exit 5
    with stop, unwritable, diverged, too_large, V1.train.MonitoredTrainingSession(
        master=role.master,
        is_chief=role.is_chief,
        max_wait_secs=role.max_wait_secs,
        stop_grace_period_secs=role.stop_grace_secs,
        checkpoint_dir=cfg.checkpoint_dir if role.writes else None,
        scaffold=scaffold,
        hooks=loop.hooks,
        chief_only_hooks=loop.chief_hooks,
        save_checkpoint_secs=None,
        save_checkpoint_steps=None,
        save_summaries_steps=cfg.summary_every_steps,
        save_summaries_secs=None,
        log_step_count_steps=None,
        config=plan.session,
    ) as sess:
        startup.mark("session")
        stepped = False
        while not (loop.stop_at.done_at_start or sess.should_stop()):
            sess.run(ops.train_op)
            if not stepped:
                startup.mark("first_step")
                stepped = True


_MEMORY_FIX = ("lower train.batch_size, or raise train.accumulate_steps (now {}) to train the "
               "same global batch in smaller micro-batches")


def _batch_text(cfg: TrainConfig, plan: Plan) -> str:
    """'at 50000000 examples per tower (this process's 100000000 of train.batch_size
    100000000, over 2 towers)': what the devices compute on at once."""
    micro = cfg.accumulate_steps
    per_tower = _examples_per_tower(cfg, plan)
    mine = "" if plan.share.count == 1 else f"this process's {plan.process_batch_size} of "
    parts = f", in {micro} micro-batches" if micro > 1 else ""
    return (f"at {per_tower} examples per tower ({mine}train.batch_size {cfg.batch_size} "
            f"over {len(plan.devices)} tower(s){parts})")


def _result(job: JobConfig, role: Role, loop: _Loop, stop: StopSignals) -> dict:
    V1.summary.FileWriterCache.clear()
    if loop.progress.steps_run:
        result = loop.progress.record.as_dict()
    else:  # a finished job run again: no step, so no loss to report
        result = {"global_step": loop.stop_at.start_step or 0, "job_examples_per_sec": 0.0,
                  "process_examples_per_sec": 0.0}
    result["steps_run"] = loop.progress.steps_run
    result["startup"] = startup.marks()
    memory = startup.memory_mib()
    if memory is not None:
        result["peak_rss_mib"] = memory[1]
    result["precision"] = job.towers.precision
    result["accumulate_steps"] = job.train.accumulate_steps
    if loop.loss_scale is not None:
        result["loss_scale"] = loop.loss_scale.scale
        result["overflow_steps"] = loop.loss_scale.overflows
    latest = tf.train.latest_checkpoint(job.train.checkpoint_dir) if role.writes else None
    if latest:
        # The chief's final checkpoint holds the job's true global step: the step
        # the chief last fetched trails it when other workers updated after that
        # (asynchronous ps/worker).
        result["global_step"] = checkpoints.step_of(latest)
    if role.writes:  # a non-chief worker did not write it and may not see its directory
        result["checkpoint"] = latest
    step = result["global_step"]
    result["epoch"] = round(loop.data.epoch(step), 6)
    result["examples_trained"] = loop.data.examples_trained(step)
    if stop:
        result["stopped_by"] = "signal"
    elif loop.data_end.ran_out or (loop.last.by_data and step >= loop.last.step):
        result["stopped_by"] = "end of data"
    return role.finish(result)


def _report_phases(phases: StepPhases, result: dict, write: Callable[[str], None],
                   advise: Callable[[dict[str, float]], str]) -> None:
    """Where this process's step time went, in the result and in two lines: the shares
    and the advice they call for (`advise`)."""
    shares = phases.shares()
    if not shares:  # no step was sampled (none run, or a single one)
        return
    result["step_phases"] = {phase: round(share, 4) for phase, share in shares.items()}
    result["bottleneck"] = bottleneck(shares)
    write(f"where the step time went: {shares_text(shares)} of "
          f"{sum(phases.total.values()):.1f} s in steps")
    write(f"advice: {advise(shares)}")
