"""The report: the markdown table, bench.csv / bench.json / bench.png, and the facts
about the run (model, batch, machine, versions) printed above the table."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import sys

from launch import cpu_info
from launch.bench.ceiling import fraction_of_ceiling
from launch.bench.settings import MODES, SINGLE, Row, Settings


def describe_run(settings: Settings, single: dict,
                 started: datetime.datetime | None = None) -> dict:
    """What was run, where and with what. single: the graph facts of the base
    variant's 1-device row (its trainable bytes), or {}."""
    import tensorflow as tf

    started = started or datetime.datetime.now(datetime.UTC)
    return {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "towers " + " ".join(sys.argv[1:]) if sys.argv else "",
        "model": settings.model,
        "params": settings.params,
        "global_batch": settings.batch,
        "steps_per_block": settings.steps,
        "warmup_steps": settings.warmup,
        "repeats": settings.repeats,
        "variants": [v._asdict() for v in settings.variants],
        "trainable_bytes": single.get("trainable_bytes"),
        "machine": machine(),
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
    }


def heading(about: dict) -> str:
    """The line above the table and the --input report: what ran, where, when (about:
    describe_run's)."""
    return (f"model {about['model']}, global batch {about['global_batch']}, "
            f"{about['repeats']} blocks of {about['steps_per_block']} steps after "
            f"{about['warmup_steps']} warm-up steps; {about['machine']}; "
            f"TensorFlow {about['tensorflow']}; {about['date']}")


def machine() -> str:
    """'N cores (CPU model), M GiB, oneDNN on' (launch.tf_process.cpu_kernels: the same
    CPU runs a step at several speeds, by the kernels TensorFlow picks there)."""
    import psutil

    from launch.tf_process import cpu_kernels

    cpu = cpu_info.value("model name") or platform.processor() or platform.machine()
    memory = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, {cpu_kernels()}"


def gradient_bytes(mode: str, devices: int, trainable_bytes: int,
                   gradient_dtype: str = "float32") -> int:
    """Bytes of gradients that leave the device (or process) computing them, per step.

    G = trainable_bytes (dense; a sparse embedding gradient counts as dense here),
    halved when gradients travel in 16 bits (gradient_dtype).
    parameter_server and ps_worker: N * G (each tower or worker sends its gradient
    to where the variables live). replicated, mirrored, collective and horovod:
    2 (N - 1) * G, the all-reduce's traffic: each variable is summed on one device
    and copied back (replicated; MirroredStrategy's CPU all-reduce), or a ring
    all-reduce (collective ops, Horovod), both 2 (N - 1) / N * G per device. 1 device: 0.
    """
    if devices == 1 or mode == SINGLE:
        return 0
    if gradient_dtype != "float32":
        trainable_bytes //= 2
    if mode in ("parameter_server", "ps_worker"):
        return devices * trainable_bytes
    return 2 * (devices - 1) * trainable_bytes


def ratios(rows: list[Row]) -> dict[int, tuple[float | None, ...]]:
    """Row index -> (median / its variant's 1-device median, median / mirrored median at
    the same N and variant, median / the base variant's at the same mode and N)."""
    medians = {(r.mode, r.devices, r.variant): r.median for r in rows if r.median}
    base = rows[0].variant  # plan_rows puts the base variant first
    out = {}
    for i, row in enumerate(rows):
        if row.median is None:
            out[i] = (None, None, None)
            continue
        found = [medians.get(key) for key in ((SINGLE, 1, row.variant),
                                              ("mirrored", row.devices, row.variant),
                                              (row.mode, row.devices, base))]
        out[i] = tuple(row.median / f if f else None for f in found)
    return out


def achieved(row: Row, peaks: dict[str, float | None]) -> tuple[float | None, float | None]:
    """(FLOP/s the row's median reaches, that as a fraction of its number type's peak)."""
    if row.median is None or row.flops_per_example is None:
        return None, None
    flops = row.median * row.flops_per_example
    peak = peaks.get(row.variant.number_type)
    return flops, flops / peak if peak else None


def records(rows: list[Row], peaks: dict[str, float | None] | None = None) -> list[dict]:
    """One flat dict per row, as written to the CSV and JSON files. peaks: FLOP/s of
    each number type's peak matmul."""
    table = []
    every_ratio = ratios(rows)
    for i, row in enumerate(rows):
        to_single, to_mirrored, to_base = every_ratio[i]
        flops, of_peak = achieved(row, peaks or {})
        table.append({
            "mode": row.mode,
            "devices": row.devices,
            "variant": row.variant.label,
            **{f"variant_{k}": v for k, v in row.variant._asdict().items()},
            "examples_per_sec_median": row.median,
            "examples_per_sec_min": min(row.rates) if row.rates else None,
            "examples_per_sec_max": max(row.rates) if row.rates else None,
            "ratio_to_1_device": to_single,
            "ratio_to_mirrored": to_mirrored,
            "ratio_to_base_variant": to_base,
            "flops_per_example": row.flops_per_example,
            "flops_per_sec": flops,
            "fraction_of_peak": of_peak,
            "kernel_ceiling": row.kernel_ceiling,
            "fraction_of_ceiling": fraction_of_ceiling(row, rows),
            "peak_rss_bytes": row.peak_rss_bytes,
            "gradient_bytes_per_step": row.gradient_bytes,
            "blocks": len(row.rates),
            "skipped": row.skipped,
        })
    return table


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def mib(value) -> str:
    """Bytes as MiB for a table cell; empty if unknown."""
    return "" if value is None else f"{value / 2**20:.1f}"


