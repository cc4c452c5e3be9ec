"""`towers bench --startup`: where a `towers train` of the job spends its start-up and
its memory, stage by stage, and what each optional part of a run adds to its peak.

Every run is a whole `towers train` of the job as given (its -c file and --sets, or
--model/--batch), `--steps` steps in a fresh checkpoint directory, in a process of its
own. The process reports its own stages (launch.startup: seconds from exec and RSS at
each) and its peak RSS in its JSON result, so nothing is sampled from outside. Beside
the job as written run the same job with one part changed, each --repeats times, the
runs interleaved (A B C ... A B C ...) so drift on a shared machine hits them alike;
figures are medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from launch.bench.runs import RunFailed, failure_reason, stop_group, towers_command
from launch.bench.settings import STARTUP_DEFAULTS as DEFAULTS
from launch.bench.settings import Settings
from launch.bench.throughput import PEER
from launch.config import JobConfig
from launch.startup import STAGES
from launch.tf_process import BFC_ENV

# What each stage holds, as the report says it.
STAGE_TEXT = {
    "modules": "Python, towers' modules, the job file",
    "tensorflow": "TensorFlow imported",
    "plan": "the model found, devices and data checked",
    "graph": "the training graph built",
    "session": "variables initialised, hooks begun, first checkpoint written",
    "first_step": "the first step: activations, the kernels' buffers",
}
AS_WRITTEN = "the job as written"
NEVER = 10**9  # a step count no run reaches: 'only at the start and the end'


def with_defaults(settings: Settings, args: argparse.Namespace) -> Settings:
    """The settings of --startup: its own defaults of --steps and --repeats."""
    return dataclasses.replace(
        settings, steps=args.steps if args.steps is not None else DEFAULTS["steps"],
        repeats=args.repeats if args.repeats is not None else DEFAULTS["repeats"])


@dataclass
class Change:
    """One run of the job with one part changed: its --sets and environment."""

    label: str
    sets: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # each run's JSON result


def changes(job: JobConfig) -> list[Change]:
    """The job as written, then each optional part of a run turned off (or on, where
    the job has it off), as far as this job has the part."""
    found = [
        Change(AS_WRITTEN),
        Change("step-phase samples: the first only",
               {"train.phase_sample_secs": float(NEVER)}),
        Change("TensorBoard summaries: none after the first",
               {"train.summary_every_steps": NEVER}),
        Change("checkpoints: the first and the final only",
               {"train.checkpoint_every_steps": NEVER}),
    ]
    if job.metrics.port is None:
        found.append(Change("metrics server: on (metrics.port 0)", {"metrics.port": 0}))
    else:
        found.append(Change("metrics server: off", {"metrics.port": None}))
    if job.data.source != "synthetic":
        found.append(Change("input: synthetic batches instead of the job's data",
                            {"data.source": "synthetic"}))
    if job.towers.variable_update == "replicated":
        found.append(Change("variables: one copy (parameter_server), not one per tower",
                            {"towers.variable_update": "parameter_server"}))
    bfc = os.environ.get(BFC_ENV, "").lower() in ("1", "true")
    found.append(Change(f"host allocator: {'glibc malloc' if bfc else 'BFC'} instead of "
                        f"{'BFC' if bfc else 'glibc malloc'}",
                        env={BFC_ENV: "false" if bfc else "true"}))
    return found


def run_once(settings: Settings, change: Change) -> dict:
    """One `towers train` of the job with `change`; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="towers-bench-") as checkpoint_dir:
        values = {
            "model": {"name": settings.model, **settings.params,
                      **({"path": settings.model_path} if settings.model_path else {})},
            "train.batch_size": settings.batch,
            "train.steps": settings.steps,
            "train.log_every_steps": settings.steps,
            "train.checkpoint_dir": checkpoint_dir,
            **change.sets,
        }
        flags = [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]
        command = towers_command("train", *settings.job_args, *flags)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True,
                                   env={**os.environ, **change.env}, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"did not finish within {settings.timeout:g} s") from None
        finally:
            stop_group(process)
    if process.returncode:
        raise RunFailed(f"exit status {process.returncode}: {failure_reason(stdout + stderr)}")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RunFailed(f"no result: {failure_reason(stdout + stderr)}")
    return json.loads(lines[-1])


