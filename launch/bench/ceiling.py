"""Each 16-bit row's ceiling: how much faster than float32 the model's own kernels run.

A 2048x2048 matmul is the peak of big products, not of a small convolution: a model
of small convolutions that is as fast as its kernels allow showed a fifth of that
peak. So the bench also times, between its rounds like the peak, the convolutions
and matrix products the model's 1-device step runs (forward and gradients, at their
shapes: launch.kernels), each alone in float32 and in the 16-bit type. Their combined
speed-up is the most a 16-bit step can gain over float32 on this machine; a row's
"of ceiling" is its own gain over the float32 row beside it, as a share of that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from launch.bench.settings import Row, Variant
from launch.kernels import KernelTimer, float32_seconds, speedup


class Ceilings:
    """The kernels of every variant's 1-device step (`kernels`: variant -> Counter of
    kernel -> runs per step), timed alone in float32 and each 16-bit type the
    variants compute in; nothing is built when every variant is float32."""

    def __init__(self, kernels: Mapping[Variant, Counter]):
        self._kernels = dict(kernels)
        types = sorted({v.number_type for v in kernels} - {"float32"})
        every = [kernel for counts in kernels.values() for kernel in counts]
        self._timer = KernelTimer(every, ["float32", *types]) if types and every else None
        if self._timer:
            self._timer.warm_up()

    def time_block(self) -> None:
        if self._timer:
            self._timer.time_block()

    def of(self, variant: Variant) -> float | None:
        """The kernels' combined speed-up in the variant's number type; None for
        float32 variants and those whose 1-device row did not build."""
        if self._timer is None or variant.number_type == "float32":
            return None
        counts = self._kernels.get(variant)
        return speedup(counts, self._timer.timings(), variant.number_type) if counts else None

    def float32_seconds(self, variant: Variant) -> float | None:
        """Seconds the variant's kernels take in float32 per step, if timed."""
        counts = self._kernels.get(variant)
        if self._timer is None or not counts:
            return None
        return float32_seconds(counts, self._timer.timings()) or None

    def close(self) -> None:
        if self._timer:
            self._timer.close()


def fraction_of_ceiling(row: Row, rows: list[Row]) -> float | None:
    """The row's speed-up over its float32 twin (the same mode, device count and other
    axes, in float32) as a share of its ceiling; None without either."""
    if row.kernel_ceiling is None or row.median is None:
        return None
    twin = row.variant._replace(precision="float32")
    base = next((r.median for r in rows if (r.mode, r.devices, r.variant)
                 == (row.mode, row.devices, twin)), None)
    return row.median / base / row.kernel_ceiling if base else None
