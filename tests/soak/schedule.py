"""Seeded random fault schedules: what happens to one job's tasks, and when.

A schedule is drawn from a seed alone (`draw`), so `make soak SEED=...` replays it, and
prints as JSON (`Schedule.text`) for a failure's report or a regression test.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

from soak.jobs import ARRANGEMENTS, Arrangement

# Kinds of fault and how often each is drawn.
KINDS = {
    "kill": 3,  # SIGKILL
    "term": 3,  # SIGTERM (a preempted node, a deleted pod)
    "pause": 2,  # SIGSTOP, then SIGCONT after `secs`
    "cut": 2,  # the targets' links down for `secs` (tasks on test hosts)
    "disk_full": 1,  # the checkpoint directory's file system full for `secs`
    "restart": 2,  # every task stopped (SIGTERM), the newest checkpoint damaged or not,
                   # and the job started again at `size`
}


@dataclass(frozen=True)
class Fault:
    """at: seconds after the job's first step. targets: task names (kill, term, pause,
    cut). secs: how long a pause, cut or full disk lasts. damage: what a restart does
    to the newest checkpoint while every task is down (None, "truncate", "delete").
    size: the workers, towers or ranks a restart starts the job with."""

    at: float
    kind: str
    targets: tuple[str, ...] = ()
    secs: float = 0.0
    damage: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class Schedule:
    seed: int
    arrangement: str
    ends_with_data: bool
    hog: int  # CPU-bound processes beside the job, for all of it
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    @property
    def text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        raw = json.loads(text)
        faults = tuple(Fault(**{**f, "targets": tuple(f["targets"])}) for f in raw["faults"])
        return cls(**{**raw, "faults": faults})


def task_names(arrangement: Arrangement, size: int) -> list[str]:
    """The tasks a schedule's faults can target at this size."""
    if arrangement.kind == "one":
        return ["one"]
    if arrangement.kind == "horovod":
        return [f"rank{r}" for r in range(size)]
    workers = [f"worker{i}" for i in range(size)]
    return (["ps0"] if arrangement.kind == "ps" else []) + workers


def draw(seed: int, arrangement_name: str, window_secs: float,
         hog: int | None = None) -> Schedule:
    """The schedule of `seed` for an arrangement whose uninterrupted run trains for
    about `window_secs`: 2 to 6 faults spread over it (some together), each of a kind
    the arrangement can take."""
    rng = random.Random(f"{arrangement_name}:{seed}")
    arrangement = ARRANGEMENTS[arrangement_name]
    kinds = {k: w for k, w in KINDS.items() if k != "cut" or arrangement.hosts}
    if arrangement.kind == "horovod":
        kinds.pop("term")  # a rank alone: horovodrun stops the job; see "restart"
    faults = []
    size = arrangement.size
    at = 0.0
    for _ in range(rng.randint(2, 6)):
        # Now and then at once with the last (several faults together), else later.
        at = at if faults and rng.random() < 0.25 else at + rng.uniform(0.0, window_secs / 2)
        kind = rng.choices(list(kinds), list(kinds.values()))[0]
        fault = _fault(rng, arrangement, kind, round(at, 2), size)
        size = fault.size or size
        faults.append(fault)
    drawn = 1 if rng.random() < 0.3 else 0
    hog = drawn if hog is None else hog
    ends_with_data = arrangement.name == "async" or rng.random() < 0.5
    return Schedule(seed, arrangement_name, ends_with_data, hog, tuple(faults))


def _fault(rng: random.Random, arrangement: Arrangement, kind: str, at: float,
           size: int) -> Fault:
    names = task_names(arrangement, size)
    several = rng.random() < 0.3
    targets = tuple(sorted(rng.sample(names, rng.randint(1, len(names)) if several else 1)))
    if kind in ("kill", "term"):
        return Fault(at, kind, targets)
    if kind == "pause":
        return Fault(at, kind, targets, round(rng.choice([rng.uniform(0.5, 5),
                                                          rng.uniform(5, 25)]), 2))
    if kind == "cut":
        return Fault(at, kind, targets, round(rng.choice([rng.uniform(0.5, 4),
                                                          rng.uniform(4, 30)]), 2))
    if kind == "disk_full":
        return Fault(at, kind, (), round(rng.uniform(1, 15), 2))
    damage = rng.choice([None, None, "truncate", "delete"])
    resized = rng.random() < 0.5
    new_size = (arrangement.resize if size == arrangement.size else arrangement.size) \
        if resized else size
    return Fault(at, "restart", (), 0.0, damage, new_size)
