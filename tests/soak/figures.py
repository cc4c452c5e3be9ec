"""The soak's figures from its summaries: schedules, faults by kind, schedules that kept
every invariant, per arrangement, as a Markdown table for docs/faults.md.

    python -m soak.figures OUT/summary.jsonl [...]
"""

from __future__ import annotations

import collections
import json
import sys

KINDS = ("kill", "term", "pause", "cut", "disk_full", "restart")


def table(lines: list[dict]) -> str:
    schedules = [s for s in lines if s["seed"] >= 0]  # not the uninterrupted references
    by = collections.defaultdict(list)
    for s in schedules:
        by[s["arrangement"]].append(s)
    rows = ["| arrangement | schedules (with a CPU hog) | faults | " + " | ".join(KINDS)
            + " | starts | every invariant held | hours |",
            "| --- | --- | --- | " + " | ".join("---" for _ in KINDS) + " | --- | --- | --- |"]
    for name in sorted(by):
        rows.append(_row(name, by[name]))
    rows.append(_row("all", schedules))
    references = [s for s in lines if s["seed"] < 0]
    failed = sum(bool(s["violations"]) for s in references)
    cpus = sorted({s.get("cpu", "?") for s in lines})
    began = min(s["began"] for s in lines) if lines else "-"
    return "\n".join(rows) + (
        f"\n\n{len(references)} uninterrupted runs (the references), {failed} failed; "
        f"from {began} UTC, on {', '.join(cpus)}.")


def _row(name: str, schedules: list[dict]) -> str:
    faults = collections.Counter()
    for s in schedules:
        faults.update(s["faults"])
    hogs = sum(s["hog"] > 0 for s in schedules)
    held = sum(not s["violations"] for s in schedules)
    hours = sum(s["secs"] for s in schedules) / 3600
    return (f"| {name} | {len(schedules)} ({hogs}) | {sum(faults.values())} | "
            + " | ".join(str(faults[k]) for k in KINDS)
            + f" | {sum(s['starts'] for s in schedules)} | {held} of {len(schedules)} | "
              f"{hours:.1f} |")


def main(paths: list[str]) -> None:
    lines = []
    for path in paths:
        with open(path) as f:
            lines += [json.loads(line) for line in f if line.strip()]
    print(table(lines))
    for s in lines:
        if s["violations"] and s["seed"] >= 0:
            print(f"\n{s['arrangement']} seed {s['seed']}: " + "; ".join(s["violations"]))


if __name__ == "__main__":
    main(sys.argv[1:])
