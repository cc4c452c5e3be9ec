"""`towers tune`'s measurements: each stage's candidates timed side by side with the
settings chosen so far, and kept only when clearly faster.

Every candidate is the job's own training step (launch.bench.job_case: its model,
input and devices, with the candidate's --set overrides) in a case process of its own,
built two at a time; the blocks of a stage are interleaved (incumbent, candidate 1,
candidate 2, incumbent ...), so a change in the machine's load falls on all alike.
A candidate replaces the incumbent when its median is at least MARGIN faster: smaller
differences are the noise of a shared machine, and the job as written is the safer
choice. The incumbent's process lives on from stage to stage.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from launch.bench.case_process import CaseProcess, start_in_turns
from launch.bench.settings import BUILDS_AT_ONCE
from launch.errors import BadInput
from launch.tune.choices import Settings, Stage, for_memory, label, overrides

MARGIN = 0.03  # a candidate must be this much faster than the incumbent to replace it


class TuneError(BadInput):
    """The job's own step cannot be measured here (it fails to build or to run)."""


@dataclass(frozen=True)
class TuneSettings:
    """What to measure: the job file (None: the built-in job) and its --set overrides;
    steps per timed block, blocks per stage, warm-up steps; how long a case may take
    to answer; the time the whole search may take (seconds); whether the number types
    may change (--allow-precision)."""

    config: str | None
    job_overrides: tuple[str, ...]
    steps: int
    repeats: int
    warmup: int
    timeout: float
    budget: float
    allow_precision: bool = False


@dataclass
class Measured:
    """One line of the table: a stage's candidate (change {}: the settings so far),
    its examples/sec median and its ratio to the incumbent's in the same blocks, or why
    it was not measured."""

    stage: str
    change: Settings
    rate: float | None = None
    ratio: float | None = None
    failed: str | None = None
    chosen: bool = False


@dataclass
class Outcome:
    """The settings chosen (job keys that differ from the job), the table, and a note
    per stage (what was chosen and why, or why it was not tried)."""

    chosen: Settings = field(default_factory=dict)
    table: list[Measured] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


