"""What `towers bench` measures: its options and their defaults, the settings they give,
the report's rows, and the option checks.

`add_arguments` defines the command's options; `settings_from_args` parses and checks
them, with the job, once at the entry point (`launch.bench.run`); everything else
takes a Settings and trusts it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from launch.config import JobConfig, ModelConfig
from launch.errors import BadInput

MODES = ("parameter_server", "replicated", "mirrored", "ps_worker", "collective", "horovod")
IN_PROCESS_MODES = ("parameter_server", "replicated", "mirrored")
SINGLE = "1 device"
# How long a row may take to answer (its build and warm-up, a timed block, a whole
# multi-process run) before it is reported as not answering; --timeout.
RUN_TIMEOUT_SECS = 900
# In-process rows building at once: each imports TensorFlow and builds its graph, and
# many at once on a few cores (a loaded machine) made every row miss its deadline.
BUILDS_AT_ONCE = 2

# What a row is measured with unless an option says otherwise; --input measures 1 device.
DEFAULTS = {"towers": (1, 2, 4), "steps": 20, "warmup": 10, "repeats": 5}
# --startup's: each run's steps, and the runs of each change
STARTUP_DEFAULTS = {"steps": 20, "repeats": 3}
INPUT_TOWERS = (1,)

# --quick: 1 and 2 devices, a few short blocks, and one whole run per multi-process
# row (each costs tens of seconds of process start-up on 2 cores).
QUICK = {"towers": (1, 2), "steps": 10, "warmup": 5, "repeats": 3, "run_repeats": 1}

# --profile: where without a directory, and how many steps of each row it traces.
PROFILE_DIR = "runs/bench-profile"
PROFILE_STEPS = 5

# --memory without a count: steps of the long `towers train` run.
MEMORY_STEPS = 5000

# The data keys `towers bench --input` takes from the job for its training rows.
INPUT_PIPELINE_KEYS = ("num_parallel_calls", "prefetch", "threads", "shuffle_buffer")

# --memory compares the host memory of this many towers against one.
MEMORY_TOWERS = (1, 8)

# The job file's towers.precision values, and the number type each computes in.
PRECISIONS = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
GRADIENT_DTYPES = ("float32", "bfloat16", "float16")


class Variant(NamedTuple):
    """How every row of one kind computes: the --precision, --accumulate, --xla,
    --gradient-dtype, --batch-norm and --pack-bytes axes. The first variant of a run is
    its base. pack_bytes None: the job's towers.pack_gradients_bytes."""

    precision: str = "float32"
    accumulate: int = 1
    xla: bool = False
    gradient_dtype: str = "float32"
    batch_norm: str = "local"
    pack_bytes: int | None = None

    @property
    def label(self) -> str:
        """'float32', 'mixed_bfloat16, xla, accumulate 4, bfloat16 gradients' ..."""
        parts = [self.precision]
        if self.xla:
            parts.append("xla")
        if self.accumulate > 1:
            parts.append(f"accumulate {self.accumulate}")
        if self.gradient_dtype != "float32":
            parts.append(f"{self.gradient_dtype} gradients")
        if self.batch_norm != "local":
            parts.append(f"{self.batch_norm} batch norm")
        if self.pack_bytes is not None:
            parts.append(f"packed in {self.pack_bytes} B" if self.pack_bytes else "unpacked")
        return ", ".join(parts)

    @property
    def number_type(self) -> str:
        """What the towers compute in: float32, bfloat16 or float16."""
        return PRECISIONS[self.precision]

    def job_values(self) -> dict[str, Any]:
        """The job keys of this variant, for whole `towers` runs."""
        return {"towers.precision": self.precision, "towers.xla": self.xla,
                "towers.gradient_dtype": self.gradient_dtype,
                "train.accumulate_steps": self.accumulate, "towers.batch_norm": self.batch_norm,
                **({} if self.pack_bytes is None
                   else {"towers.pack_gradients_bytes": self.pack_bytes})}


