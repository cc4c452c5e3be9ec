"""What `towers tune` tries: the settings that change a step's speed, in stages.

Each stage is one choice (how the towers share variables, XLA, the number types,
micro-batches), its candidates the job's other values for it; a candidate is a set
of job keys (--set overrides) on top of the settings chosen so far. A stage that
cannot matter for this job, or that --allow-precision has not allowed, is left out
with the reason, which the tuned job file states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from launch.config import JobConfig

Settings = dict[str, Any]
"""Job keys and their values, e.g. {"towers.xla": True}."""

# Number types a precision computes in, for the start-up probe (launch.kernels).
_NUMBER_TYPES = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


class Stage(NamedTuple):
    """One choice: its name, the candidates tried against the settings so far, and why
    it is not tried (None: it is)."""

    name: str
    candidates: list[Settings]
    not_tried: str | None = None


def stages(job: JobConfig, towers: int, gpus: bool, allow_precision: bool,
           speedup: Callable[[str], float | None]) -> list[Stage]:
    """The stages for `job` on `towers` tower devices (GPUs or not); speedup(number
    type): how much faster the model's kernels run in it than in float32 on this
    machine (launch.kernels.probe), None if unknown."""
    return [_sharing(job, towers, gpus), _xla(job), _precision(job, allow_precision, speedup),
            _gradient_dtype(job, towers, allow_precision), _accumulation(job), _packing()]


def _sharing(job: JobConfig, towers: int, gpus: bool) -> Stage:
    name = "variable update and parameter device"
    if towers == 1:
        return Stage(name, [], "one tower shares nothing")
    options = [{"towers.variable_update": "parameter_server", "towers.param_device": device}
               for device in ("cpu", *(["gpu"] if gpus else []), "least_loaded")]
    options.append({"towers.variable_update": "replicated"})
    current = job.towers.variable_update, job.towers.param_device
    return Stage(name, [o for o in options if (o["towers.variable_update"],
                                               o.get("towers.param_device", current[1]))
                        != current])


def _xla(job: JobConfig) -> Stage:
    return Stage("XLA", [{"towers.xla": not job.towers.xla}])


def _precision(job: JobConfig, allowed: bool, speedup: Callable[[str], float | None]) -> Stage:
    name = "precision"
    if not allowed:
        return Stage(name, [], "changes results beyond rounding; --allow-precision tries it")
    candidates = [{"towers.precision": "float32"}] if job.towers.precision != "float32" else []
    for precision, number_type in _NUMBER_TYPES.items():
        gain = speedup(number_type)
        if precision != job.towers.precision and gain is not None and gain > 1.0:
            candidates.append({"towers.precision": precision})
    if not candidates:
        return Stage(name, [], "this machine runs the model's kernels no faster in 16 bits "
                     "(timed alone, launch.kernels)")
    return Stage(name, candidates)


def _gradient_dtype(job: JobConfig, towers: int, allowed: bool) -> Stage:
    name = "gradient type"
    if not allowed:
        return Stage(name, [], "changes results beyond rounding; --allow-precision tries it")
    if towers == 1:
        return Stage(name, [], "one tower sends no gradients")
    return Stage(name, [{"towers.gradient_dtype": t} for t in ("float32", "bfloat16")
                        if t != job.towers.gradient_dtype])


def _accumulation(job: JobConfig) -> Stage:
    name = "micro-batches"
    steps = job.train.accumulate_steps
    if steps == 1:
        return Stage(name, [], "the step fits in one micro-batch; more only save memory")
    fewer = sorted({1, steps // 2} - {steps})
    return Stage(name, [{"train.accumulate_steps": k} for k in fewer
                        if job.train.batch_size % k == 0])


def _packing() -> Stage:
    return Stage("gradient packing", [], "it changes only the reduction across processes "
                 "(collective workers, Horovod ranks), not one process's step")


def for_memory(job: JobConfig, towers: int) -> list[Settings]:
    """More micro-batches, for a job whose step does not fit: 2, 4, 8 ... times the job's
    while every tower still gets an example."""
    steps, out = job.train.accumulate_steps * 2, []
    while job.train.batch_size // steps >= towers:
        out.append({"train.accumulate_steps": steps})
        steps *= 2
    return out


def label(settings: Settings) -> str:
    """'towers.xla=true, towers.precision=mixed_bfloat16', or 'the job as written'."""
    if not settings:
        return "the job as written"
    return ", ".join(f"{key}={_text(value)}" for key, value in settings.items())


def overrides(settings: Settings) -> list[str]:
    """The settings as --set strings."""
    return [f"{key}={_text(value)}" for key, value in settings.items()]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
