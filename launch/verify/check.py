"""The three runs of `towers verify`, compared (see launch.verify)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from launch.config import JobConfig
from launch.errors import BadInput
from launch.runtime.plan import Plan, make_plan
from launch.verify import compare
from launch.verify.runs import Run, on_towers, one_device, read_batches, reordered

# Rounding grown past this share of the values (compare.rounding_growth) is noted.
CHAOTIC = 1e-6


class NoiseLeft(BadInput):
    """The model draws random numbers verify cannot set to rate 0."""


def verify(job: JobConfig, steps: int, rtol: float, floor_factor: float,
           write: Callable[[str], None]) -> tuple[bool, list[str]]:
    """(passed, the lines to print: a header, the table, the verdict) for `job` after
    `steps` steps; write: progress and notices."""
    for note in _notes(job):
        write(note)
    plan = make_plan(job)
    batches = read_batches(plan, job.train.batch_size, steps)
    ref_plan = one_device(plan)
    write(f"verify: one device ({ref_plan.devices[0]}), {steps} steps, twice (the second "
          f"with each batch's examples reordered)")
    reference = Run(job, ref_plan, batches[0], write)
    try:
        _check_no_noise_left(reference.draws)
        start = reference.initial()
        want = reference.train(start, batches)
        floor = reference.train(start, reordered(batches, job.train.accumulate_steps))
    finally:
        reference.close()
    write(f"verify: {_towers(job, plan)}, {steps} steps")
    tower_run = Run(job, on_towers(plan), batches[0], write)
    try:
        got = tower_run.train(start, batches)
    finally:
        tower_run.close()
    found = compare.rows(start, want.values, got.values, got.copies, floor.values, rtol,
                         floor_factor)
    what = f"{_count(plan)} against one device after {steps} step{'s' * (steps != 1)}"
    passed, line = compare.verdict(found, what, sorted(set(got.values) - set(want.values)))
    growth = compare.rounding_growth(found)
    if not passed:
        line += _hints(job, plan, growth)
    header = _header(job, plan, steps, rtol, floor_factor)
    return passed, [*header, *_notes_on(found, reference.silenced, growth, steps),
                    *compare.table(found), line]


def _header(job: JobConfig, plan: Plan, steps: int, rtol: float,
            floor_factor: float) -> list[str]:
    """What was compared, the floor and the tolerance, as comment lines."""
    within = " (within its micro-batches)" if job.train.accumulate_steps > 1 else ""
    return [
        f"# towers verify: {_towers(job, plan)}, against one device ({plan.devices[0]}): "
        f"{steps} steps of {job.train.batch_size} examples, in float64",
        f"# noise floor: one device on the same batches, each batch's examples reordered"
        f"{within}",
        f"# tolerance: max({rtol:g} x max|w|, {floor_factor:g} x noise floor), per variable",
    ]


def _notes_on(found: list[compare.Row], silenced: Counter, growth: float,
              steps: int) -> list[str]:
    """Comment lines on what the comparison can show: the noise set to rate 0, rounding
    the steps amplify, the variables the steps left as they were."""
    notes = []
    if silenced:
        kinds = ", ".join(f"{kind} ({n})" for kind, n in sorted(silenced.items()))
        notes.append(f"# at rate 0 while verifying: {kinds}")
    if growth > CHAOTIC:
        notes.append(f"# note: rounding alone moved half the variables by more than "
                     f"{growth:.0e} of their size in {steps} steps: these steps amplify "
                     f"rounding, so the comparison shows little; fewer --steps, a larger "
                     f"train.batch_size or a lower learning rate make it sharper")
    still = compare.unmoved(found)
    if still:
        notes.append(f"# unchanged by the steps (their agreement shows nothing): "
                     f"{', '.join(still)}")
    return notes


def _count(plan: Plan) -> str:
    n = len(plan.devices)
    return f"{n} tower{'s' * (n != 1)}"


def _towers(job: JobConfig, plan: Plan) -> str:
    return (f"{_count(plan)} ({', '.join(plan.devices)}), {plan.sharing}, batch_norm "
            f"{job.towers.batch_norm}, accumulate_steps {job.train.accumulate_steps}")


def _notes(job: JobConfig) -> list[str]:
    """What verify does not check of this job, said before it starts."""
    notes = []
    cluster = job.cluster
    if cluster.backend not in ("auto", "in_process") or cluster.ps or cluster.worker \
            or cluster.chief:
        notes.append(f"verify: note: a job of several processes (cluster.backend: "
                     f"{cluster.backend}) is checked as one process's towers against one "
                     f"device; how its processes combine is out of this command's scope")
    if job.towers.precision != "float32":
        notes.append(f"verify: note: towers.precision is {job.towers.precision}; verify "
                     f"computes in float64 whatever it is, to check the towers, not the "
                     f"16-bit rounding")
    return notes


def _check_no_noise_left(draws: list[str]) -> None:
    if draws:
        shown = ", ".join(draws[:3]) + (f" and {len(draws) - 3} more" if len(draws) > 3 else "")
        raise NoiseLeft(
            f"the model's loss depends on random draws verify cannot set to rate 0 ({shown}), "
            f"which one device and the towers draw differently: make their rate a model "
            f"parameter and verify at 0 (--set model.<parameter>=0)")


def _hints(job: JobConfig, plan: Plan, growth: float) -> str:
    """What makes towers differ from one device by design, where it may apply, and a
    comparison too chaotic to tell."""
    hints = []
    if len(plan.devices) > 1 and job.towers.batch_norm == "local":
        hints.append("if the model has batch norm: towers.batch_norm is local, so it "
                     "normalizes by each tower's shard, one device by the whole batch; "
                     "--set towers.batch_norm=sync")
    if growth > CHAOTIC:
        hints.append(f"rounding alone grew to {growth:.0e} of the values in these steps, "
                     f"so a few noise floors are rounding too: fewer --steps")
    return f" ({'; '.join(hints)})" if hints else ""