FLOAT32 = Variant()  # every axis at its default: the rows `towers bench` measured before


class BenchError(BadInput):
    """Bad bench options (modes, device counts, steps); exit status 2."""


@dataclass(frozen=True)
class Settings:
    """What to measure. job_args: the user's -c/--set, passed on to every `towers` run.

    model, params: the model and its parameters (from the job file or --model).
    model_path, job_dir: where the model's code is looked for besides sys.path
    (model.path and the job file's directory), so every row finds the same code.
    batch: the global batch of every row; towers: the device counts N.
    steps: steps per timed block; warmup: steps discarded before the first block
    (and at the start of each multi-process run); repeats: blocks per row;
    run_repeats: whole runs per multi-process row (default: repeats), one in
    each of the first rounds. data_options: --input: the job's input pipeline keys
    (num_parallel_calls, prefetch, threads, shuffle_buffer) every input row uses.
    profile: --profile: the directory for a profiler trace of each in-process row.
    timeout: seconds a row may take to answer (RUN_TIMEOUT_SECS).
    """

    model: str
    params: dict[str, Any]
    batch: int
    towers: tuple[int, ...]
    modes: tuple[str, ...]
    steps: int
    warmup: int
    repeats: int
    job_args: tuple[str, ...] = ()
    out: str | None = None
    run_repeats: int | None = None
    variants: tuple[Variant, ...] = (FLOAT32,)
    data_options: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None
    job_dir: str | None = None
    profile: str | None = None
    timeout: float = RUN_TIMEOUT_SECS


