"""The tuned job file: the user's job with the chosen settings, headed by what was
measured and why each setting is what it is, as YAML comments."""

from __future__ import annotations

import os
import textwrap

from launch.config import dump_yaml, raw_job
from launch.tune.choices import label, overrides
from launch.tune.search import MARGIN, Outcome, TuneSettings


def default_path(config: str | None) -> str:
    """Beside the job file, so its model code is found as the job's was: job.tuned.yaml
    (tuned.yaml in this directory for the built-in job)."""
    if config is None:
        return "tuned.yaml"
    stem, _ = os.path.splitext(config)
    return f"{stem}.tuned.yaml"


def table(outcome: Outcome) -> list[str]:
    """The measurements as markdown table lines."""
    lines = ["| stage | setting | examples/sec | vs. settings before | |",
             "| --- | --- | --- | --- | --- |"]
    for row in outcome.table:
        setting = label(row.change) if row.change else "the settings before"
        rate = f"{row.rate:.1f}" if row.rate is not None else ""
        ratio = f"{row.ratio:.3f}" if row.ratio is not None else ""
        mark = "chosen" if row.chosen else (f"failed: {row.failed}" if row.failed else "")
        lines.append(f"| {row.stage} | {setting} | {rate} | {ratio} | {mark} |")
    return lines


def tuned_text(settings: TuneSettings, outcome: Outcome, machine: str, date: str) -> str:
    """The tuned job file's text: comments, then the job (the file's keys with the
    overrides and the chosen settings applied; YAML comments of the original are not
    kept)."""
    source = settings.config or "the built-in job"
    with_flags = "".join(f" --set {o}" for o in settings.job_overrides)
    header = [
        f"Written by `towers tune` from {source}{with_flags} on {date}, on {machine}.",
        "Each stage timed its candidates side by side with the settings chosen before it "
        f"({settings.repeats} interleaved blocks of {settings.steps} steps, medians of this "
        f"process's examples/sec, input included); a candidate was kept only when at least "
        f"{MARGIN:.0%} faster. The original's comments are not carried over.",
        "",
        *table(outcome),
        "",
        "Why each setting is what it is:",
        *[f"  {stage}: {note}" for stage, note in outcome.notes.items()],
        "",
        f"Changed: {label(outcome.chosen) if outcome.chosen else 'nothing'}",
    ]
    job = raw_job(settings.config, [*settings.job_overrides, *overrides(outcome.chosen)])
    lines = [wrapped for line in header
             for wrapped in (textwrap.wrap(line, 86, subsequent_indent="    ")
                             if not line.startswith("|") else [line]) or [""]]
    return "".join(f"# {line}\n" if line else "#\n" for line in lines) + dump_yaml(job)
