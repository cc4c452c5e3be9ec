"""The start-up probe: does this machine run the model's kernels faster in 16 bits?

Whether a 16-bit type pays off is a fact about this CPU, this TensorFlow and these
shapes, and CPU flags do not tell it: on a Xeon with avx512_fp16 a float16
convolution ran forward at 0.69x float32 and its gradient at 0.005x. So before a
16-bit job on CPU towers trains, its kernels (launch.kernels.found) are timed alone
in the job's type and in float32, a few runs each, within PROBE_SECONDS, and a job
whose kernels run slower in 16 bits is told so, with the measured ratios.

Timings are cached per machine (its CPU model and flags), TensorFlow version and the
kernels TensorFlow runs there (launch.tf_process.cpu_kernels: oneDNN on or off, and
oneDNN's own settings), one JSON file of {kernel: {number type: seconds}} under the
cache directory, so a kernel is timed once per machine and kernels. The kernels matter:
on one Xeon the default job's kernels ran in bfloat16 at 0.38x float32 with oneDNN and
at 0.094x without. The processes of one job start together: they take the file's lock
in turn, and each times only what the ones before it have not.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import NamedTuple

from launch import cache, cpu_info
from launch.kernels.found import FORWARD, GRADIENT, Kernel
from launch.kernels.timing import KernelTimer, Timings, speedup

PROBE_SECONDS = 10.0  # the probe's time limit; the heaviest kernels are timed first
PROBE_BLOCKS = 3  # timed runs of each kernel in each type (after one untimed)
SLOWER = 1.0  # a 16-bit type whose kernels combine below this is slower: warn


class Probe(NamedTuple):
    """What the probe measured for one 16-bit number type against float32, each
    figure the kernels' combined speed-up (launch.kernels.timing.speedup; below 1:
    slower than float32), None where nothing was timed.

    overall: every kernel; forward and gradient: those of each part of the step.
    timed: how many of the model's distinct kernels were timed (the rest did not fit
    in the time limit); cache: the file holding the timings, or None."""

    number_type: str
    overall: float | None
    forward: float | None
    gradient: float | None
    timed: int
    kernels: int
    cache: str | None


def probe(counts: Mapping[Kernel, int], number_type: str,
          seconds: float = PROBE_SECONDS, cache_dir: str | None = None) -> Probe:
    """Times the kernels of `counts` (kernel -> runs per step) not in the cache, in
    `number_type` and float32, and returns what all their timings say."""
    path = cache_file(cache_dir)
    wanted = ("float32", number_type)
    with cache.locked(path):
        timings = cache.read_json(path)
        missing = [k for k in _heaviest_first(counts)
                   if not all(t in timings.get(k.key, {}) for t in wanted)]
        if missing:
            for key, measured in _time(missing, wanted, seconds).items():
                timings.setdefault(key, {}).update(measured)
            path = cache.write_json(path, timings)
    return _found(counts, timings, number_type, path)


def cached(counts: Mapping[Kernel, int], number_type: str,
           cache_dir: str | None = None) -> Probe:
    """What this machine's cache already holds for the kernels of `counts` in
    `number_type` against float32, timing nothing (overall None: none of them timed).
    No lock: a write replaces the file whole, and a read makes nothing."""
    path = cache_file(cache_dir)
    return _found(counts, cache.read_json(path), number_type, path)


def _found(counts: Mapping[Kernel, int], timings: Timings, number_type: str,
           path: str | None) -> Probe:
    wanted = ("float32", number_type)
    return Probe(number_type, speedup(counts, timings, number_type),
                 speedup(counts, timings, number_type, FORWARD),
                 speedup(counts, timings, number_type, GRADIENT),
                 sum(all(t in timings.get(k.key, {}) for t in wanted) for k in counts),
                 len(counts), path)


def _heaviest_first(counts: Mapping[Kernel, int]) -> list[Kernel]:
    """The kernels by the work a step gives them (runs x FLOPs), most first."""
    return sorted(counts, key=lambda kernel: counts[kernel] * kernel.flops, reverse=True)


def _time(kernels: list[Kernel], number_types: tuple[str, ...], seconds: float) -> Timings:
    """Up to PROBE_BLOCKS timed runs of each kernel in each type, within `seconds`."""
    deadline = time.monotonic() + seconds
    timer = KernelTimer(kernels, number_types)
    try:
        if timer.warm_up(deadline):
            for _ in range(PROBE_BLOCKS):
                if not timer.time_block(deadline):
                    break
        return timer.timings()
    finally:
        timer.close()


def cache_file(cache_dir: str | None = None) -> str:
    """This machine's and TensorFlow's timing file: under `cache_dir`, else
    launch.cache's directory ($TOWERS_CACHE_DIR, ~/.cache/towers)."""
    import tensorflow as tf

    from launch.tf_process import cpu_kernels

    base = cache.cache_dir(cache_dir)
    machine = hashlib.sha256((cpu_info.identity() + cpu_kernels()).encode()).hexdigest()[:16]
    return os.path.join(base, f"kernels-tf{tf.__version__}-{machine}.json")


def precision_note(precision: str, found: Probe) -> str | None:
    """The start-up line for a job computing in `precision` (towers.precision) whose
    kernels measured `found`: None unless they run slower than in float32."""
    if found.overall is None or found.overall >= SLOWER:
        return None
    parts = ", ".join(f"{name} {value:.2g}x" for name, value in
                      (("forward", found.forward), ("gradients", found.gradient))
                      if value is not None)
    partial = (f", {found.timed} of its {found.kernels} kernels timed"
               if found.timed < found.kernels else "")
    return (f"{precision}: on this machine the model's convolutions and matrix products "
            f"ran at {found.overall:.2g}x their float32 speed ({parts}; timed alone at "
            f"start-up{partial}), so steps will likely be slower than in float32; "
            f"`towers bench --quick --towers 1 --precision float32,{precision}` (with this "
            f"job's -c) compares whole steps")