@dataclass
class Row:
    """One line of the report. rates: examples/sec of each timed block, in order.
    flops_per_example: of a training step, from the variant's 1-device graph.
    kernel_ceiling: a 16-bit row's ceiling (launch.bench.ceiling), or None."""

    mode: str
    devices: int
    variant: Variant = FLOAT32
    rates: list[float] = field(default_factory=list)
    peak_rss_bytes: int | None = None
    gradient_bytes: int | None = None
    flops_per_example: float | None = None
    skipped: str | None = None
    cpu_ms_per_example: float | None = None  # --input: the row's CPU time per example
    kernel_ceiling: float | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `towers bench` that shape its rows (the package adds those asking
    for another report)."""
    parser.add_argument("--model", metavar="NAME",
                        help="model to measure, with its defaults (default: the job's model)")
    parser.add_argument("--batch", type=int, metavar="N",
                        help="global batch of every row (default: train.batch_size)")
    parser.add_argument("--towers", metavar="N,...",
                        help="device counts; 1 is always included "
                        f"(default {','.join(map(str, DEFAULTS['towers']))})")
    parser.add_argument("--modes", default=",".join(MODES), metavar="MODE,...",
                        help=f"from {', '.join(MODES)} (default: all)")
    parser.add_argument("--precision", metavar="P,...",
                        help="rows in each of float32, mixed_bfloat16, mixed_float16 "
                        "(default float32); the first is the base of 'ratio to base variant'")
    parser.add_argument("--accumulate", metavar="K,...",
                        help="rows with each train.accumulate_steps (default 1); with --memory, "
                        "peak RSS of each against 1")
    parser.add_argument("--xla", metavar="off,on", help="rows without and/or with XLA "
                        "(default off)")
    parser.add_argument("--gradient-dtype", metavar="T,...",
                        help="rows sending gradients in each of float32, bfloat16, float16 "
                        "(default float32)")
    parser.add_argument("--batch-norm", metavar="local,sync",
                        help="rows with each towers.batch_norm (default local): sync "
                        "normalizes by the whole batch across the towers")
    parser.add_argument("--pack-bytes", metavar="B,...",
                        help="rows with each towers.pack_gradients_bytes (default: the "
                        "job's); 0 sends gradients unpacked. It changes the collective "
                        "rows only (nothing else is packed)")
    add_block_arguments(parser, DEFAULTS, "row")
    parser.add_argument("--runs", type=int, metavar="N",
                        help="whole runs per ps_worker/horovod row (default: --repeats)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="how long a row may take to build, to time a block or to run "
                        "whole before it is reported as not answering and the others go on "
                        f"(default {RUN_TIMEOUT_SECS:g})")
    parser.add_argument("--out", metavar="DIR", help="also write bench.csv, bench.json, bench.png")
    parser.add_argument(
        "--profile", nargs="?", const=PROFILE_DIR, metavar="DIR",
        help=f"also a TensorFlow profiler trace of {PROFILE_STEPS} steps of each in-process "
        f"row, after its timed blocks, a TensorBoard run per row under DIR (default "
        f"{PROFILE_DIR}): tensorboard --logdir DIR, Profile tab (the profile extra)")
    parser.add_argument("--quick", action="store_true",
                        help=f"devices {','.join(map(str, QUICK['towers']))}, "
                        f"{QUICK['repeats']} blocks of {QUICK['steps']} steps, one run per "
                        "multi-process row: a check that every mode runs, not a benchmark")


def add_block_arguments(parser: argparse.ArgumentParser, defaults: dict, each: str) -> None:
    """--steps, --warmup and --repeats: the timed blocks of each `each` (row, candidate)."""
    parser.add_argument("--steps", type=int, metavar="N",
                        help=f"steps per timed block (default {defaults['steps']})")
    parser.add_argument("--warmup", type=int, metavar="N",
                        help=f"steps discarded first (default {defaults['warmup']})")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help=f"timed blocks per {each}, interleaved across {each}s "
                        f"(default {defaults['repeats']})")


def settings_from_args(args: argparse.Namespace, job: JobConfig) -> Settings:
    """The Settings of `towers bench ARGS` on `job`, every option checked; BenchError
    (exit status 2) naming the first bad one."""
    quick = QUICK if args.quick else {}
    defaults = {**DEFAULTS, "towers": INPUT_TOWERS if args.input else DEFAULTS["towers"],
                **quick}
    name = args.model or job.model.name
    params = dict(job.model.params) if name == job.model.name else {}
    check_model(dataclasses.replace(job.model, name=name, params=params),
                "--model" if args.model else "model.name")
    settings = Settings(
        model=name,
        params=params,
        batch=args.batch or job.train.batch_size,
        towers=parse_towers(args.towers) if args.towers else defaults["towers"],
        modes=parse_modes(args.modes),
        steps=args.steps if args.steps is not None else defaults["steps"],
        warmup=args.warmup if args.warmup is not None else defaults["warmup"],
        repeats=args.repeats if args.repeats is not None else defaults["repeats"],
        job_args=_job_args(args),
        out=args.out,
        run_repeats=args.runs if args.runs is not None else quick.get("run_repeats"),
        variants=parse_variants(args.precision, args.accumulate, args.xla,
                                args.gradient_dtype, args.batch_norm, args.pack_bytes),
        data_options={key: getattr(job.data, key) for key in INPUT_PIPELINE_KEYS},
        model_path=job.model.path,
        job_dir=job.model.job_dir,
        profile=args.profile,
        timeout=args.timeout if args.timeout is not None else RUN_TIMEOUT_SECS,
    )
    check_settings(settings)
    check_installed(settings)
    if args.memory is not None:
        check_memory(settings, args.memory)
    return settings


def _job_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The user's -c and --set, as every whole `towers` run the bench starts is given them."""
    config = ["-c", args.config] if args.config else []
    return tuple(config + [a for o in args.overrides for a in ("--set", o)])


