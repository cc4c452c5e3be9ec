"""train.profile_steps: a TensorFlow profiler trace of a window of session runs, written
where TensorBoard's profile plugin finds it (`tensorboard-plugin-profile`, the
`profile` extra): <checkpoint_dir>/plugins/profile/<time>/<host>.xplane.pb, and for a
process of a job of several under <checkpoint_dir>/profile-<label>/ (a TensorBoard run
each, so processes on one host do not overwrite each other's file)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import tensorflow as tf

V1 = tf.compat.v1


def profile_dir(checkpoint_dir: str, label: str) -> str:
    return os.path.join(checkpoint_dir, f"profile-{label}") if label else checkpoint_dir


class ProfileHook(V1.train.SessionRunHook):
    """Profiles this process's session runs first..last (counted from 1)."""

    def __init__(self, logdir: str, steps: Sequence[int], write: Callable[[str], None]):
        self._logdir, self._write = logdir, write
        self._first, self._last = steps
        self._runs = 0
        self._on = False

    def before_run(self, run_context):
        self._runs += 1
        if self._runs == self._first:
            try:
                tf.profiler.experimental.start(self._logdir)
                self._on = True
            except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as err:
                self._write(f"train.profile_steps: not profiled: {err.message}")

    def after_run(self, run_context, run_values) -> None:
        if self._runs >= self._last:
            self._stop()

    def end(self, session) -> None:
        self._stop()  # the run ended inside the window

    def _stop(self) -> None:
        if not self._on:
            return
        tf.profiler.experimental.stop()
        self._on = False
        last = min(self._runs, self._last)
        self._write(f"profile of steps {self._first}-{last} written under {self._logdir} "
                    "(TensorBoard's profile tab, tensorboard-plugin-profile)")
