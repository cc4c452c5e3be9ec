"""Where each step's time goes: input wait, compute, gradient exchange and apply.

Every step's session run is timed; a sampled step (at most one every
`train.phase_sample_secs`) also asks TensorFlow for its step statistics (a software
trace: each op's start and end on every device, remote ones included), and the
op timings split that step's wall time into phases (`towers.step_phase` names each
op's). Each step's run time is divided in the shares of the latest sample, so the
totals cover every step while only the samples pay for the trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import tensorflow as tf

import towers

V1 = tf.compat.v1

PHASES = towers.STEP_PHASES
# Where two phases run at once, the step is charged to the first: waiting on input or
# peers only slows a step while no tower computes.
_PRIORITY = ("compute", "exchange", "apply", "input")
# The share of training time traced steps may cost: a large graph's trace and its
# reading (ResNet-20 on 4 towers: ~40 ms) push the next sample out until this holds.
SAMPLE_BUDGET = 0.01


def split_step(step_stats, gaps_to: str = "compute") -> dict[str, float]:
    """Shares (summing to 1) of one traced step's wall time per phase.

    step_stats: a RunMetadata's step_stats. The step's span runs from its first op's
    start to its last op's end, on any device; an instant with ops of several phases
    running counts for the first of compute, exchange, apply, input, and an instant
    with none (the executor between ops, a worker waiting for a remote peer) for
    `gaps_to`. Empty stats give {}.
    """
    charged = dict.fromkeys(PHASES, 0.0)
    for start, end, phase in phase_segments(op_intervals(step_stats), gaps_to):
        charged[phase] += end - start
    total = sum(charged.values())
    if total <= 0:
        return {}
    return {phase: charged[phase] / total for phase in PHASES}


def op_intervals(step_stats) -> list[tuple[int, int, str, str, str]]:
    """(start, end, phase, device, op name) of every op of a traced step, in
    microseconds since the epoch (every device's, remote ones too)."""
    out = []
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            # A transfer between tasks is recorded as a node named after its RPC.
            op_type = _op_type(node.timeline_label) or node.node_name
            start = node.all_start_micros
            out.append((start, start + max(node.all_end_rel_micros, 0),
                        towers.step_phase(node.node_name, op_type), device.device,
                        node.node_name))
    return out


def phase_segments(ops: list[tuple], gaps_to: str, start: int | None = None,
                   end: int | None = None) -> list[tuple[int, int, str]]:
    """The step as consecutive (start, end, phase) segments, from op_intervals' ops.

    Covers the ops' span, or [start, end] when given (a run's own start and end: the
    time before its first op and after its last counts for gaps_to).
    """
    events = [(op[0], 1, op[2]) for op in ops] + [(op[1], -1, op[2]) for op in ops]
    if start is not None:
        events.append((start, 0, gaps_to))
    if end is not None:
        events.append((end, 0, gaps_to))
    if not events:
        return []
    events.sort(key=lambda e: (e[0], -e[1]))
    low = events[0][0] if start is None else start
    high = events[-1][0] if end is None else end
    active = dict.fromkeys(PHASES, 0)
    segments: list[tuple[int, int, str]] = []
    last = low
    for when, change, phase in events:
        when = min(max(when, low), high)
        if when > last:
            running = next((p for p in _PRIORITY if active[p]), gaps_to)
            if segments and segments[-1][2] == running and segments[-1][1] == last:
                segments[-1] = (segments[-1][0], when, running)
            else:
                segments.append((last, when, running))
            last = when
        active[phase] += change
    return segments


def sample_interval(every_secs: float, cost_secs: float) -> float:
    """Seconds from one sample to the next: train.phase_sample_secs, or longer when a
    sample costs so much that sampling that often would spend over SAMPLE_BUDGET."""
    return max(every_secs, cost_secs / SAMPLE_BUDGET)


def trace_level(remote: bool) -> int:
    """The cheapest trace level that gives a step's statistics: a server's session
    (ps/worker) has its master collect them only for a full trace; an in-process
    session gives them for a software trace, which costs less."""
    return V1.RunOptions.FULL_TRACE if remote else V1.RunOptions.SOFTWARE_TRACE


def _op_type(timeline_label: str) -> str:
    """'name = Conv2D(a, b)' -> 'Conv2D'; a label that is no op ('RecvTensor', a
    transfer a remote master records) -> ''."""
    _, _, call = timeline_label.partition(" = ")
    return call.partition("(")[0]


class StepPhases:
    """Seconds per phase over this process's steps, from run times and sampled shares.

    Steps run before the first sample are charged in its shares when it arrives.
    on_seconds: called with the seconds of each step per phase (the metrics); `listen`
    adds more.
    """

    def __init__(self, on_seconds: Callable[[Mapping[str, float]], None] | None = None):
        self._listeners = [on_seconds] if on_seconds is not None else []
        self._shares: dict[str, float] | None = None
        self._pending = 0.0
        self._pending_steps = 0
        self.steps = 0  # the steps whose seconds are in total
        self.total = dict.fromkeys(PHASES, 0.0)
        self._sampled = dict.fromkeys(PHASES, 0.0)  # the steps sampled since window_text

    def add(self, run_seconds: float, shares: Mapping[str, float] | None = None) -> None:
        """One step's run time; shares when this step was sampled."""
        if shares:
            self._shares = dict(shares)
            for phase in PHASES:
                self._sampled[phase] += run_seconds * shares[phase]
        if self._shares is None:
            self._pending += run_seconds
            self._pending_steps += 1
            return
        seconds = {p: (run_seconds + self._pending) * self._shares[p] for p in PHASES}
        self.steps += 1 + self._pending_steps
        self._pending, self._pending_steps = 0.0, 0
        for phase, value in seconds.items():
            self.total[phase] += value
        for listener in self._listeners:
            listener(seconds)

    def listen(self, on_seconds: Callable[[Mapping[str, float]], None]) -> None:
        """Also call on_seconds with each step's seconds per phase."""
        self._listeners.append(on_seconds)

    def window_text(self) -> str:
        """The progress line's shares: those measured since the last call, from the steps
        sampled in that interval ('input 31% compute 52% exchange 14% apply 3%'). An
        interval without a sample (a short one, or samples spread out to keep their cost
        down) shows the run's so far and says so ('run so far: input ...'); '' before
        any sample."""
        sampled, self._sampled = self._sampled, dict.fromkeys(PHASES, 0.0)
        if any(sampled.values()):
            return shares_text(_shares(sampled))
        run = self.shares()
        return f"run so far: {shares_text(run)}" if run else ""

    def step_secs(self) -> float | None:
        """The mean seconds of a step so far; None before any sample."""
        return sum(self.total.values()) / self.steps if self.steps else None

    def shares(self) -> dict[str, float]:
        """Shares over every step so far; {} before any sample."""
        return _shares(self.total)


def _shares(seconds: Mapping[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {p: seconds[p] / total for p in PHASES} if total > 0 else {}


def shares_text(shares: Mapping[str, float]) -> str:
    """'input 31% compute 52% exchange 14% apply 3%' ('' when nothing was measured)."""
    return " ".join(f"{p} {round(100 * shares[p])}%" for p in PHASES) if shares else ""


class StepPhaseHook(V1.train.SessionRunHook):
    """Times every session run and traces one every `every_secs` (never the first, which
    builds and warms up) to keep the phase shares current, or less often when a sample
    costs more than SAMPLE_BUDGET of that: what a sample costs (its run's time over an
    untraced run's, plus reading its statistics) is measured on each.

    gaps_to: the phase an instant with no op running counts for: `exchange` in a job
    of several processes (waiting for peers), else `compute`.
    remote: the session is a server's (ps/worker): see trace_level.
    """

    def __init__(self, phases: StepPhases, every_secs: float, gaps_to: str = "compute",
                 remote: bool = False):
        self._trace = trace_level(remote)
        self._phases = phases
        self._every = every_secs
        self._gaps_to = gaps_to
        self._next_sample = 0.0
        self._runs = 0
        self._sampling = False
        self._started = 0.0
        self._untraced = 0.0  # a recent untraced run's time
        self.samples = 0
        self.traced_extra_secs = 0.0  # what tracing added to the sampled runs, all told

    def before_run(self, run_context):
        self._started = time.perf_counter()
        self._runs += 1
        self._sampling = self._runs > 1 and self._started >= self._next_sample
        if not self._sampling:
            return None
        options = V1.RunOptions(trace_level=self._trace)
        return V1.train.SessionRunArgs(None, options=options)

    def after_run(self, run_context, run_values) -> None:
        seconds = time.perf_counter() - self._started
        shares = None
        if not self._sampling:
            self._untraced = seconds
        elif run_values.run_metadata is not None:
            shares = split_step(run_values.run_metadata.step_stats, self._gaps_to)
            reading = time.perf_counter() - self._started - seconds
            extra = max(seconds - self._untraced, 0.0)
            self.samples += 1
            self.traced_extra_secs += extra
            cost = extra + reading
            self._next_sample = self._started + sample_interval(self._every, cost)
        self._phases.add(seconds, shares)