def parse_towers(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); always includes 1, the baseline every ratio is taken to."""
    try:
        counts = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise BenchError(f"--towers: expected device counts like 1,2,4; got {text!r}") from None
    if not counts or min(counts) < 1:
        raise BenchError(f"--towers: device counts must be at least 1; got {text!r}")
    return tuple(sorted(counts | {1}))


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise BenchError(f"--modes: unknown mode {unknown[0] if unknown else text!r}; "
                         f"accepted: {', '.join(MODES)}")
    return modes


def parse_variants(precisions: str | None, accumulate: str | None, xla: str | None,
                   gradient_dtypes: str | None,
                   batch_norms: str | None = None,
                   pack_bytes: str | None = None) -> tuple[Variant, ...]:
    """Every combination of the axes given (each a comma-separated list), in the order
    given: the first is the base the others' ratios are taken to."""
    axes = [
        _parse_list("--precision", precisions or "float32", list(PRECISIONS)),
        [_positive("--accumulate", k) for k in _split(accumulate or "1")],
        [v == "on" for v in _parse_list("--xla", xla or "off", ["off", "on"])],
        _parse_list("--gradient-dtype", gradient_dtypes or "float32", list(GRADIENT_DTYPES)),
        _parse_list("--batch-norm", batch_norms or "local", ["local", "sync"]),
        [_at_least_0("--pack-bytes", b) for b in _split(pack_bytes)] if pack_bytes else [None],
    ]
    return tuple(Variant(*values) for values in itertools.product(*axes))


def _split(text: str) -> list[str]:
    return list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def _parse_list(flag: str, text: str, accepted: list[str]) -> list[str]:
    values = _split(text)
    unknown = [v for v in values if v not in accepted]
    if unknown or not values:
        raise BenchError(f"{flag}: unknown value {unknown[0] if unknown else text!r}; "
                         f"accepted: {', '.join(accepted)}")
    return values


def _positive(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise BenchError(f"{flag}: expected positive integers like 1,4; got {text!r}")
    return value


def _at_least_0(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise BenchError(f"{flag}: expected byte counts like 0,4194304; got {text!r}")
    return value


def check_installed(settings: Settings) -> None:
    """The bench's own dependencies (the `bench` extra), named before anything runs."""
    import importlib.util

    needed = ["psutil"] + (["matplotlib"] if settings.out else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise BenchError(f"towers bench needs {' and '.join(missing)}: "
                         "pip install -e '.[bench]' (or pip install towers[bench])")


def check_settings(settings: Settings) -> None:
    if settings.run_repeats is not None and settings.run_repeats < 1:
        raise BenchError("--runs must be at least 1")
    for name in ("steps", "repeats"):
        if getattr(settings, name) < 1:
            raise BenchError(f"--{name} must be at least 1")
    if settings.warmup < 0:
        raise BenchError("--warmup must be at least 0")
    if settings.timeout <= 0:
        raise BenchError("--timeout must be a positive number of seconds")
    import towers  # the rule and its wording; TensorFlow is imported by now

    micro = max(v.accumulate for v in settings.variants)
    shortfall = towers.batch_shortfall(settings.batch, max(settings.towers), micro)
    if shortfall:
        raise BenchError(f"--batch: {shortfall}")


def check_memory(settings: Settings, steps: int) -> None:
    if steps < 1:
        raise BenchError("--memory: steps must be at least 1")
    import towers

    shortfall = towers.batch_shortfall(settings.batch, max(MEMORY_TOWERS))
    if shortfall:
        raise BenchError(f"--memory: {shortfall}; raise --batch")


def check_model(model: ModelConfig, where: str) -> None:
    """The bench's model resolves as the job's does, and declares the input its
    synthetic batches are made for; BenchError naming `where` otherwise."""
    from launch import modelref

    try:
        resolved = modelref.resolve(model)
    except modelref.ModelRefError as err:
        raise BenchError(f"{where}: {err}") from None
    if resolved.input_spec is None:
        raise BenchError(
            f"{where}: model {model.name} declares no input_spec; the bench feeds synthetic "
            f"batches made for the model's declared input"
        )
