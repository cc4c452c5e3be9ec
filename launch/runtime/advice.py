"""The line of advice at the end of a run: the bottleneck the step phases show, and the
settings that address it, never one already in use.

A synchronous step's exchange holds the wait for its slowest process, so a run whose
chief named a straggler is pointed at that process before the exchange's settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launch.config import AUTO, JobConfig
from launch.kernels.probe import SLOWER

# A waiting phase at least this share of the step is the bottleneck, ahead of compute.
WAIT_BOUND = 0.25
# A step shorter than this is mostly its fixed cost (a session run, the hooks' Python,
# the ops' launches: about 1 ms on a CPU host), not the model's arithmetic, so 16-bit
# compute or XLA would not shorten it; more examples per step would.
SHORT_STEP_SECS = 0.005


def bottleneck(shares: Mapping[str, float]) -> str:
    """The largest waiting phase (input, exchange, apply) at WAIT_BOUND of the step or
    more, else compute: the towers' own work is the floor, waiting is what can go."""
    waits = [p for p in ("input", "exchange", "apply") if shares[p] >= WAIT_BOUND]
    return max(waits, key=lambda p: shares[p]) if waits else "compute"


# Where bfloat16 may pay off, when the towers' devices are not known.
ANY_BFLOAT16_UNITS = "GPUs, CPUs with avx512_bf16 or AMX"
# Why not, when the devices' flags are all that is known.
NO_BFLOAT16_UNITS = ("these devices have no bfloat16 instructions (avx512_bf16, amx_bf16), "
                     "so TensorFlow would emulate mixed_bfloat16, slower than float32")
# Why XLA is not proposed for towers on CPUs: its CPU code ran every built-in job measured
# slower than TensorFlow's own kernels, 0.38x to 0.76x (BENCHMARKS.md).
NO_XLA_ON_CPUS = ("XLA is left out on CPU towers (it ran the built-in jobs at 0.38x to "
                  "0.76x their speed there)")


@dataclass(frozen=True)
class Setup:
    """What the advice must know of the job beyond its file: whether its processes
    keep the variables on ps tasks, whether there are several, whether bfloat16 would
    pay off (bfloat16_setup): where (bfloat16: 'GPUs', 'this CPU has amx_bf16', a
    measurement), or why not (bfloat16 None, and no_bfloat16 says why), and whether XLA
    may (xla_may_pay False: every tower is on a CPU, NO_XLA_ON_CPUS)."""

    ps_tasks: bool = False
    processes: int = 1
    bfloat16: str | None = ANY_BFLOAT16_UNITS
    no_bfloat16: str = NO_BFLOAT16_UNITS
    xla_may_pay: bool = True


def bfloat16_setup(units: str | None, measured: float | None) -> tuple[str | None, str]:
    """Setup's (bfloat16, no_bfloat16) from the devices' bfloat16 units
    (launch.devices.bfloat16_units) and the model's kernels' speed-up in bfloat16 this
    machine measured (launch.kernels.cached_speedup; None: never timed). A measurement
    decides over CPU flags, which are no proof: on a Xeon with avx512_fp16 a float16
    convolution's gradient ran at 0.005x float32."""
    if measured is None:
        return units, NO_BFLOAT16_UNITS
    ran = (f"this machine ran the model's convolutions and matrix products at "
           f"{measured:.2g}x their float32 speed in bfloat16, timed at an earlier start-up")
    return (ran, NO_BFLOAT16_UNITS) if measured >= SLOWER else (None, ran)


