"""Steps/sec of real training jobs with the Prometheus exporter off and on.

    python -m launch.bench.overhead --jobs convnet,mlp --rounds 9

Each job is built twice in one process, as `towers train` builds it (input
pipeline, towers, ProgressHook): once without metrics, once with the metrics
hook and an exporter that a separate process scrapes every `--scrape-every`
seconds while (and only while) the metrics case runs. Blocks of steps alternate
off/on after warm-up (`interleave`: A B, B A, ...), so drift on a shared machine hits
both alike.
Reports the median steps/sec of each case with min and max, and the overhead:
1 - (median of each round's on/off ratio).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

from launch.log import use_graph_mode

# `convnet` is the built-in default job; `mlp` is a tiny MLP on synthetic data,
# where a step is so short that any per-step cost shows.
JOBS = {
    "convnet": [],
    "mlp": [
        "model.name=mlp", "model.input_dim=8", "model.hidden_units=[16]", "model.num_classes=2",
        "data.source=synthetic", "train.batch_size=32", "towers.devices=1",
    ],
}


def scrape_while(url: str, active, stop, every: float) -> None:
    """In a separate process, as Prometheus would be: GET url every `every` s while active."""
    while not stop.is_set():
        if active.wait(timeout=0.1):
            try:
                urllib.request.urlopen(url, timeout=5).read()
            except OSError:
                pass
            stop.wait(every)


@contextmanager
def scraping(active) -> Iterator[None]:
    """The scraper process scrapes while inside."""
    active.set()
    try:
        yield
    finally:
        active.clear()


@dataclass
class Case:
    name: str
    session: object
    train_op: object
    rates: list[float] = field(default_factory=list)


def build_case(job, name: str, exporter) -> Case:
    """One job's training graph and a MonitoredSession running it, hooks as in train()."""
    import tensorflow as tf

    from launch import metrics
    from launch.runtime.plan import make_plan
    from launch.runtime.progress import ProgressHook
    from launch.runtime.training_graph import build_training_graph

    plan = make_plan(job)
    graph = tf.Graph()
    with graph.as_default():
        ops, scaffold, rate, *_ = build_training_graph(job, plan)
        served = metrics.training_hooks(
            exporter, ops, rate, len(plan.devices), plan.process_batch_size, job.session)
        progress = ProgressHook({"loss": ops.loss, **ops.metrics}, ops.step_started,
                                plan.process_batch_size, 10**9, 10**9, None, lambda line: None,
                                on_step=served.on_step)
        hooks = [*served.hooks, progress]
        session = tf.compat.v1.train.MonitoredTrainingSession(
            scaffold=scaffold, hooks=hooks, config=plan.session, log_step_count_steps=None,
            save_summaries_steps=None, save_checkpoint_secs=None)
    return Case(name, session, ops.train_op)


def time_block(case: Case, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        case.session.run(case.train_op)
    return steps / (time.perf_counter() - start)


def interleave(off: Case, on: Case, rounds: int, steps: int, warmup: int,
               around_on: Callable[[], AbstractContextManager] = nullcontext) -> None:
    """Warm both cases up, then `rounds` pairs of timed blocks of `steps` steps, the
    pair's order alternating (off on, on off, ...) so a machine speeding up or slowing
    down within a pair favours neither; appends each block's steps/sec to case.rates.
    around_on: a context entered around every block of the `on` case."""
    for case in (off, on):
        time_block(case, warmup)
    for index in range(rounds):
        for case in (off, on) if index % 2 == 0 else (on, off):
            with around_on() if case is on else nullcontext():
                case.rates.append(time_block(case, steps))


def measure_job(name: str, args) -> list[str]:
    """Interleaved off/on blocks of one job; returns its report rows."""
    from launch import metrics
    from launch.config import load_job

    job = load_job(None, [*JOBS[name], "metrics.port=0"])
    identity = metrics.Identity("train", 0, "overhead")
    with metrics.serve(job.metrics, identity, lambda line: None) as exporter:
        off = build_case(job, "off", exporter=None)
        on = build_case(job, "on", exporter=exporter)
        spawn = multiprocessing.get_context("spawn")
        active, stop = spawn.Event(), spawn.Event()
        scraper = spawn.Process(target=scrape_while,
                                args=(exporter.url, active, stop, args.scrape_every))
        scraper.start()
        try:
            interleave(off, on, args.rounds, args.steps, args.warmup,
                       around_on=lambda: scraping(active))
        finally:
            stop.set()
            scraper.join(timeout=10)
            for case in (off, on):
                case.session.close()
    return report_rows(name, off, on)


def report_rows(name: str, off: Case, on: Case) -> list[str]:
    ratios = [b / a for a, b in zip(off.rates, on.rates, strict=True)]
    overhead = 1 - statistics.median(ratios)
    off_median, on_median = statistics.median(off.rates), statistics.median(on.rates)
    per_step_us = (1 / on_median - 1 / off_median) * 1e6
    return [
        f"| {name} | off | {off_median:.1f} | {min(off.rates):.1f} | {max(off.rates):.1f} | | |",
        f"| {name} | on | {on_median:.1f} | {min(on.rates):.1f} | {max(on.rates):.1f} | "
        f"{overhead * 100:+.2f}% | {per_step_us:+.0f} |",
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="convnet,mlp", help=f"from {', '.join(JOBS)}")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per block (default: 40 convnet, 5000 mlp)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--scrape-every", type=float, default=1.0, metavar="SECS")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    use_graph_mode()
    lines = [
        "| job | metrics | steps/sec median | min | max | overhead | µs/step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in args.jobs.split(","):
        steps = args.steps or {"convnet": 40, "mlp": 5000}.get(name, 100)
        lines += measure_job(name, argparse.Namespace(**{**vars(args), "steps": steps}))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
