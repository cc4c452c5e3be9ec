"""What `towers verify` concludes: per variable, the towers' difference from one device
against its tolerance, and one line saying pass or fail.

The noise floor of a variable is how far one device lands from itself when only the
order of each batch's examples changes: the same step in exact arithmetic, so its
size is what rounding alone does to that variable over the steps, through that model.
N towers sum their examples in another order too (each its shard, then the shards), so
an honest implementation differs from one device by about the floor. A variable's
tolerance is max(rtol x max|w|, floor_factor x floor): the floor times a margin, or,
where the floor happens to be tiny, the relative rounding float64 allows after a few
steps (1e-9 by default: about 10^7 float64 ulps; float32's ulp is 1.2e-7).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

RTOL = 1e-9
FLOOR_FACTOR = 10.0


@dataclass(frozen=True)
class Row:
    """One variable: its largest |value| on one device, how far one device's steps moved
    it, the largest difference of the towers' values (each replicated copy too) from one
    device's, its noise floor and tolerance, and what the tolerance is (basis: '10 x its
    noise floor 2.1e-17'). difference is inf when the towers have no such variable."""

    name: str
    scale: float
    moved: float
    difference: float
    floor: float
    tolerance: float
    basis: str = ""

    @property
    def ok(self) -> bool:
        return self.difference <= self.tolerance

    @property
    def ratio(self) -> float:
        """difference / tolerance (inf for any difference against a tolerance of 0)."""
        if self.difference == 0:
            return 0.0
        return self.difference / self.tolerance if self.tolerance else math.inf


def rows(start: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
         towers: Mapping[str, np.ndarray], copies: Mapping[str, list[np.ndarray]],
         floor: Mapping[str, np.ndarray], rtol: float = RTOL,
         floor_factor: float = FLOOR_FACTOR) -> list[Row]:
    """A Row per variable of the one-device run, by name: start, the values both began
    from; reference, one device's after the steps; towers, the towers' (copies: each
    replicated copy's, by its variable's name); floor, one device's on the reordered
    batches."""
    out = []
    for name in sorted(reference):
        want = np.asarray(reference[name], np.float64)
        scale = _largest(want)
        moved = _largest(want - np.asarray(start[name], np.float64))
        noise = _largest(np.asarray(floor[name], np.float64) - want)
        if name in towers:
            got = [towers[name], *copies.get(name, [])]
            difference = max(_largest(np.asarray(g, np.float64) - want) for g in got)
        else:
            difference = math.inf
        if floor_factor * noise >= rtol * scale:
            basis = f"{floor_factor:g} x its noise floor {noise:.2e}"
        else:
            basis = f"{rtol:g} x its max|w| {scale:.2e}"
        tolerance = max(rtol * scale, floor_factor * noise)
        out.append(Row(name, scale, moved, difference, noise, tolerance, basis))
    return out


def _largest(values: np.ndarray) -> float:
    return float(np.max(np.abs(values))) if values.size else 0.0


def table(found: list[Row]) -> list[str]:
    """The rows as aligned text lines, a header first."""
    width = max([len("variable"), *(len(r.name) for r in found)])
    lines = [f"{'variable':<{width}}  {'max|w|':>9}  {'moved':>9}  {'difference':>10}  "
             f"{'noise floor':>11}  {'tolerance':>9}"]
    for r in found:
        mark = "" if r.ok else "  beyond"
        lines.append(f"{r.name:<{width}}  {r.scale:9.2e}  {r.moved:9.2e}  {r.difference:10.2e}  "
                     f"{r.floor:11.2e}  {r.tolerance:9.2e}{mark}")
    return lines


def rounding_growth(found: list[Row]) -> float:
    """How far rounding alone moved the model's variables in the steps: the median over
    the variables the steps moved of noise floor / largest |value|. A float64 step
    rounds to about 1e-16 of a value; a model whose steps amplify that to 1e-6 and more
    (batch norms over very few examples, a high learning rate) is chaotic over these
    steps, and a comparison of its runs shows little."""
    shares = sorted(r.floor / r.scale for r in found if r.moved and r.scale)
    return shares[len(shares) // 2] if shares else 0.0


def unmoved(found: list[Row]) -> list[str]:
    """The variables one device's steps left as they began: their agreement shows nothing."""
    return [r.name for r in found if r.moved == 0]


def worst(found: list[Row]) -> Row:
    """The variable furthest beyond (or nearest to) its tolerance."""
    return max(found, key=lambda r: (r.ratio, r.difference))


def verdict(found: list[Row], what: str, extra: list[str] = ()) -> tuple[bool, str]:
    """(passed, one line naming the worst variable). what: the comparison, e.g. '2 towers
    against one device after 5 steps'; extra: variables only the towers have."""
    if extra:
        return False, (f"fail: {what}: the towers made variables one device did not: "
                       f"{', '.join(sorted(extra))}")
    w = worst(found)
    if math.isinf(w.difference):
        return False, f"fail: {what}: the towers have no variable {w.name}"
    if w.ok:
        return True, (f"pass: {what}: every variable within its tolerance; the worst, "
                      f"{w.name}, differs by {w.difference:.2e} (tolerance "
                      f"{w.tolerance:.2e}: {w.basis})")
    beyond = sum(not r.ok for r in found)
    return False, (f"fail: {what}: {w.name} differs by {w.difference:.2e}, beyond its "
                   f"tolerance {w.tolerance:.2e} ({w.basis}); {beyond} of {len(found)} "
                   f"variables are beyond theirs")
