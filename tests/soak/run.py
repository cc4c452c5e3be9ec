"""`make soak`: seeded random fault schedules against every arrangement, each checked.

    python -m soak --schedules 30                     # 30 per arrangement (tests/ on sys.path)
    python -m soak --seed 17 --arrangement sync       # replay one schedule
    python -m soak --schedule '{"seed": ...}'         # replay a schedule as printed

Each schedule's job runs under the supervisor (supervisor.py), then the checker
(checker.py) reads what it left. A schedule that breaks an invariant prints its seed,
its schedule and the command that replays it, and keeps its logs; one that passes is
removed (--keep keeps them). Every schedule's line goes to OUT/summary.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import replace

import numpy as np
import tensorflow as tf
from helpers import net_hosts
from soak import checker, jobs
from soak.jobs import ARRANGEMENTS
from soak.schedule import Schedule, draw
from soak.supervisor import Supervisor

from launch import cpu_info


def _reference(out: str, arrangement: str, ends_with_data: bool, rows: str,
               network) -> tuple[list[dict], float]:
    """Two uninterrupted runs' variables, and the longest time one trained for (from its
    first step to its end), kept in OUT for the schedules after."""
    where = os.path.join(out, "references", f"{arrangement}-{ends_with_data}")
    saved, window_file = os.path.join(where, "reference.npz"), os.path.join(where, "window")
    if os.path.exists(saved):
        loaded = dict(np.load(saved))
        with open(window_file) as f:
            window = float(f.read())
        return [{k[2:]: v for k, v in loaded.items() if k.startswith(f"{i}/")}
                for i in (0, 1)], window
    found, windows = [], []
    for attempt in (0, 1):
        workdir = os.path.join(where, f"run{attempt}")
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir)
        supervisor = Supervisor(Schedule(-1, arrangement, ends_with_data, 0, ()), workdir,
                                rows, network)
        try:
            record = supervisor.run()
            checker.keep_log(record, workdir)
            violations = checker.check(record, None)
            if violations:  # a schedule of no faults, failed: reported as one
                _report(out, Schedule(-1 - attempt, arrangement, ends_with_data, 0, ()),
                        record, violations, workdir, print)
            latest = tf.train.latest_checkpoint(record.checkpoint_dir)
            if latest is None:
                raise RuntimeError(f"the uninterrupted run of {arrangement} saved nothing "
                                   f"(logs: {workdir})")
            found.append(checker.variables(latest))
        finally:
            supervisor.unmount()
        at = {text: when for when, text in record.events}
        windows.append(at["the job is done"] - at["the job's first step"])
    np.savez(saved, **{f"{i}/{k}": v for i, run in enumerate(found) for k, v in run.items()})
    with open(window_file, "w") as f:
        f.write(f"{max(windows)}\n")
    return found, max(windows)


def one_device_reference(out: str, rows: str, ends_with_data: bool) -> list[dict]:
    """The job trained in this process on one device: what an exact arrangement's run
    ends with, within the checker's tolerance (twice, as two runs' references)."""
    from launch.config import load_job
    from launch.runtime.train import train

    checkpoint_dir = os.path.join(out, f"one-device-{ends_with_data}")
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    settings = jobs.job_settings(ARRANGEMENTS["one"], rows, checkpoint_dir, ends_with_data)
    settings.update({"towers.devices": 1, "model.delay_secs": 0})
    train(load_job(None, [f"{k}={v}" for k, v in settings.items()]), write=lambda line: None)
    found = checker.variables(tf.train.latest_checkpoint(checkpoint_dir))
    return [found, found]


def run_schedule(schedule: Schedule, out: str, rows: str, keep: bool = False,
                 write=print, references: list[dict] | None = None) -> dict:
    """Run and check one schedule; its summary (written to OUT/summary.jsonl).
    references: what the checker compares with (default: two uninterrupted runs of the
    arrangement, made once in OUT); given, the schedule's faults must be too."""
    arrangement = ARRANGEMENTS[schedule.arrangement]
    network = None
    if arrangement.hosts and net_hosts.why_unavailable() is None:
        net_hosts.sweep_stale()
        network = net_hosts.TestNetwork.create()
    try:
        window = 20.0
        if references is None:
            references, window = _reference(out, schedule.arrangement,
                                            schedule.ends_with_data, rows, network)
        if not schedule.faults:  # a seed's schedule, drawn on the measured time scale
            schedule = draw(schedule.seed, schedule.arrangement, window, schedule.hog)
        workdir = os.path.join(out, f"{schedule.arrangement}-{schedule.seed}")
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir)
        supervisor = Supervisor(schedule, workdir, rows, network, window)
        try:
            record = supervisor.run()
            violations = checker.check(record, references)
        finally:
            supervisor.unmount()
    finally:
        if network is not None:
            network.close()
    checker.keep_log(record, workdir)
    summary = _report(out, schedule, record, violations, workdir, write)
    if not violations and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary


