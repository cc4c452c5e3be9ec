"""Checkpoint checks and helpers: where they go, whether they fit the model, warm start,
falling back past a damaged newest checkpoint, and saves that fail with one clear error."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence

import tensorflow as tf

from launch.config import TrainConfig, WarmStartConfig
from launch.errors import BadInput, ResourceFailed

# The scope of the data state's variables (launch.runtime.data_state), saved beside the model's.
DATA_SCOPE = "towers_data"
# Variables whose restore their owner settles from any checkpoint, or none (an
# asynchronous job's worker positions: launch.runtime.worker_positions): not checked here.
RESTORED_APART = "towers_restored_apart"

V1 = tf.compat.v1


CHECKPOINT_BASENAME = "model.ckpt"  # CheckpointSaverHook's prefix: model.ckpt-<step>
UNRESTORABLE_DIR = "unrestorable"  # where damaged checkpoints are moved, inside checkpoint_dir
STATE_FILE = "checkpoint"  # the Saver's list of checkpoints (its latest_filename)
# Errors of a session whose peer went away: not the disk's fault.
_SESSION_ERRORS = (
    tf.errors.AbortedError,
    tf.errors.UnavailableError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
)


class CheckpointError(BadInput):
    """A checkpoint path or directory that cannot serve this job."""


class CheckpointWriteError(ResourceFailed):
    """A write into checkpoint_dir failed mid-run (disk full, directory read-only or gone)."""


@contextlib.contextmanager
def write_failures(checkpoint_dir: str) -> Iterator[None]:
    """Turn a failed write into checkpoint_dir (a checkpoint, the graph, summaries: disk
    full, directory read-only or gone) into one CheckpointWriteError naming the latest
    intact checkpoint. A failed save leaves that one the latest: TensorFlow writes the
    data under a temporary name, renames it when complete, and only then rewrites the
    `checkpoint` state file (itself by rename)."""
    try:
        yield
    except _SESSION_ERRORS:
        raise
    except (tf.errors.OpError, OSError, ValueError) as err:
        message = err.message if isinstance(err, tf.errors.OpError) else str(err)
        if not any(p in message for p in {checkpoint_dir, os.path.abspath(checkpoint_dir)}):
            raise
        raise unwritable(checkpoint_dir, _os_reason(message)) from None


def unwritable(checkpoint_dir: str, reason: str) -> CheckpointWriteError:
    """A write into checkpoint_dir failed (mid-run, or as the job starts: its lock, a
    damaged checkpoint moved aside), as one line naming the latest intact checkpoint."""
    # The state file may name a checkpoint just moved aside as the job starts.
    latest = tf.train.latest_checkpoint(checkpoint_dir) or next(
        (p for p in _candidates(checkpoint_dir, None) if _has_files(p)), None)
    return CheckpointWriteError(
        f"train.checkpoint_dir: cannot write in {checkpoint_dir} ({reason}); the latest "
        f"complete checkpoint is {latest or 'none'}. Free space or fix the directory, then "
        "run again to resume")


def _os_reason(message: str) -> str:
    """The cause in an I/O error: in a graph execution error the line after "Node: '...'",
    e.g. "/dir/model.ckpt-9.data-...tempstate123; No space left on device", from its "; "."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    after = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith("Node:")]
    cause = after[0] if after else _first_line(message)
    return cause.rpartition("; ")[2]


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"


def fall_back_to_restorable(checkpoint_dir: str, write: Callable[[str], None]) -> str | None:
    """Make the newest checkpoint that restores the latest one; return it (None if none).

    A crash, a full disk or a damaged file can leave the newest checkpoint partial
    or unreadable, or the `checkpoint` state file naming one that is gone (or no
    state file beside complete checkpoints). Restoring would then fail, or worse,
    start again from step 0. Newer checkpoints that do not restore are moved into
    UNRESTORABLE_DIR, so every checkpoint left in the directory restores, and the
    state file is rewritten to name the newest good one. Reads every tensor of the
    newest candidates once, which verifies their checksums.
    """
    if not os.path.isdir(checkpoint_dir):
        return None
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    named = state.model_checkpoint_path if state else None
    candidates = _candidates(checkpoint_dir, state)
    good = None
    for prefix in candidates:
        problem = restore_problem(prefix)
        if problem is None:
            good = prefix
            break
        write(f"checkpoint {prefix} cannot be restored: {problem}; falling back to an older one")
        _move_aside(prefix, checkpoint_dir, write)
    if good is None:
        if named is not None:
            # A state file naming a checkpoint that is gone would still be restored from
            # by the session (and fail, at every restart): it goes aside with the rest.
            _move_aside(os.path.join(checkpoint_dir, STATE_FILE), checkpoint_dir, write)
            write(f"no checkpoint in {checkpoint_dir} can be restored; starting from scratch")
        return None
    if named is None or os.path.abspath(named) != os.path.abspath(good):
        kept = [p for p in reversed(candidates) if _step(p) <= _step(good) and _has_files(p)]
        with write_failures(checkpoint_dir):  # the disk full as the job starts (soak seed 403)
            V1.train.update_checkpoint_state(
                checkpoint_dir,
                os.path.basename(good),
                all_model_checkpoint_paths=[os.path.basename(p) for p in kept[-_MAX_LISTED:]],
            )
        write(f"{good} is the newest checkpoint that restores; it is the latest now")
    return good


