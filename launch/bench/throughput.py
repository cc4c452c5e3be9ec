"""The main report of `towers bench`: every mode at each device count, in every variant.

The in-process rows (1 device, parameter_server, replicated, mirrored) run in one
long-lived case process per row, which builds its graph once and times a block of
steps when asked, so the blocks can be interleaved across rows (A B C A B C ...) and
each row's peak RSS is its own. The multi-process rows (ps_worker, horovod) time whole
`towers` runs, one per block. A peak matmul per number type the variants compute in
is timed between the rounds, for each row's share of this machine's peak FLOP/s.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

from launch.bench.case_process import CaseProcess, case_spec, start_in_turns
from launch.bench.ceiling import Ceilings
from launch.bench.limits import PEAK_SIZE, Peak, number_type_notes
from launch.bench.mirrored import UNSUPPORTED
from launch.bench.report import (
    describe_run,
    gradient_bytes,
    heading,
    markdown_table,
    peak_text,
    write_outputs,
)
from launch.bench.runs import ClusterCase, horovod_missing
from launch.bench.settings import (
    BUILDS_AT_ONCE,
    IN_PROCESS_MODES,
    PROFILE_STEPS,
    SINGLE,
    Row,
    Settings,
    check_settings,
)


def plan_rows(settings: Settings) -> list[Row]:
    """The 1-device baseline, then every mode at each device count above 1; each in
    every variant, the variants of one mode and count side by side."""
    kinds = [(SINGLE, 1)] + [(mode, n) for n in settings.towers if n > 1
                             for mode in settings.modes]
    return [Row(mode, n, variant) for mode, n in kinds for variant in settings.variants]


def run_bench(settings: Settings, write: Callable[[str], None]) -> tuple[list[Row], dict]:
    """Measure every row; returns the rows and facts about the run (model, machine ...).
    A row that fails or stops answering is reported as such; the others are measured."""
    check_settings(settings)
    started = datetime.datetime.now(datetime.UTC)
    rows = plan_rows(settings)
    cases: dict[int, CaseProcess | ClusterCase] = {}
    peaks: dict[str, Peak] = {}
    ceilings = None
    try:
        facts = _start_cases(settings, rows, cases, peaks, write)
        ceilings = Ceilings({v: f["kernels"] for (mode, v), f in facts.items()
                             if mode == SINGLE and "kernels" in f})
        runs = settings.repeats if settings.run_repeats is None else settings.run_repeats
        for repeat in range(settings.repeats):
            write(f"round {repeat + 1}/{settings.repeats}")
            for i, case in list(cases.items()):
                if isinstance(case, CaseProcess) or repeat < runs:
                    _time_one(rows[i], case, settings, cases, i)
            for timed in [*peaks.values(), ceilings]:
                timed.time_block()
        _finish_rows(rows, cases, facts, ceilings)
        if settings.profile:
            _profile_rows(rows, cases, settings, write)
    finally:
        processes = [case for case in cases.values() if isinstance(case, CaseProcess)]
        for case in processes:
            case.stop()
        for case in [*processes, *peaks.values(), *([ceilings] if ceilings else [])]:
            case.close()
    about = describe_run(settings, facts.get((SINGLE, settings.variants[0]), {}), started)
    about["peak_matmul"] = PEAK_SIZE
    about["peak_flops"] = {t: p.median for t, p in peaks.items()}
    about["number_types"] = number_type_notes(list(peaks))
    about["kernel_share"] = _kernel_share(rows, ceilings, settings.batch)
    return rows, about


def _finish_rows(rows: list[Row], cases: dict, facts: dict, ceilings: Ceilings) -> None:
    """Gradient bytes, FLOPs per example, peak RSS and kernel ceiling of every row."""
    for i, row in enumerate(rows):
        single = facts.get((SINGLE, row.variant))
        if single:
            row.gradient_bytes = gradient_bytes(row.mode, row.devices,
                                                single["trainable_bytes"],
                                                row.variant.gradient_dtype)
            row.flops_per_example = single["step_flops"] / single["batch"]
        row.kernel_ceiling = ceilings.of(row.variant)
        if isinstance(cases.get(i), CaseProcess):
            try:
                row.peak_rss_bytes = cases[i].peak_rss()
            except RuntimeError:  # it stopped answering since its last block
                pass


def _kernel_share(rows: list[Row], ceilings: Ceilings | None, batch: int) -> float | None:
    """The share of the float32 1-device step its kernels take, timed alone."""
    base = next((r for r in rows if r.mode == SINGLE and r.variant.number_type == "float32"
                 and r.median), None)
    seconds = ceilings.float32_seconds(base.variant) if base and ceilings else None
    return seconds / (batch / base.median) if seconds else None


def _profile_rows(rows: list[Row], cases: dict, settings: Settings,
                  write: Callable[[str], None]) -> None:
    """A profiler trace of PROFILE_STEPS steps of each in-process row, after its timed
    blocks, each under a directory of its own (a TensorBoard run); says where."""
    from launch.runtime.profile import WHERE  # TensorFlow: not while the CLI parses

    for i, case in cases.items():
        row = rows[i]
        if not isinstance(case, CaseProcess):
            write(f"--profile: {row.mode} on {row.devices} devices is whole towers runs: "
                  "profile one with --set train.profile_steps=[first,last]")
            continue
        name = "-".join([row.mode.replace(" ", "_"), str(row.devices),
                         *([_slug(row.variant.label)] if len(settings.variants) > 1 else [])])
        try:
            answer = case.profile(PROFILE_STEPS, os.path.join(settings.profile, name))
        except RuntimeError as err:
            answer = {"error": str(err)}
        if "trace" in answer:
            write(f"profile of {PROFILE_STEPS} steps of {row.mode} on {row.devices} "
                  f"device(s) ({row.variant.label}): {answer['trace']}")
        else:
            write(f"--profile: {row.mode} on {row.devices} device(s) not profiled: "
                  f"{answer['error']}")
    write(f"profiles: tensorboard --logdir {settings.profile} ({WHERE})")


def _slug(label: str) -> str:
    """'mixed_bfloat16, xla' -> 'mixed_bfloat16_xla': a directory name."""
    return "_".join(label.replace(",", " ").split())


def _start_cases(settings: Settings, rows: list[Row], cases: dict, peaks: dict,
                 write: Callable[[str], None]) -> dict:
    """Fills `cases` (row index -> its case; rows that cannot run here, or whose case
    did not build, are marked skipped or failed instead) and `peaks` (number type ->
    its peak matmul, built here while the rows build), builds the in-process rows a
    few at a time, and returns their graph facts by (row mode, variant)."""
    # The probe imports TensorFlow in a process of its own: only for a row that needs it
    # (--towers 1 plans no horovod row, whatever --modes says).
    missing = horovod_missing() if any(row.mode == "horovod" for row in rows) else None
    specs = {}
    for i, row in enumerate(rows):
        row.skipped = cannot_run(row, missing)
        if row.skipped:
            continue
        if row.mode in (SINGLE, *IN_PROCESS_MODES):
            mode = "parameter_server" if row.mode == SINGLE else row.mode
            specs[i] = case_spec(settings, mode, row.devices, row.variant)
        else:
            cases[i] = ClusterCase(settings, row)
    number_types = list(dict.fromkeys(v.number_type for v in settings.variants))
    write(f"building {len(specs)} in-process rows (one process each, {BUILDS_AT_ONCE} at a "
          f"time) and {len(number_types)} peak matmul(s)")
    for number_type in number_types:
        peaks[number_type] = Peak(number_type)
    ready, failed = start_in_turns(specs, settings.timeout, BUILDS_AT_ONCE)
    cases.update(ready)
    for i, reason in failed.items():
        # The mirrored row cannot run a model with Keras layers: a skip, not a failure.
        unsupported = UNSUPPORTED in reason
        rows[i].skipped = reason.partition(": ")[2] if unsupported else f"failed: {reason}"
        write(f"{_name(rows[i])}: {rows[i].skipped}")
    return {(rows[i].mode, rows[i].variant): {**case.facts, "batch": settings.batch}
            for i, case in ready.items()}


def _name(row: Row) -> str:
    return f"{row.mode} on {row.devices} device(s) ({row.variant.label})"


def cannot_run(row: Row, horovod_missing_reason: str | None) -> str | None:
    """Why `row` is skipped here, or None."""
    variant = row.variant
    if row.mode == "horovod" and horovod_missing_reason:
        return horovod_missing_reason
    if row.mode == "horovod" and variant.gradient_dtype == "bfloat16":
        return "Horovod has no bfloat16 all-reduce"
    if row.mode == "mirrored" and (variant.accumulate > 1 or variant.xla
                                   or variant.gradient_dtype != "float32"
                                   or variant.precision == "mixed_float16"):
        return "the mirrored row runs float32 or mixed_bfloat16 only, without the other options"
    if variant.batch_norm == "sync" and row.mode in ("mirrored", "ps_worker"):
        return f"sync batch norm is not available in the {row.mode} row"
    return None


def _time_one(row: Row, case: CaseProcess | ClusterCase, settings: Settings,
              cases: dict, index: int) -> None:
    """One block of `row`: appends its examples/sec, or marks the row failed (and drops
    its case, so the other rows go on)."""
    if row.skipped:
        return
    try:
        if isinstance(case, CaseProcess):
            seconds = case.time_block(settings.steps)
            row.rates.append(settings.steps * settings.batch / seconds)
        else:
            row.rates.append(case.time_block())
    except (RuntimeError, ValueError) as err:  # no answer, a failed run, a bad result
        row.skipped = f"failed: {err}"
        row.rates.clear()
        del cases[index]
        if isinstance(case, CaseProcess):
            case.kill()


# Where the figures stand against TensorFlow's own tower trainer, measured side by side.
PEER = ("Against tf_cnn_benchmarks (TensorFlow's own tower trainer) on resnet20, batch 128, "
        "momentum SGD, 1 and 2 devices: the first step and examples/sec level, peak RSS "
        "1.01x with oneDNN (0.88-0.89x without, against its plain SGD) (BENCHMARKS.md, "
        "'Memory and start-up against tf_cnn_benchmarks').")


def throughput_report(settings: Settings,
                      write: Callable[[str], None]) -> tuple[str, list[str]]:
    """The table as markdown under the run's heading and peaks (bench.csv, bench.json and
    bench.png in settings.out too, if set), and the rows whose runs failed, as "mode on
    N devices (variant)"."""
    rows, about = run_bench(settings, write)
    text = (f"{heading(about)}\n{peak_text(about)}\n\n" + markdown_table(rows, about["peak_flops"])
            + f"\n\n{PEER}")
    if settings.out:
        for path in write_outputs(settings.out, rows, about):
            write(f"wrote {path}")
    failed = [f"{r.mode} on {r.devices} devices ({r.variant.label})" for r in rows
              if r.skipped and r.skipped.startswith("failed:")]
    return text, failed
