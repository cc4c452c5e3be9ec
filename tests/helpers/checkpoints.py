"""Reading what a run left in its checkpoint directory: the latest step, the variables,
and that nothing was lost (every checkpoint restores, every value is finite)."""

import glob
import os

import numpy as np
import tensorflow as tf


def checkpoint_variables(ckpt, prefix: str = "") -> dict[str, np.ndarray]:
    """The variables of the latest checkpoint in `ckpt` whose names start with `prefix`."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(ckpt)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(prefix)}


def latest_step(ckpt) -> int:
    latest = tf.train.latest_checkpoint(str(ckpt))
    assert latest, f"no checkpoint in {ckpt}"
    return int(tf.train.load_variable(latest, "global_step"))


def assert_nothing_lost(ckpt, at_least: int) -> int:
    """Every checkpoint in the directory restores and is finite; the latest is >= at_least."""
    prefixes = {p[: -len(".index")] for p in glob.glob(os.path.join(str(ckpt), "*.index"))}
    state = tf.train.get_checkpoint_state(str(ckpt))
    prefixes.update(state.all_model_checkpoint_paths)
    assert prefixes
    for prefix in prefixes:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            assert np.isfinite(value).all(), f"{prefix}: {name} holds NaN or Inf"
    step = latest_step(ckpt)
    assert step >= at_least, (step, at_least)
    return step