def _report(out: str, schedule: Schedule, record, violations: list[str], workdir: str,
            write) -> dict:
    """One schedule's line in OUT/summary.jsonl and on the output."""
    summary = {
        "seed": schedule.seed, "arrangement": schedule.arrangement, "hog": schedule.hog,
        "faults": record.faults_made, "violations": violations,
        "secs": round(record.ended - record.began, 1), "sizes": record.sizes,
        "starts": len(record.runs), "cpu": _cpu(),
        "began": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - (
            record.ended - record.began))),
    }
    with open(os.path.join(out, "summary.jsonl"), "a") as f:
        f.write(json.dumps(summary, sort_keys=True) + "\n")
    status = "ok" if not violations else "FAILED"
    write(f"{schedule.arrangement} seed {schedule.seed}: {status} in {summary['secs']:.0f} s, "
          f"{sum(record.faults_made.values())} faults {record.faults_made}, hog {schedule.hog}, "
          f"{len(record.runs)} starts")
    if violations:
        write("  " + "\n  ".join(violations))
        write(f"  schedule: {schedule.text}")
        write(f"  replay: make soak SEED={schedule.seed} ARRANGEMENT={schedule.arrangement}"
              f"  (logs: {workdir})")
    return summary


def _cpu() -> str:
    return cpu_info.value("model name") or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=1, help="schedules per arrangement")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, help="replay this seed (with --arrangement)")
    parser.add_argument("--schedule", help="replay this schedule (its JSON, as printed)")
    parser.add_argument("--arrangement", action="append", choices=sorted(ARRANGEMENTS),
                        help="only these (repeatable; default: all)")
    parser.add_argument("--hog", type=int, choices=[0, 1, 2],
                        help="CPU hogs beside every schedule (default: drawn, 1 in 3 has one)")
    parser.add_argument("--out", default=os.path.join("/tmp", "towers-soak"))
    parser.add_argument("--keep", action="store_true", help="keep the logs of passing schedules")
    parser.add_argument("--hours", type=float, help="stop starting schedules after this long")
    args = parser.parse_args(argv)
    # A SIGTERM (a bounded run's end, a stop by hand) unwinds like Ctrl-C: the schedule
    # under way stops its processes, restores its links and unmounts its disk.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.makedirs(args.out, exist_ok=True)
    rows = jobs.write_rows(os.path.join(args.out, "rows.npz"))
    if args.schedule:
        schedules = [Schedule.from_text(args.schedule)]
    else:
        names = args.arrangement or list(ARRANGEMENTS)
        seeds = [args.seed] if args.seed is not None else range(
            args.first_seed, args.first_seed + args.schedules)
        # The faults are drawn once the arrangement's time scale is measured (its
        # reference run): an empty schedule here stands for its seed's.
        schedules = [Schedule(seed, name, name == "async" or _ends_with_data(seed, name),
                              args.hog if args.hog is not None else _hog(seed, name))
                     for seed in seeds for name in names]
    stop_at = time.monotonic() + args.hours * 3600 if args.hours else None
    failed = 0
    for schedule in schedules:
        if stop_at is not None and time.monotonic() > stop_at:
            print(f"--hours {args.hours}: no more schedules started")
            break
        failed += bool(run_schedule(schedule, args.out, rows, args.keep)["violations"])
        sys.stdout.flush()
    print(f"{len(schedules)} schedule(s), {failed} failed")
    return 1 if failed else 0


def _ends_with_data(seed: int, name: str) -> bool:
    return draw(seed, name, 1.0).ends_with_data


def _hog(seed: int, name: str) -> int:
    return draw(seed, name, 1.0).hog


def with_faults(schedule: Schedule, faults) -> Schedule:
    return replace(schedule, faults=tuple(faults))


if __name__ == "__main__":
    sys.exit(main())