COLUMNS = ("mode", "devices", "variant", "examples/sec median", "min", "max",
           "ratio to 1 device", "ratio to mirrored", "ratio to base variant", "MFLOP/example",
           "GFLOP/s", "of peak", "kernel ceiling", "of ceiling", "peak RSS MiB",
           "gradient MiB/step")


def markdown_table(rows: list[Row], peaks: dict[str, float | None] | None = None) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for record in records(rows, peaks):
        first = f"| {record['mode']} | {record['devices']} | {record['variant']} "
        if record["skipped"]:
            reason = record["skipped"].splitlines()[0].replace("|", "/")
            label = reason if reason.startswith("failed:") else f"skipped: {reason}"
            lines.append(f"{first}| {label} |" + " |" * (len(COLUMNS) - 4))
            continue
        cells = [
            _fmt(record["examples_per_sec_median"], ".0f"),
            _fmt(record["examples_per_sec_min"], ".0f"),
            _fmt(record["examples_per_sec_max"], ".0f"),
            _fmt(record["ratio_to_1_device"], ".3f"),
            _fmt(record["ratio_to_mirrored"], ".3f"),
            _fmt(record["ratio_to_base_variant"], ".3f"),
            _scaled(record["flops_per_example"], 1e6, ".3g"),
            _scaled(record["flops_per_sec"], 1e9, ".2f"),
            _fmt(record["fraction_of_peak"], ".1%"),
            _fmt(record["kernel_ceiling"], ".2f"),
            _fmt(record["fraction_of_ceiling"], ".1%"),
            mib(record["peak_rss_bytes"]),
            mib(record["gradient_bytes_per_step"]),
        ]
        lines.append(first + "".join(f"| {c} " for c in cells) + "|")
    return "\n".join(lines)


def _scaled(value, unit: float, spec: str) -> str:
    return "" if value is None else format(value / unit, spec)


def peak_text(about: dict) -> str:
    """The peak matmuls and what they say about this CPU's 16-bit arithmetic, in words."""
    peaks = ", ".join(f"{t} {f / 1e9:.1f} GFLOP/s" for t, f in about["peak_flops"].items() if f)
    notes = "".join(f"; {t}: {note}" for t, note in about["number_types"].items())
    share = about.get("kernel_share")
    kernels = (f"\nthe model's convolutions and matrix products, timed alone, take "
               f"{share:.0%} of its float32 step on 1 device; a 16-bit row's kernel ceiling "
               "is how much faster they run in its type" if share else "")
    return (f"peak ({about['peak_matmul']}x{about['peak_matmul']} matmul, median): "
            f"{peaks}{notes}{kernels}")


def write_outputs(out: str, rows: list[Row], about: dict) -> list[str]:
    """bench.csv, bench.json and bench.png in `out`; returns their paths."""
    os.makedirs(out, exist_ok=True)
    table = records(rows, about.get("peak_flops"))
    paths = [os.path.join(out, name) for name in ("bench.csv", "bench.json", "bench.png")]
    with open(paths[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    with open(paths[1], "w") as f:
        samples = [{"mode": r.mode, "devices": r.devices, "variant": r.variant.label,
                    "examples_per_sec": r.rates} for r in rows]
        json.dump({"run": about, "rows": table, "blocks": samples}, f, indent=2)
        f.write("\n")
    plot(rows, about, paths[2])
    return paths


def plot(rows: list[Row], about: dict, path: str) -> None:
    """examples/sec against device count, one line per mode (and variant, when there are
    several), min-max bars."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.4, 4.2), dpi=100)
    variants = list(dict.fromkeys(r.variant for r in rows))

    def spread(points: list[Row]) -> list[list[float]]:
        return [[r.median - min(r.rates) for r in points],
                [max(r.rates) - r.median for r in points]]

    for variant in variants:
        suffix = f" ({variant.label})" if len(variants) > 1 else ""
        base = next(r for r in rows if r.mode == SINGLE and r.variant == variant)
        for mode in [m for m in MODES if any(r.mode == m and r.rates for r in rows)]:
            points = [r for r in rows if r.mode == mode and r.variant == variant and r.rates]
            if not points or not base.rates:
                continue
            line, = axes.plot([1] + [r.devices for r in points],
                              [base.median] + [r.median for r in points], marker="o",
                              label=mode + suffix)
            axes.errorbar([r.devices for r in points], [r.median for r in points],
                          yerr=spread(points), fmt="none", capsize=3, color=line.get_color())
        if base.rates:
            axes.errorbar([1], [base.median], yerr=spread([base]), fmt="o", capsize=3,
                          color="black", label=SINGLE if variant == variants[0] else None,
                          zorder=3)
    axes.set_xlabel("devices (towers, replicas, workers or ranks)")
    axes.set_ylabel("examples/sec (median, min-max)")
    axes.set_xticks(sorted({r.devices for r in rows}))
    axes.set_ylim(bottom=0)
    axes.set_title(f"{about['model']}, global batch {about['global_batch']}, "
                   f"{about['machine'].split(' (')[0]}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