def advice(shares: Mapping[str, float], job: JobConfig, setup: Setup = Setup(),
           stragglers: Sequence[str] = (), step_secs: float | None = None) -> str:
    """One line: the bottleneck the shares show, and what to try for it.

    stragglers: the processes the chief named stragglers during the run.
    step_secs: the mean step time (None: unknown).
    """
    phase = bottleneck(shares)
    share = f"{round(100 * shares[phase])}% of the step"
    if phase == "exchange" and stragglers:
        return (f"exchange-bound ({share} moves gradients and variables, and in a "
                f"synchronous step waits for the slowest process), but {', '.join(stragglers)} "
                "was named a straggler above: speed it up first (its line says whether it "
                "waits on input or on compute)")
    what = {
        "input": f"input-bound ({share} waits for the next batch)",
        "exchange": f"exchange-bound ({share} moves gradients and variables)",
        "apply": f"apply-bound ({share} applies the update)",
        "compute": f"compute-bound ({share} is the towers' forward and backward)",
    }[phase]
    if phase == "compute" and step_secs is not None and step_secs < SHORT_STEP_SECS:
        return (f"{what}, but a step of {1000 * step_secs:.1f} ms is mostly the fixed cost "
                "of a step, not the model's arithmetic: try a larger train.batch_size "
                f"(now {job.train.batch_size}) for more examples per second")
    tries = {"input": _input, "exchange": _exchange, "apply": _apply,
             "compute": _compute}[phase](job, setup)
    if not tries:
        left = _compute_left(job, setup) if phase == "compute" else _NOTHING_LEFT[phase]
        return f"{what}: {left}"
    return f"{what}: try {_either(tries)}"


_NOTHING_LEFT = {
    "input": "the pipeline's settings are on auto and the data needs no decoding: the host's "
             "CPUs (or its storage) are the limit",
    "exchange": "the settings that shrink it are in use: fewer towers or processes, or a "
                "faster network, are what is left",
    "apply": "the variables are spread and the optimizer is the cheapest: fewer or smaller "
             "variables are what is left",
}
_COMPUTE_FLOOR = ("the towers' own work is the floor; more or faster devices, or a smaller "
                  "model, make it shorter")


def _compute_left(job: JobConfig, setup: Setup) -> str:
    """Why neither 16-bit compute nor XLA is proposed to a compute-bound job."""
    sixteen_bits = job.towers.precision != "float32"
    if sixteen_bits and job.towers.xla:
        return f"16-bit compute and XLA are in use already: {_COMPUTE_FLOOR}"
    xla = "XLA is in use" if job.towers.xla else NO_XLA_ON_CPUS
    precision = "16-bit compute is in use" if sixteen_bits else setup.no_bfloat16
    return f"{xla}, and {precision}: {_COMPUTE_FLOOR}"


def _either(tries: list[str]) -> str:
    return tries[0] if len(tries) == 1 else ", ".join(tries[:-1]) + " or " + tries[-1]


def _input(job: JobConfig, setup: Setup) -> list[str]:
    data = job.data
    tries = [f"raising data.{key} (now {value}) or setting it to auto"
             for key, value in (("num_parallel_calls", data.num_parallel_calls),
                                ("prefetch", data.prefetch)) if value != AUTO]
    if data.threads != AUTO:
        tries.append(f"raising data.threads (now {data.threads})")
    if data.source == "tfrecord" and data.schema is not None and data.schema.kind == "image":
        tries.append("images decoded once, ahead of training: uint8 TFRecords "
                     "(towers data convert)")
    return tries


def _exchange(job: JobConfig, setup: Setup) -> list[str]:
    tries = []
    if job.towers.gradient_dtype == "float32":
        tries.append("towers.gradient_dtype: bfloat16 (half the bytes)")
    if setup.processes == 1:
        other = {"parameter_server": "replicated", "replicated": "parameter_server"}
        tries.append(f"towers.variable_update: {other[job.towers.variable_update]}")
    if setup.ps_tasks:
        tries.append("more ps tasks")
    return [*tries, "fewer towers or workers"]


def _apply(job: JobConfig, setup: Setup) -> list[str]:
    tries = []
    if job.towers.param_device != "least_loaded" and not setup.ps_tasks:
        tries.append("towers.param_device: least_loaded (the variables spread over the "
                     "devices)")
    if setup.ps_tasks:
        tries.append("more ps tasks")
    cheaper = {"momentum": "sgd", "adam": "momentum or sgd", "rmsprop": "momentum or sgd"}
    if job.optimizer.name in cheaper:
        tries.append(f"an optimizer cheaper than {job.optimizer.name} "
                     f"({cheaper[job.optimizer.name]})")
    return tries


def _compute(job: JobConfig, setup: Setup) -> list[str]:
    tries = []
    if job.towers.precision == "float32" and setup.bfloat16:
        tries.append(f"towers.precision: mixed_bfloat16 ({setup.bfloat16})")
    if not job.towers.xla and setup.xla_may_pay:
        tries.append("towers.xla: true")
    return tries
