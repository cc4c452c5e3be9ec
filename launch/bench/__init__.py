"""`towers bench`: examples/sec of one model in every way this project (or TensorFlow)
can spread it over N devices, side by side, plus a host-memory report.

The CLI calls two functions of this package: `add_arguments(parser)` for the command's
options, and `run(args, job)`, which turns them into Settings, runs the report they ask
for, prints it and returns the exit status. `bench(settings, ...)` is the same without
the command line.

Rows, each at the same global batch and model, on synthetic inputs:
  1 device          one tower (`towers.build_train_op` on one device)
  parameter_server  N in-process towers, one copy of each variable on /cpu:0
  replicated        N in-process towers, a variable copy per tower, gradients all-reduced
  mirrored          tf.distribute.MirroredStrategy over the same N devices: a TF2 step in
                    `tf.function` calling the same model function and optimizer
  ps_worker         1 ps + N workers (one tower each) on 127.0.0.1, `train.sync: true`
  collective        N workers (one tower each) and no ps on 127.0.0.1: collective all-reduce
  horovod           `horovodrun -np N --gloo`, N ranks of `towers train --backend horovod`

Each row is measured in every variant (--precision, --accumulate, --xla,
--gradient-dtype), the variants of one mode and device count side by side. Warm-up
steps are discarded everywhere; the figures are the median of the timed blocks with
min and max.

Modules, each one job, the reports first:
  settings      the options, their defaults and checks; Settings, Variant and Row
  throughput    the main table: plans the rows, interleaves their timed blocks
  memory        --memory: peak RSS of 8 towers against 1, and over a long run
  input         --input: training fed by each kind of input, and each input alone
  jpeg          --input's JPEG table: what decoding costs, fused with the crop or not
  report        the table, bench.csv / .json / .png, the facts about the run
then what they run:
  case_process  an in-process row's own subprocess, timing blocks when asked
  cases         the towers rows, and what every in-process row shares (BuiltCase)
  mirrored      the MirroredStrategy row (eager: its process never takes graph mode)
  input_case    an --input row, in its case process
  images        the random pictures and JPEGs --input reads
  runs          the multi-process rows: whole `towers` runs
  limits        FLOPs per step, the peak matmul, the CPU's 16-bit flags
and overhead, the metrics exporter's own benchmark (python -m launch.bench.overhead).

Importing this package imports no TensorFlow, and of its modules only `settings`: the
CLI imports it to build its parser, in every towers process, before any job file is
checked. The rest load when a report is run or one of their names is first asked for
(`__getattr__` below): they would add about 70 ms to every command's start.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from launch.bench.settings import (
    MEMORY_STEPS,
    MODES,
    QUICK,
    STARTUP_DEFAULTS,
    BenchError,
    Row,
    Settings,
    Variant,
    check_installed,
    check_memory,
    check_model,
    check_settings,
    parse_modes,
    parse_towers,
    parse_variants,
    settings_from_args,
)
from launch.bench.settings import add_arguments as add_row_arguments
from launch.config import JobConfig
from launch.errors import EXIT_OK
from launch.log import log

__all__ = [
    "MODES",
    "QUICK",
    "BenchError",
    "Row",
    "Settings",
    "TF1StyleVariables",
    "Variant",
    "add_arguments",
    "bench",
    "build_mirrored_case",
    "build_towers_case",
    "check_installed",
    "check_memory",
    "check_model",
    "check_settings",
    "cluster_rate",
    "parse_modes",
    "parse_towers",
    "parse_variants",
    "plan_rows",
    "run",
    "run_bench",
    "settings_from_args",
]

EXIT_ROWS_FAILED = 1  # a row's runs failed; the table says why

# Names this package offers from its modules loaded on first use: name -> module.
_LOADED_ON_USE = {
    "build_towers_case": "cases",
    "TF1StyleVariables": "mirrored",
    "build_mirrored_case": "mirrored",
    "cluster_rate": "runs",
    "plan_rows": "throughput",
    "run_bench": "throughput",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `towers bench`, beside the job's own (-c, --set): the rows' (in
    settings), and those that ask for another report instead of the rows' table."""
    add_row_arguments(parser)
    parser.add_argument(
        "--input", action="store_true",
        help="instead: training fed by synthetic data, pre-decoded TFRecords (float and "
        "uint8) and JPEG TFRecords, on 1 device (or --towers), and each input alone",
    )
    parser.add_argument(
        "--memory", type=int, nargs="?", const=MEMORY_STEPS, metavar="STEPS",
        help="instead: peak RSS of 8 towers vs 1 (parameter_server), and RSS over "
        f"STEPS (default {MEMORY_STEPS}) steps of towers train",
    )
    parser.add_argument(
        "--startup", action="store_true",
        help="instead: a `towers train` of the job's start-up and memory stage by stage, "
        "and what each optional part adds to its peak (default: "
        f"{STARTUP_DEFAULTS['repeats']} interleaved runs of {STARTUP_DEFAULTS['steps']} "
        "steps each)")


def __getattr__(name: str):
    if name not in _LOADED_ON_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LOADED_ON_USE[name]}"), name)


def run(args: argparse.Namespace, job: JobConfig) -> int:
    """`towers bench`, as the CLI calls it: the options parsed by `add_arguments`, and the
    job they were given with. Prints the report; returns the exit status."""
    settings = settings_from_args(args, job)
    wanted = getattr(args, "startup", False)
    if wanted:
        from launch.bench import startup

        settings = startup.with_defaults(settings, args)
    report, failed = bench(settings, args.memory, log, args.input, job if wanted else None)
    print(report, flush=True)
    if failed:
        log(f"error: {', '.join(failed)} failed (the reasons are in the table)")
        return EXIT_ROWS_FAILED
    return EXIT_OK


def bench(settings: Settings, memory_steps: int | None,
          write: Callable[[str], None], input_rows: bool = False,
          startup_of: JobConfig | None = None) -> tuple[str, list[str]]:
    """The report asked for as markdown (the throughput table, or with `memory_steps`
    the memory report, or with `input_rows` the input report, or with `startup_of` (the
    job) the start-up report), and the rows whose runs failed (as "mode on N devices
    (variant)"), which make the command exit 1."""
    if memory_steps is not None:
        from launch.bench.memory import run_memory

        return run_memory(settings, memory_steps, write), []
    if input_rows:
        from launch.bench.input import input_bench

        return input_bench(settings, write), []
    if startup_of is not None:
        from launch.bench.startup import startup_report

        return startup_report(settings, startup_of, write), []
    from launch.bench.throughput import throughput_report

    return throughput_report(settings, write)
