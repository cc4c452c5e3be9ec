"""This CPU as /proc/cpuinfo describes it, read in one place for every part that asks:
the advice's bfloat16 flags (launch.devices), the kernel timings' machine key
(launch.kernels.probe) and the CPU named beside a figure (launch.bench.report)."""

from __future__ import annotations

import platform

CPUINFO = "/proc/cpuinfo"


def lines(*fields: str) -> list[str]:
    """The lines of /proc/cpuinfo giving one of `fields` ('flags', 'model name'), as
    written, in file order (a line per core); [] where it cannot be read (not Linux)."""
    try:
        with open(CPUINFO) as info:
            return [line for line in info if line.split(":", 1)[0].strip() in fields]
    except OSError:
        return []


def value(field: str) -> str | None:
    """The first core's `field` ('model name'), None where /proc/cpuinfo has none."""
    found = lines(field)
    return found[0].split(":", 1)[1].strip() if found else None


def flags() -> set[str]:
    """This CPU's flags (the first core's; none where they cannot be read)."""
    return set((value("flags") or "").split())


def identity() -> str:
    """The CPU's model names and flags, every distinct line once (what decides which
    kernels it runs fast); the processor's name where there is no /proc/cpuinfo."""
    found = lines("model name", "flags")
    return "".join(sorted(set(found))) if found else (platform.processor() or platform.machine())