def measure(settings: Settings, job: JobConfig, write: Callable[[str], None]) -> list[Change]:
    """Every change's runs, interleaved round by round."""
    found = changes(job)
    for round_ in range(settings.repeats):
        for change in found:
            write(f"round {round_ + 1}/{settings.repeats}: {change.label}")
            change.runs.append(run_once(settings, change))
    return found


def _median(runs: list[dict], pick: Callable[[dict], float | None]) -> float | None:
    values = [v for v in map(pick, runs) if v is not None]
    return statistics.median(values) if values else None


def _stage(stage: str, key: str) -> Callable[[dict], float | None]:
    return lambda result: result.get("startup", {}).get(stage, {}).get(key)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def stages_table(runs: list[dict]) -> str:
    """The job as written, stage by stage: seconds from exec, RSS at the stage's end and
    what the stage added to it, and the peak so far (a stage's passing highs included)."""
    lines = ["| stage | what | s from exec | RSS MiB | added MiB | peak so far MiB |",
             "| --- | --- | --- | --- | --- | --- |"]
    before = 0.0
    for stage in STAGES:
        rss = _median(runs, _stage(stage, "rss_mib"))
        secs = _median(runs, _stage(stage, "secs"))
        if rss is None and secs is None:
            continue
        added = None if rss is None else rss - before
        before = rss if rss is not None else before
        lines.append(f"| {stage} | {STAGE_TEXT[stage]} | {_fmt(secs, 2)} | {_fmt(rss)} "
                     f"| {_fmt(added)} | {_fmt(_median(runs, _stage(stage, 'peak_rss_mib')))} |")
    peak = _median(runs, lambda r: r.get("peak_rss_mib"))
    lines.append(f"| end | the later steps, the final checkpoint | | | | {_fmt(peak)} |")
    return "\n".join(lines)


def changes_table(found: list[Change]) -> str:
    """Each change's peak RSS and first step against the job as written."""
    base = found[0].runs
    base_peak = _median(base, lambda r: r.get("peak_rss_mib"))
    base_first = _median(base, _stage("first_step", "secs"))
    lines = ["| run | peak RSS MiB | change MiB | first step s from exec | change s |",
             "| --- | --- | --- | --- | --- |"]
    for change in found:
        peak = _median(change.runs, lambda r: r.get("peak_rss_mib"))
        first = _median(change.runs, _stage("first_step", "secs"))
        itself = change.label == AS_WRITTEN
        lines.append(f"| {change.label} | {_fmt(peak)} "
                     f"| {'' if itself else _difference(peak, base_peak, 1)} "
                     f"| {_fmt(first, 2)} "
                     f"| {'' if itself else _difference(first, base_first, 2)} |")
    return "\n".join(lines)


def _difference(value: float | None, base: float | None, digits: int) -> str:
    return "" if value is None or base is None else f"{value - base:+.{digits}f}"


def startup_report(settings: Settings, job: JobConfig, write: Callable[[str], None]) -> str:
    """The --startup report as markdown; startup.json in settings.out as well, if set."""
    from launch.bench.report import machine

    found = measure(settings, job, write)
    heading = (f"towers train of model {settings.model}, batch {settings.batch}, "
               f"{settings.steps} steps; {settings.repeats} runs of each, interleaved; "
               f"medians; {machine()}")
    report = "\n\n".join([
        heading, stages_table(found[0].runs), changes_table(found),
        PEER])
    if settings.out:
        os.makedirs(settings.out, exist_ok=True)
        with open(os.path.join(settings.out, "startup.json"), "w") as f:
            json.dump({"heading": heading,
                       "runs": {c.label: {"sets": c.sets, "env": c.env, "results": c.runs}
                                for c in found}}, f, indent=2)
            f.write("\n")
    return report
