"""Checkpoint checks and helpers: where they go, whether they fit the model, warm start."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

import tensorflow as tf

from launch.config import TrainConfig, WarmStartConfig

V1 = tf.compat.v1


class CheckpointError(ValueError):
    """A checkpoint path or directory that cannot serve this job."""


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
    for var in variables if variables is not None else V1.global_variables():
        name = var.op.name
        if name not in stored:
            missing.append(name)
        elif list(stored[name]) != var.shape.as_list():
            reshaped.append(f"{name} {stored[name]} vs {var.shape.as_list()}")
    if missing or reshaped:
        details = []
        if missing:
            details.append(f"missing: {_few(missing)}")
        if reshaped:
            details.append(f"different shapes (checkpoint vs model): {_few(reshaped)}")
        raise CheckpointError(
            f"train.checkpoint_dir: {latest} was written by a different model; "
            f"{'; '.join(details)}. Use another checkpoint_dir, or warm_start to fine-tune"
        )


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def warm_start(
    cfg: WarmStartConfig, variables: Sequence[tf.Variable], write: Callable[[str], None]
) -> None:
    """Initialise matching variables from another checkpoint (fine-tuning).

    A variable is taken when it matches an `include` regex (all, if none given)
    and no `exclude` regex, anywhere in its name. `rename` maps checkpoint name
    prefixes to model name prefixes. Only initialisation changes: resuming from
    the job's own checkpoint_dir still takes precedence.
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
        if source not in stored:
            continue
        if list(stored[source]) != var.shape.as_list():
            reshaped.append(f"{source} {stored[source]} -> {name} {var.shape.as_list()}")
            continue
        assignment[source] = var
    if reshaped:
        raise CheckpointError(f"train.warm_start: shapes differ: {_few(reshaped)}")
    if not assignment:
        raise CheckpointError(f"train.warm_start: no variable of the model matches {path}")
    V1.train.init_from_checkpoint(path, assignment)
    write(f"warm start: {len(assignment)} variable(s) from {path}")


def _checkpoint_name(name: str, rename) -> str:
    for old, new in rename.items():
        if name.startswith(new):
            return old + name[len(new) :]
    return name


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
    return V1.train.CheckpointSaverHook(
        cfg.checkpoint_dir, scaffold=scaffold, listeners=[_LogSaves(write), *listeners], **every
    )