_MAX_LISTED = 100  # the Saver's own max_to_keep trims the list again after its next save


def _candidates(checkpoint_dir: str, state) -> list[str]:
    """Checkpoint prefixes the state file names or the directory holds, newest first."""
    found = glob.glob(os.path.join(checkpoint_dir, f"{CHECKPOINT_BASENAME}-*.index"))
    prefixes = [p[: -len(".index")] for p in found]
    if state is not None:
        prefixes += [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
    # The state file may hold absolute paths (a Saver without save_relative_paths).
    return sorted({os.path.abspath(p) for p in prefixes}, key=_step, reverse=True)


def _step(prefix: str) -> int:
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def _has_files(prefix: str) -> bool:
    return os.path.exists(prefix + ".index")


def restore_problem(prefix: str) -> str | None:
    """Why the checkpoint at prefix cannot be restored, or None if every tensor reads."""
    if not _has_files(prefix):
        return "its files are missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    # The reader's C++ errors arrive as OpError, or as a bare IndexError ("Read less
    # bytes than requested" from a truncated file), ValueError or RuntimeError.
    except (tf.errors.OpError, ValueError, IndexError, RuntimeError) as err:
        return _first_line(err.message if isinstance(err, tf.errors.OpError) else str(err))
    return None


def _move_aside(prefix: str, checkpoint_dir: str, write: Callable[[str], None]) -> None:
    """Move a checkpoint's files (prefix.*), or the one file at prefix, into
    UNRESTORABLE_DIR."""
    files = glob.glob(glob.escape(prefix) + ".*") or glob.glob(glob.escape(prefix))
    if not files:
        return
    aside = os.path.join(checkpoint_dir, UNRESTORABLE_DIR)
    try:
        os.makedirs(aside, exist_ok=True)
        for name in files:
            shutil.move(name, os.path.join(aside, os.path.basename(name)))
    except OSError as err:  # the disk full as the job starts: as a save that fails
        raise unwritable(checkpoint_dir, err.strerror or str(err)) from None
    write(f"moved {len(files)} file(s) of {os.path.basename(prefix)} to {aside}")


def check_writable_dir(path: str, key: str) -> None:
    """Fail before training if checkpoints could not be written; create nothing."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise CheckpointError(f"{key}: {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise CheckpointError(f"{key}: directory {path} is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"{key}: cannot create {path}: {parent} is not writable")


def resolve(path: str, key: str) -> str:
    """A checkpoint prefix from a directory (its latest) or a prefix; error if neither."""
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"{key}: directory {path} holds no checkpoint")
        return latest
    if os.path.exists(path + ".index"):
        return path
    raise CheckpointError(f"{key}: no checkpoint at {path}")


def newest_restorable(path: str, key: str, write: Callable[[str], None]) -> str:
    """For a reader (the evaluator): resolve() that passes over checkpoints that do not
    restore, saying so, and moves nothing (the directory is the trainer's)."""
    if not os.path.isdir(path):
        prefix = resolve(path, key)
        problem = restore_problem(prefix)
        if problem is not None:
            raise CheckpointError(f"{key}: checkpoint {prefix} cannot be restored: {problem}")
        return prefix
    for prefix in _candidates(path, tf.train.get_checkpoint_state(path)):
        problem = restore_problem(prefix)
        if problem is None:
            return prefix
        write(f"checkpoint {prefix} cannot be restored: {problem}; trying an older one")
    raise CheckpointError(f"{key}: directory {path} holds no checkpoint that restores")


def step_of(checkpoint: str) -> int:
    """The global step stored in a checkpoint."""
    return int(tf.train.load_variable(checkpoint, "global_step"))


def check_compatible(checkpoint_dir: str, variables: Sequence[tf.Variable] | None = None) -> None:
    """Refuse to resume from a checkpoint of a different model, naming what differs.

    Without this, the restore fails deep inside the session with a NotFoundError
    about one key; a user who pointed two jobs at one directory deserves the list.
    """
    latest = tf.train.latest_checkpoint(checkpoint_dir) if os.path.isdir(checkpoint_dir) else None
    if latest is None:
        return
    stored = tf.train.load_checkpoint(latest).get_variable_to_shape_map()
    missing, reshaped = [], []
    apart = {id(v) for v in V1.get_collection(RESTORED_APART)}
    for var in variables if variables is not None else V1.global_variables():
        name = var.op.name
        if id(var) in apart:
            continue
        if name not in stored:
            missing.append(name)
        elif list(stored[name]) != var.shape.as_list():
            reshaped.append(f"{name} {stored[name]} vs {var.shape.as_list()}")
    data_state = [name for name in missing if name.startswith(f"{DATA_SCOPE}/")]
    missing = [name for name in missing if name not in data_state]
    if data_state and not missing and not reshaped:
        raise CheckpointError(
            f"train.checkpoint_dir: {latest} was written before towers saved the data "
            "position with the model, so a resume cannot say where its data stands. Use "
            "another checkpoint_dir with warm_start from it to go on from its weights"
        )
    if missing or reshaped:
        details = []
        if missing:
            details.append(f"missing: {few(missing)}")
        if reshaped:
            details.append(f"different shapes (checkpoint vs model): {few(reshaped)}")
        raise CheckpointError(
            f"train.checkpoint_dir: {latest} was written by a different model; "
            f"{'; '.join(details)}. Use another checkpoint_dir, or warm_start to fine-tune"
        )


def few(items: list[str], limit: int = 5) -> str:
    """'a, b, c, d, e and 3 more': the first `limit` of `items`, for a one-line error."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def warm_start(
    cfg: WarmStartConfig, variables: Sequence[tf.Variable], write: Callable[[str], None],
    fallback: Mapping[str, str] | None = None,
) -> None:
    """Initialise matching variables from another checkpoint (fine-tuning).

    A variable is taken when it matches an `include` regex (all, if none given)
    and no `exclude` regex, anywhere in its name. `rename` maps checkpoint name
    prefixes to model name prefixes. Only initialisation changes: resuming from
    the job's own checkpoint_dir still takes precedence.
    fallback: {variable name: another's}: a variable the checkpoint lacks takes the
    other's value there (a weight average starts from its weight).
    """
    path = resolve(cfg.path, "train.warm_start.path")
    stored = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    assignment, reshaped = {}, []
    for var in variables:
        name = var.op.name
        if cfg.include and not any(re.search(p, name) for p in cfg.include):
            continue
        if any(re.search(p, name) for p in cfg.exclude):
            continue
        source = _checkpoint_name(name, cfg.rename)
        if source not in stored and name in (fallback or {}):
            source = _checkpoint_name(fallback[name], cfg.rename)
        if source not in stored:
            continue
        if list(stored[source]) != var.shape.as_list():
            reshaped.append(f"{source} {stored[source]} -> {name} {var.shape.as_list()}")
            continue
        assignment[source] = var
    if reshaped:
        raise CheckpointError(f"train.warm_start: shapes differ: {few(reshaped)}")
    if not assignment:
        raise CheckpointError(f"train.warm_start: no variable of the model matches {path}")
    V1.train.init_from_checkpoint(path, assignment)
    write(f"warm start: {len(assignment)} variable(s) from {path}")


def _checkpoint_name(name: str, rename) -> str:
    for old, new in rename.items():
        if name.startswith(new):
            return old + name[len(new) :]
    return name


class LastSave(V1.train.CheckpointSaverListener):
    """The step of the last checkpoint this process saved (None before one): the job's
    final step once the session's end has saved. The chief saves before the other hooks
    end (MonitoredTrainingSession ends chief-only hooks first), and in a synchronous
    ps/worker job other workers' gradients may still move the global step after that."""

    def __init__(self):
        self.step: int | None = None

    def after_save(self, session, global_step_value) -> None:
        self.step = int(global_step_value)


class _LogSaves(V1.train.CheckpointSaverListener):
    def __init__(self, write: Callable[[str], None]):
        self._write = write

    def after_save(self, session, global_step_value) -> None:
        self._write(f"saved checkpoint at step {global_step_value}")


def saver_hook(
    cfg: TrainConfig,
    scaffold: V1.train.Scaffold,
    write: Callable[[str], None],
    listeners: Sequence[V1.train.CheckpointSaverListener] = (),
) -> V1.train.CheckpointSaverHook:
    """Checkpoints every N steps or seconds; with neither set, only at the end.

    listeners: told before and after each save, besides the one logging it.
    """
    if cfg.checkpoint_every_secs is not None:
        every = {"save_secs": cfg.checkpoint_every_secs}
    else:
        every = {"save_steps": cfg.checkpoint_every_steps or cfg.steps}
    return _SaverHook(
        cfg.steps, cfg.checkpoint_dir, scaffold=scaffold,
        listeners=[_LogSaves(write), *listeners], **every,
    )


class _SaverHook(V1.train.CheckpointSaverHook):
    """TensorFlow's, which saves as the session starts; except that a session starting
    at or past the last step (a finished job run again, which takes no step) leaves the
    checkpoints it finds as they are, and that the start writes no more copies of the
    graph than the checkpoint's own.

    TensorFlow's hook also writes the whole graph as text (graph.pbtxt), and into the
    event file twice more, which has it from the summary writer's start: 1.8 s of a
    2-tower replicated resnet20's start on a loaded 2-core CPU, for copies of what the
    event file and every checkpoint's .meta hold.
    """

    def __init__(self, last_step: int, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_step = last_step

    def after_create_session(self, session, coord) -> None:
        step = session.run(self._global_step_tensor)
        if step < self._last_step:
            self._save(session, step)  # the state at `step`: restored, or initialised
        self._timer.update_last_triggered_step(step)  # a finished job: end() saves nothing
