"""Where a process's start-up goes: seconds from its exec, and its resident memory, at
each stage a towers command passes on its way to the first step.

Stages, in order (each marked where it ends):
  modules     the command line parsed and the job file loaded: Python, towers' own
              modules, YAML (before TensorFlow)
  tensorflow  TensorFlow imported, graph mode on
  plan        the job's model found, its devices and data checked
  graph       the training graph built
  session     the session ready: variables initialised or restored, the hooks begun,
              the first checkpoint written
  first_step  the first training step done (its activations, the kernels' buffers)

A training run's result carries them ("startup") with the process's peak ("peak_rss_mib");
`towers bench --startup` lays them out per stage. Marks are read from /proc (Linux);
elsewhere a mark holds what could be read (nothing, at worst).
"""

from __future__ import annotations

import os

STAGES = ("modules", "tensorflow", "plan", "graph", "session", "first_step")

_marks: dict[str, dict[str, float]] = {}


def mark(stage: str) -> None:
    """Records `stage` as ending now (a later mark of the same stage replaces it: a
    process that trains twice keeps its last run's)."""
    now: dict[str, float] = {}
    secs = seconds_since_exec()
    if secs is not None:
        now["secs"] = round(secs, 3)
    memory = memory_mib()
    if memory is not None:
        now["rss_mib"], now["peak_rss_mib"] = memory
    _marks[stage] = now


def mark_once(stage: str) -> None:
    """Records `stage` unless it is marked already (a process-wide stage that several
    paths reach)."""
    if stage not in _marks:
        mark(stage)


def marks() -> dict[str, dict[str, float]]:
    """The stages marked so far, in STAGES order."""
    return {stage: dict(_marks[stage]) for stage in STAGES if stage in _marks}


def seconds_since_exec() -> float | None:
    """Seconds since this process started (its exec), None where that is not known."""
    try:
        with open("/proc/self/stat") as f:
            # The fields after the command's name, which may hold spaces and ')': the
            # line's 22nd field, the start in clock ticks since boot, is the 20th here.
            fields = f.read().rpartition(")")[2].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def memory_mib() -> tuple[float, float] | None:
    """(resident, peak resident) MiB of this process, None where not known."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return (round(int(fields["VmRSS"].split()[0]) / 1024, 1),
                round(int(fields["VmHWM"].split()[0]) / 1024, 1))
    except (OSError, KeyError, ValueError, IndexError):
        return None
