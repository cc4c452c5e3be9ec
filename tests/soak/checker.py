"""The invariants every schedule must keep (issue 43, item 2), checked on a Record:

(a) the job ends where an uninterrupted run ends: the same final step, the same
    stopped_by;
(b) what it trained: an exact arrangement (one process, synchronous ps/worker without
    backups, collective, Horovod) trains every place of the data exactly as often as
    the steps say, and its variables are within the larger of 1e-5 and twice the spread
    of two uninterrupted runs; with backup workers, no place more often than the steps
    say (the dropped parts are lost by design); asynchronous, every place at least as
    often as the steps say and at most once more for each event of the schedule that
    docs/resume.md says may train a part again (a task killed, stopped, restarted, cut
    off, a resize);
(c) every exit status is one docs/faults.md gives for what happened, and no traceback;
(d) no hang: the schedule ended within its bound, every task SIGTERMed exited within
    the stop bound;
(e) nothing lost: every checkpoint the state file names restores (every tensor read,
    its checksum checked), the final one holds the final step, and its data position is
    the one that step stands for.
"""

from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf
from soak import jobs
from soak.jobs import ARRANGEMENTS
from soak.supervisor import Record, Run

from launch.data.position import DataProgress

TOLERANCE = 1e-5
COUNTS = "mlp_counts/trained"


def variables(checkpoint: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("towers_data")}


def check(record: Record, references: list[dict[str, np.ndarray]] | None) -> list[str]:
    """Every violation of the invariants, as lines (none: the schedule passed).
    references: the variables of two uninterrupted runs of the same job (None: this is
    one of them; the variables are not compared)."""
    violations = []
    schedule = record.schedule
    arrangement = ARRANGEMENTS[schedule.arrangement]
    expected_step = jobs.final_step(schedule.ends_with_data)
    # (d) no hang
    if record.hang:
        violations.append(f"(d) hang: {record.hang}")
    violations += [f"(d) {overrun}" for overrun in record.overruns]
    # (c) statuses
    violations += _statuses(record)
    if not record.done:
        if not violations:
            violations.append("(a) the job did not finish")
        return violations
    # (a) where it ended
    chief = _chief_run(record)
    result = chief.result() or {}
    asynchronous = arrangement.name == "async"
    # Each step of each asynchronous worker moves the global step (a part, not a global
    # batch), and a part trained again takes a step more: its job ends at the step where
    # every part is trained, at least one global batch a step.
    step = result.get("global_step")
    if step != expected_step and not (asynchronous and (step or 0) >= expected_step):
        violations.append(f"(a) final step {step}, an uninterrupted run's {expected_step}")
    examples = expected_step * jobs.BATCH
    if result.get("examples_trained") != examples:
        violations.append(f"(a) {result.get('examples_trained')} examples trained, an "
                          f"uninterrupted run's {examples}")
    expected_by = "end of data" if schedule.ends_with_data else None
    if result.get("stopped_by") != expected_by:
        violations.append(f"(a) stopped_by {result.get('stopped_by')!r}, an uninterrupted "
                          f"run's {expected_by!r}")
    # (e) nothing lost
    lost, final = _nothing_lost(record.checkpoint_dir, step if asynchronous else expected_step,
                                examples, asynchronous)
    violations += lost
    if final is None:
        return violations
    # (b) what it trained
    violations += _trained(record, final, references, arrangement.exact, expected_step)
    return violations


def _chief_run(record: Record) -> Run:
    chief = {"one": "one", "horovod": "horovod"}.get(ARRANGEMENTS[
        record.schedule.arrangement].kind, "worker0")
    return [r for r in record.runs if r.task == chief][-1]


def _nothing_lost(checkpoint_dir: str, step: int, examples: int,
                  asynchronous: bool) -> tuple[list[str], str | None]:
    found = []
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:
        return ["(e) no checkpoint state file"], None
    for path in state.all_model_checkpoint_paths:
        try:
            reader = tf.train.load_checkpoint(path)
            for name in reader.get_variable_to_shape_map():
                value = reader.get_tensor(name)
                if value.dtype.kind == "f" and not np.isfinite(value).all():
                    found.append(f"(e) {path}: {name} is not finite")
        except (tf.errors.OpError, ValueError) as err:
            found.append(f"(e) {path} does not restore: {str(err).splitlines()[0]}")
    latest = state.model_checkpoint_path
    try:
        reader = tf.train.load_checkpoint(latest)
    except (tf.errors.OpError, ValueError) as err:
        return [*found, f"(e) the latest checkpoint {latest} does not restore: {err}"], None
    saved = int(reader.get_tensor("global_step"))
    if saved != step:
        found.append(f"(e) the final checkpoint holds step {saved}, not {step}")
    if asynchronous:  # each worker's own position: every one past its last part
        positions = reader.get_tensor("towers_data/worker_positions")
        if positions.min() < examples:
            found.append(f"(e) the final checkpoint's worker positions {list(positions)} "
                         f"are not all at the end of the data, {examples}")
        return found, latest
    base = {f: int(reader.get_tensor(f"towers_data/{f}"))
            for f in ("base_step", "base_position", "batch_size", "num_examples")}
    position = DataProgress(**base).position(saved)
    if position != examples:
        found.append(f"(e) the final checkpoint's data position {position} is not step "
                     f"{saved}'s, {examples}")
    return found, latest


