"""Steps/sec of real training jobs without and with the step-phase measurement.

    python -m launch.bench.phase_overhead --jobs convnet,mlp --rounds 9

Each job is built twice in one process, as `towers train` builds it (input pipeline,
towers, ProgressHook): once without the phase hook, once with it as training runs it
(every step timed, one traced every `train.phase_sample_secs`, 1 s by default). Blocks
of steps alternate off/on (A B A B ...) after warm-up, so drift on a shared machine hits
both alike. Reports the median steps/sec of each case with min and max, and the
overhead: 1 - (median of each round's on/off ratio). The metrics exporter's own
overhead is `launch.bench.overhead`'s.
"""

from __future__ import annotations

import argparse
import os

from launch.bench.overhead import JOBS, Case, report_rows, time_block
from launch.log import use_graph_mode


def build_case(job, name: str, phases_on: bool) -> Case:
    """One job's training graph and a MonitoredSession running it, hooks as in train()."""
    import tensorflow as tf

    from launch.runtime.hooks import ProgressHook
    from launch.runtime.plan import make_plan
    from launch.runtime.step_phases import StepPhaseHook, StepPhases, shares_text
    from launch.runtime.train import build_training_graph

    plan = make_plan(job)
    graph = tf.Graph()
    with graph.as_default():
        ops, scaffold, _ = build_training_graph(plan)
        phases = StepPhases()
        progress = ProgressHook({"loss": ops.loss, **ops.metrics}, ops.global_step,
                                plan.batch_size, 10**9, 10**9, None, lambda line: None,
                                phases=lambda: shares_text(phases.take_window()))
        hooks = [progress]
        if phases_on:
            hooks.insert(0, StepPhaseHook(phases, job.train.phase_sample_secs))
        session = tf.compat.v1.train.MonitoredTrainingSession(
            scaffold=scaffold, hooks=hooks, config=plan.session, log_step_count_steps=None,
            save_summaries_steps=None, save_checkpoint_secs=None)
    return Case(name, session, ops.train_op)


def measure_job(name: str, args) -> list[str]:
    """Interleaved off/on blocks of one job; returns its report rows."""
    from launch.config import load_job

    job = load_job(None, JOBS[name])
    off, on = build_case(job, "off", False), build_case(job, "on", True)
    try:
        for case in (off, on):
            time_block(case, args.warmup)
        for _ in range(args.rounds):
            off.rates.append(time_block(off, args.steps))
            on.rates.append(time_block(on, args.steps))
    finally:
        for case in (off, on):
            case.session.close()
    return report_rows(name, off, on)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="convnet,mlp", help=f"from {', '.join(JOBS)}")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per block (default: 40 convnet, 3000 mlp)")
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    use_graph_mode()
    lines = [
        "| job | phases | steps/sec median | min | max | overhead | µs/step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in args.jobs.split(","):
        steps = args.steps or {"convnet": 40, "mlp": 3000}.get(name, 100)
        lines += measure_job(name, argparse.Namespace(**{**vars(args), "steps": steps}))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