class Search:
    """The search over `stages_of(facts)` (facts: the job's step's, from its case)."""

    def __init__(self, settings: TuneSettings, write: Callable[[str], None]):
        self.settings = settings
        self.write = write
        self.outcome = Outcome()
        self._started = time.monotonic()
        self._build_seconds = 0.0
        self._block_seconds = 0.0

    def run(self, stages_of: Callable[[dict], list[Stage]]) -> Outcome:
        incumbent = self._first_case()
        try:
            for stage in stages_of(incumbent.facts):
                incumbent = self._stage(stage, incumbent)
        finally:
            incumbent.close()
        return self.outcome

    def _first_case(self) -> CaseProcess:
        """The job as written, or, if its step does not fit in memory, with the fewest
        micro-batches that do (the stage "micro-batches for memory")."""
        started = time.monotonic()
        ready, failed = start_in_turns({0: self._spec({})}, self.settings.timeout, 1)
        self._build_seconds = time.monotonic() - started
        if ready:
            return self._timed_first(ready[0])
        reason = failed[0]
        if "ResourceExhausted" not in reason and "out of memory" not in reason.lower():
            raise TuneError(f"the job's step failed here: {reason}")
        self.write(f"the job's step does not fit in memory ({reason}); trying more "
                   "micro-batches")
        from launch.config import load_job

        job = load_job(self.settings.config, self.settings.job_overrides)
        for candidate in for_memory(job, 1):
            ready, failed = start_in_turns({0: self._spec(candidate)}, self.settings.timeout, 1)
            self.outcome.table.append(Measured("micro-batches for memory", candidate,
                                               failed=failed.get(0)))
            if ready:
                self.outcome.chosen.update(candidate)
                self.outcome.table[-1].chosen = True
                self.outcome.notes["micro-batches for memory"] = (
                    f"{label(candidate)}: the fewest micro-batches whose step fits")
                return self._timed_first(ready[0])
        raise TuneError(f"the job's step does not fit in memory here, whatever the "
                        f"micro-batches ({reason}); lower train.batch_size")

    def _timed_first(self, case: CaseProcess) -> CaseProcess:
        """Times one block of the first case, for the stages' time estimates."""
        start = time.monotonic()
        case.time_block(self.settings.steps)
        self._block_seconds = time.monotonic() - start
        return case

    def _stage(self, stage: Stage, incumbent: CaseProcess) -> CaseProcess:
        """Runs one stage; returns the incumbent after it (a candidate that won)."""
        if stage.not_tried or not stage.candidates:
            self.outcome.notes[stage.name] = f"not tried: {stage.not_tried or 'no other value'}"
            return incumbent
        estimate = self._estimate(len(stage.candidates))
        left = self.settings.budget - (time.monotonic() - self._started)
        if estimate > left:
            self.outcome.notes[stage.name] = (f"not tried: about {estimate:.0f} s, more than "
                                              f"the {max(left, 0):.0f} s left of --budget")
            return incumbent
        self.write(f"{stage.name}: {len(stage.candidates)} candidate(s) against "
                   f"{label(self.outcome.chosen)}")
        specs = {i: self._spec({**self.outcome.chosen, **c})
                 for i, c in enumerate(stage.candidates)}
        ready, failed = start_in_turns(specs, self.settings.timeout, BUILDS_AT_ONCE)
        rates = self._interleave({-1: incumbent, **ready})
        return self._decide(stage, incumbent, ready, failed, rates)

    def _estimate(self, candidates: int) -> float:
        builds = math.ceil(candidates / BUILDS_AT_ONCE) * self._build_seconds
        return builds + self.settings.repeats * (candidates + 1) * self._block_seconds

    def _interleave(self, cases: dict[int, CaseProcess]) -> dict[int, list[float] | str]:
        """Blocks of every case in turn; each case's examples/sec, or why it stopped."""
        rates: dict[int, list[float] | str] = {i: [] for i in cases}
        for _ in range(self.settings.repeats):
            for i, case in cases.items():
                if isinstance(rates[i], str):
                    continue
                try:
                    seconds = case.time_block(self.settings.steps)
                except RuntimeError as err:
                    if i == -1:
                        raise TuneError(f"the settings so far stopped answering: {err}") from None
                    rates[i] = str(err)
                    continue
                rates[i].append(case.facts["examples_per_step"] * self.settings.steps / seconds)
        return rates

    def _decide(self, stage: Stage, incumbent: CaseProcess, ready: dict, failed: dict,
                rates: dict) -> CaseProcess:
        base = statistics.median(rates[-1])
        medians = {i: statistics.median(r) for i, r in rates.items()
                   if i != -1 and isinstance(r, list) and r}
        best = max(medians, key=medians.get, default=None)
        won = best is not None and medians[best] >= (1 + MARGIN) * base
        table = self.outcome.table
        table.append(Measured(stage.name, {}, base, 1.0, chosen=not won))
        for i, change in enumerate(stage.candidates):
            why = failed.get(i) or (rates[i] if isinstance(rates.get(i), str) else None)
            table.append(Measured(stage.name, change, medians.get(i),
                                  medians[i] / base if i in medians else None, why,
                                  chosen=won and i == best))
        for i, case in ready.items():
            if isinstance(rates.get(i), str):
                case.kill()  # it stopped answering: it would not read a stop
            elif not (won and i == best):
                case.close()
        if not won:
            self.outcome.notes[stage.name] = _kept(stage, medians, base)
            return incumbent
        incumbent.close()
        self.outcome.chosen.update(stage.candidates[best])
        self.outcome.notes[stage.name] = (f"{label(stage.candidates[best])}: "
                                          f"{medians[best] / base:.2f}x the settings before")
        return ready[best]

    def _spec(self, settings: Settings) -> dict:
        return {"mode": "job", "devices": "the job's", "config": self.settings.config,
                "overrides": [*self.settings.job_overrides, *overrides(settings)],
                "warmup": self.settings.warmup}


def _kept(stage: Stage, medians: dict[int, float], base: float) -> str:
    if not medians:
        return "kept: no candidate ran"
    best = max(medians.values()) / base
    return (f"kept: the best candidate ran {_times(best)}, less than {1 + MARGIN:.2f}x "
            "(within a shared machine's noise)" if best >= 1 else
            f"kept: every candidate was slower (best {_times(best)})")


def _times(ratio: float) -> str:
    """'0.97x'; a ratio that two decimals would round to 1.00 keeps a third ('0.999x'),
    so a slower candidate never reads as 'best 1.00x'."""
    shown = f"{ratio:.2f}"
    return f"{ratio:.3f}x" if shown == "1.00" and ratio != 1 else f"{shown}x"
