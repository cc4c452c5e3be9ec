"""train.timeline: a Chrome trace-event JSON file (Perfetto, chrome://tracing) of a
window of steps, and `towers timeline merge`, which joins the files of a job's tasks.

Each traced step gives three kinds of rows in its process: `steps` (each session run,
timed by the hook), `phases` (the run cut into input, compute, exchange and apply, as
step_phases splits it; the segments add up to the run's time) and one row per device
(each op, coloured by its phase). Timestamps are microseconds since the epoch, as
TensorFlow's step statistics give them, so the files of tasks on one host (or on hosts
with synchronised clocks) share one time axis when merged.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence

import tensorflow as tf

from launch.runtime.step_phases import op_intervals, phase_segments, trace_level

V1 = tf.compat.v1

STEPS_ROW, PHASES_ROW = 0, 1


def timeline_path(path: str, label: str) -> str:
    """Each process of a job of several writes its own file: 'tl.json' -> 'tl.worker1.json'."""
    if not label:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{label}{ext or '.json'}"


class TimelineHook(V1.train.SessionRunHook):
    """Traces this process's session runs first..last (counted from 1) and writes them.

    remote: a server's session (see step_phases.trace_level).
    gaps_to: what a time with no op running counts as (see step_phases.split_step).
    """

    def __init__(self, path: str, steps: Sequence[int], label: str, gaps_to: str,
                 remote: bool, write: Callable[[str], None]):
        self._path, self._label, self._gaps_to, self._write = path, label, gaps_to, write
        self._first, self._last = steps
        self._trace = trace_level(remote)
        self._runs = 0
        self._started = 0.0
        self._events: list[dict] = []
        self._rows = {"steps": STEPS_ROW, "phases": PHASES_ROW}
        self._written = False

    def before_run(self, run_context):
        self._runs += 1
        self._started = time.time()
        if not self._first <= self._runs <= self._last:
            return None
        return V1.train.SessionRunArgs(None, options=V1.RunOptions(trace_level=self._trace))

    def after_run(self, run_context, run_values) -> None:
        if not self._first <= self._runs <= self._last or run_values.run_metadata is None:
            return
        start, end = int(self._started * 1e6), int(time.time() * 1e6)
        self._add_step(start, end, run_values.run_metadata.step_stats)
        if self._runs == self._last:
            self._save()

    def end(self, session) -> None:
        if self._events and not self._written:
            self._save()  # the run ended inside the window

    def _add_step(self, start: int, end: int, step_stats) -> None:
        ops = op_intervals(step_stats)
        self._event(f"step {self._runs}", "step", start, end, STEPS_ROW)
        for begin, finish, phase in phase_segments(ops, self._gaps_to, start, end):
            self._event(phase, phase, begin, finish, PHASES_ROW)
        for begin, finish, phase, device, name in ops:
            row = self._rows.setdefault(_short(device), len(self._rows))
            self._event(name, phase, begin, finish, row)

    def _event(self, name: str, category: str, start: int, end: int, row: int) -> None:
        self._events.append({"name": name, "cat": category, "ph": "X", "ts": start,
                             "dur": max(end - start, 0), "pid": os.getpid(), "tid": row})

    def _save(self) -> None:
        pid = os.getpid()
        names = [{"ph": "M", "pid": pid, "name": "process_name",
                  "args": {"name": self._label or "train"}}]
        names += [{"ph": "M", "pid": pid, "tid": row, "name": "thread_name",
                   "args": {"name": name}} for name, row in self._rows.items()]
        names += [{"ph": "M", "pid": pid, "tid": row, "name": "thread_sort_index",
                   "args": {"sort_index": row}} for row in self._rows.values()]
        with open(self._path, "w") as f:
            json.dump({"traceEvents": names + self._events, "displayTimeUnit": "ms"}, f)
        self._written = True
        self._write(f"timeline of steps {self._first}-{min(self._runs, self._last)} "
                    f"written to {self._path}")


def _short(device: str) -> str:
    """'/job:worker/replica:0/task:1/device:CPU:0' -> 'worker1 CPU:0'."""
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    where = f"{parts['job']}{parts.get('task', '')} " if "job" in parts else ""
    return where + parts.get("device", device)


def merge(inputs: Sequence[str], out: str) -> int:
    """Join the timelines of a job's tasks into one file; returns the events written.

    Each input keeps its rows under a process of its own (numbered in the order given,
    so two hosts' equal process ids cannot collide), named as it was.
    """
    events = []
    for number, path in enumerate(inputs, start=1):
        with open(path) as f:
            for event in json.load(f)["traceEvents"]:
                events.append({**event, "pid": number})
        events.append({"ph": "M", "pid": number, "name": "process_sort_index",
                       "args": {"sort_index": number}})
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return len(events)