def _trained(record: Record, final: str, references: list[dict[str, np.ndarray]],
             exact: bool, step: int) -> list[str]:
    found = []
    got = variables(final)
    reference = references[0] if references else {}
    kind = record.schedule.arrangement
    counts = got[COUNTS] / jobs.count_unit(ARRANGEMENTS[kind])
    expected = jobs.expected_counts(step)
    if exact or kind == "async":
        if np.abs(counts - np.round(counts)).max() > 1e-3:
            found.append("(b) the counts are not whole: an update applied in part")
        counts = np.round(counts)
    if exact:
        wrong = np.flatnonzero(counts != expected)
        if wrong.size:
            found.append(f"(b) {wrong.size} places trained other than the steps say (first: "
                         f"place {wrong[0]}, {counts[wrong[0]]:g} times, not "
                         f"{expected[wrong[0]]:g})")
        if references is None:
            return found
        spread = max((float(np.abs(references[0][n] - references[1][n]).max())
                      for n in reference), default=0.0)
        tolerance = max(TOLERANCE, 2 * spread)
        for name, value in reference.items():
            if name not in got or got[name].shape != value.shape:
                found.append(f"(b) {name} missing or of another shape")
                continue
            off = float(np.abs(got[name] - value).max())
            if off > tolerance:
                found.append(f"(b) {name} is {off:.3g} from an uninterrupted run's "
                             f"(tolerance {tolerance:.3g})")
    elif kind == "async":
        again = _retraining_events(record)
        if counts.min() < expected.min() or (counts < expected).any():
            found.append(f"(b) {int((counts < expected).sum())} places never trained")
        if (counts > expected + again).any():
            found.append(f"(b) a place trained {counts.max():g} times; at most "
                         f"{expected.max() + again:g} ({again} events may train again)")
    else:  # backup workers: parts dropped, none trained twice
        trainings = got[COUNTS] / jobs.backup_unit(record.sizes, ARRANGEMENTS[kind])
        if (trainings > expected + 1e-3).any():
            found.append(f"(b) a place trained {trainings.max():.3g} times, more than the "
                         "steps say")
    return found


def _retraining_events(record: Record) -> int:
    """Events after which docs/resume.md lets an asynchronous job train a part again:
    every start of a task after the first, every fault."""
    starts = len(record.runs) - len({r.task for r in record.runs})
    return starts + sum(record.faults_made.values())


def _statuses(record: Record) -> list[str]:
    """(c) Each run's exit status against what happened to it and around it."""
    found = []
    d = jobs.DEADLINES
    peer_window = (d["cluster.startup_timeout_secs"] + d["cluster.reconnect_timeout_secs"]
                   + d["cluster.operation_timeout_secs"] + 30)
    for run in record.runs:
        label = f"{run.task}-{run.generation}"
        stderr = run.stderr
        if run.task == "horovod":
            found += _rank_statuses(label, stderr + run.stdout)
            continue
        if "Traceback" in stderr:
            found.append(f"(c) {label} printed a traceback")
        status = run.status
        if status is None:
            continue  # stopped by the supervisor at the end (a hang, or a failed job)
        sent = {name for _, name in run.signals}
        ended = run.ended - record.began
        faults_before = [f for f in record.fault_times if f[0] <= ended]
        if status == 1 or status in (2, 3, 5):
            found.append(f"(c) {label} exited {status}: {_error_line(stderr)}")
        elif status == -9 and "SIGKILL" not in sent and run.task != "horovod":
            found.append(f"(c) {label} was killed, not by the schedule")
        elif status < 0 and status != -9 and not (status == -15 and "SIGTERM" in sent):
            found.append(f"(c) {label} ended by signal {-status}")
        elif status == 4 and not any(k == "disk_full" and s <= ended for s, _, k in
                                     record.fault_times):
            found.append(f"(c) {label} exited 4 with no disk full: {_error_line(stderr)}")
        elif status == 138 and not ("SIGTERM" in sent or any(
                end >= ended - peer_window for _, end, _ in faults_before)):
            found.append(f"(c) {label} exited 138 with no fault that explains it: "
                         f"{_error_line(stderr)}")
        elif status not in (0, 4, 138, -9, -15) and run.task != "horovod":
            found.append(f"(c) {label} exited {status}")
    return found


def _rank_statuses(label: str, output: str) -> list[str]:
    """(c) for a horovodrun's ranks: each rank's status as horovodrun reports it (its own
    traceback, when a rank failed, is the launcher's): 0, 138 (a peer lost), 4 (the
    disk), or ended by a signal (the schedule's, or horovodrun's after another rank
    failed: 137, 143); never 1, 2, 3, 5, and no rank's traceback."""
    found = []
    if re.search(r"^\[\d+\]<stderr>:Traceback", output, re.MULTILINE):
        found.append(f"(c) {label}: a rank printed a traceback")
    for rank, status in re.findall(r"^Process (\d+) exit with status code (-?\d+)", output,
                                   re.MULTILINE):
        if int(status) not in (0, 4, 138, 137, 143, -9, -15):
            lines = re.findall(rf"^\[{rank}\]<stderr>:towers: error: (.*)$", output, re.MULTILINE)
            found.append(f"(c) {label}: rank {rank} exited {status}: "
                         f"{lines[-1][:300] if lines else ''}")
    return found


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("towers: error:")]
    return lines[-1][:300] if lines else stderr.strip().splitlines()[-1][:300] if stderr else ""


def fault_count(record: Record) -> int:
    return sum(record.faults_made.values())


def keep_log(record: Record, path: str) -> None:
    with open(os.path.join(path, "events.txt"), "w") as f:
        f.write(record.schedule.text + "\n")
        for at, text in record.events:
            f.write(f"{at:8.2f} {text}\n")
