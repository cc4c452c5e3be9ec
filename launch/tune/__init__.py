"""`towers tune`: the fastest settings for the user's own job on this machine.

    towers tune -c job.yaml [--budget SECONDS] [--allow-precision] [--out PATH]

It times the job's own training step (its model, input and devices, as `towers train`
builds it) through the settings that change a step's speed, stage by stage
(launch.tune.choices: how the towers share variables, XLA, the number types, the
micro-batches), each stage's candidates side by side with the settings chosen so
far (launch.tune.search), and writes a copy of the job with the fastest settings,
headed by the measured table and the reason for each choice (launch.tune.written).
The number types change results beyond rounding, so they are tried only with
--allow-precision. Horovod's own autotuning searches its fusion buffer and cycle time;
this searches the whole step.

The CLI calls `add_arguments(parser)` and `run(args, job)`, as for `towers bench`;
importing this package imports no TensorFlow.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable

from launch.bench.settings import add_block_arguments
from launch.config import JobConfig
from launch.errors import EXIT_OK, BadInput
from launch.log import log
from launch.tune.choices import Stage, stages
from launch.tune.search import Outcome, Search, TuneError, TuneSettings
from launch.tune.written import default_path, table, tuned_text

__all__ = ["TuneError", "TuneSettings", "add_arguments", "run", "tune"]

DEFAULTS = {"budget": 600.0, "steps": 10, "repeats": 5, "warmup": 5, "timeout": 900.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `towers tune`, beside the job's own (-c, --set)."""
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="the search's time; stages that would not fit are left out and "
                        f"say so (default {DEFAULTS['budget']:g})")
    parser.add_argument("--allow-precision", action="store_true",
                        help="also try towers.precision and towers.gradient_dtype, which "
                        "change results beyond rounding (16-bit types only where this "
                        "machine runs the model's kernels faster in them)")
    parser.add_argument("--out", metavar="PATH",
                        help="the tuned job file (default: JOB.tuned.yaml beside the job "
                        "file, tuned.yaml for the built-in job)")
    add_block_arguments(parser, DEFAULTS, "candidate")


def run(args: argparse.Namespace, job: JobConfig) -> int:
    """`towers tune`, as the CLI calls it: prints the table and writes the tuned job."""
    settings = _settings(args, job)
    out = args.out or default_path(args.config)
    text, outcome = tune(settings, job, log)
    with open(out, "w") as f:
        f.write(text)
    print("\n".join(table(outcome)), flush=True)
    log(f"wrote {out}: {'; '.join(f'{k}: {v}' for k, v in outcome.notes.items())}")
    return EXIT_OK


def tune(settings: TuneSettings, job: JobConfig,
         write: Callable[[str], None]) -> tuple[str, Outcome]:
    """The tuned job file's text and the search's outcome."""
    from launch import kernels
    from launch.bench.report import machine

    def stages_of(facts: dict) -> list[Stage]:
        counts = facts["kernels"]

        def speedup(number_type: str) -> float | None:
            return kernels.probe(counts, number_type).overall if counts else None

        devices = facts["devices"]
        gpus = any("gpu" in d.lower() for d in devices)
        return stages(job, len(devices), gpus, settings.allow_precision, speedup)

    outcome = Search(settings, write).run(stages_of)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return tuned_text(settings, outcome, machine(), date), outcome


def _settings(args: argparse.Namespace, job: JobConfig) -> TuneSettings:
    """The options checked, once; BadInput (exit 2) naming the first bad one."""
    if job.cluster.backend not in ("auto", "in_process"):
        raise BadInput(f"cluster.backend: towers tune times the job's step in one process; "
                       f"a {job.cluster.backend} job's processes are not tuned (tune its "
                       "in-process step with --set cluster.backend=in_process)")
    values = {key: getattr(args, key) if getattr(args, key) is not None else default
              for key, default in DEFAULTS.items() if key != "timeout"}
    for key in ("steps", "repeats"):
        if values[key] < 1:
            raise BadInput(f"--{key} must be at least 1")
    if values["warmup"] < 0:
        raise BadInput("--warmup must be at least 0")
    if values["budget"] <= 0:
        raise BadInput("--budget must be a positive number of seconds")
    return TuneSettings(args.config, tuple(args.overrides), values["steps"], values["repeats"],
                        values["warmup"], DEFAULTS["timeout"], values["budget"],
                        args.allow_precision)
