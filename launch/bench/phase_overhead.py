"""What the always-on step phases cost real training jobs, measured two ways in one run.

    python -m launch.bench.phase_overhead --jobs convnet,resnet20x4 --rounds 25

Each job is built twice in one process, as `towers train` builds it (input pipeline,
towers, ProgressHook with the phase shares): once without the phase hook, once with it
as training runs it (every step timed, one traced every `train.phase_sample_secs`, 1 s
by default, or less often when a sample costs more than 1% of that).

1. Side by side: after warm-up, blocks of about `--block-secs` alternate off/on
   (`launch.bench.overhead.interleave`); the overhead is 1 - the median of the rounds'
   on/off ratios, with a bootstrap 95% interval of that median.
2. Directly, in the same `on` blocks: the time spent inside the hook on plain steps (its
   timing and bookkeeping), and on sampled steps what tracing added to the run plus
   reading the trace; the overhead a training job pays is then the plain cost per step
   over the step time plus the sample cost times the sample rate training uses (the A/B
   blocks sample more often: time spent in `off` blocks counts towards the next sample),
   from the mean sample cost (the median too: a loaded machine makes some traced runs
   slower for reasons of its own).

The metrics exporter's own overhead is `launch.bench.overhead`'s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from launch.bench.overhead import Case, interleave, time_block
from launch.log import use_graph_mode

JOBS = {
    "convnet": [],  # the default job: `towers train` with no options
    "resnet20x4": ["model.name=resnet20", "data.source=synthetic", "train.batch_size=128",
                   "towers.devices=4"],
}


class TimedHook:
    """Runs the phase hook and adds up the time spent inside it, plain and sampled steps
    apart (a SessionRunHook by delegation)."""

    def __init__(self, hook):
        self.hook = hook
        self._spent = 0.0
        self.reset()

    def reset(self) -> None:
        """Count from here (the timed blocks, not the warm-up)."""
        self.plain_secs = self.sampled_secs = self.traced_extra_secs = 0.0
        self.plain_steps = self.samples = 0
        self.sample_costs: list[float] = []  # each sample's: its run over a plain one, reading
        self._extra_before = self.hook.traced_extra_secs

    def begin(self):
        self.hook.begin()

    def after_create_session(self, session, coord):
        self.hook.after_create_session(session, coord)

    def before_run(self, run_context):
        start = time.perf_counter()
        args = self.hook.before_run(run_context)
        self._spent = time.perf_counter() - start
        return args

    def after_run(self, run_context, run_values):
        start = time.perf_counter()
        self.hook.after_run(run_context, run_values)
        spent = self._spent + time.perf_counter() - start
        if run_values.run_metadata is not None and run_values.run_metadata.step_stats.dev_stats:
            extra = self.hook.traced_extra_secs - self._extra_before - self.traced_extra_secs
            self.sample_costs.append(spent + extra)
            self.sampled_secs += spent
            self.samples += 1
            self.traced_extra_secs += extra
        else:
            self.plain_secs += spent
            self.plain_steps += 1

    def end(self, session):
        self.hook.end(session)


def build_case(job, name: str, phases_on: bool) -> tuple[Case, TimedHook | None]:
    """One job's training graph and a MonitoredSession running it, hooks as in train()."""
    import tensorflow as tf

    from launch.runtime.plan import make_plan
    from launch.runtime.progress import ProgressHook
    from launch.runtime.step_phases import StepPhaseHook, StepPhases
    from launch.runtime.training_graph import build_training_graph

    plan = make_plan(job)
    graph = tf.Graph()
    timed = None
    with graph.as_default():
        ops, scaffold, *_ = build_training_graph(job, plan)
        phases = StepPhases()
        progress = ProgressHook({"loss": ops.loss, **ops.metrics}, ops.step_started,
                                plan.process_batch_size, 10**9, 10**9, None, lambda line: None,
                                phases=phases.window_text)
        hooks = [progress]
        if phases_on:
            timed = TimedHook(StepPhaseHook(phases, job.train.phase_sample_secs))
            hooks.insert(0, timed)
        session = tf.compat.v1.train.MonitoredTrainingSession(
            scaffold=scaffold, hooks=hooks, config=plan.session, log_step_count_steps=None,
            save_summaries_steps=None, save_checkpoint_secs=None)
    return Case(name, session, ops.train_op), timed


def median_interval(ratios: list[float], seed: int = 0) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of the ratios."""
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(ratios, (4000, len(ratios))), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def measure_job(name: str, args) -> tuple[str, str]:
    """Interleaved off/on blocks of one job: its side-by-side and its direct row."""
    from launch.config import load_job
    from launch.runtime.step_phases import sample_interval

    job = load_job(None, JOBS[name])
    (off, _), (on, timed) = build_case(job, "off", False), build_case(job, "on", True)
    try:
        time_block(off, args.warmup)
        steps = max(1, round(args.block_secs * time_block(off, args.warmup)))
        time_block(on, 2 * args.warmup)
        timed.reset()  # count the timed blocks only
        interleave(off, on, args.rounds, steps, warmup=0)
    finally:
        for case in (off, on):
            case.session.close()
    ratios = [b / a for a, b in zip(off.rates, on.rates, strict=True)]
    low, high = median_interval(ratios)
    on_secs = sum(steps / rate for rate in on.rates)
    step_secs = 1 / statistics.median(off.rates)
    plain_us = 1e6 * timed.plain_secs / timed.plain_steps
    samples = timed.samples
    sample_ms = 1e3 * (timed.sampled_secs + timed.traced_extra_secs) / max(samples, 1)
    median_ms = 1e3 * statistics.median(timed.sample_costs or [0.0])
    trained_rate = 1 / sample_interval(job.train.phase_sample_secs, sample_ms / 1e3)
    direct = plain_us / 1e6 / step_secs + sample_ms / 1e3 * trained_rate
    side = (f"| {name} | {args.rounds} x {steps} steps | {1 / step_secs:.2f} | "
            f"{statistics.median(on.rates):.2f} | {100 * (1 - statistics.median(ratios)):+.2f}% "
            f"| {100 * (1 - high):+.2f}% to {100 * (1 - low):+.2f}% | "
            f"{samples / on_secs:.2f} |")
    row = (f"| {name} | {1e3 * step_secs:.1f} ms | {plain_us:.0f} µs "
           f"({100 * plain_us / 1e6 / step_secs:.3f}%) | {sample_ms:.1f} ms "
           f"(median {median_ms:.1f}) | "
           f"{trained_rate:.2f}/s | {100 * direct:.2f}% |")
    return side, row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="convnet,resnet20x4", help=f"from {', '.join(JOBS)}")
    parser.add_argument("--rounds", type=int, default=25, help="pairs of off/on blocks")
    parser.add_argument("--block-secs", type=float, default=2.0,
                        help="about how long each block runs (its steps are set from warm-up)")
    parser.add_argument("--warmup", type=int, default=10, help="steps")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    use_graph_mode()
    sides = ["| job | blocks | off steps/sec | on steps/sec | overhead (median of ratios) "
             "| 95% interval | samples per on-second |", "| --- " * 7 + "|"]
    rows = ["| job | step | hook per plain step | per sample (trace + read) | "
            "samples in training | overhead in training |", "| --- " * 6 + "|"]
    for name in args.jobs.split(","):
        side, row = measure_job(name, args)
        sides.append(side)
        rows.append(row)
    print("\n".join(["Side by side:", *sides, "", "Direct, in the same on blocks:", *rows]))


if __name__ == "__main__":
    main()
