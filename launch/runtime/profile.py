"""TensorFlow profiler traces, written where TensorBoard's profile plugin finds them
(`tensorboard-plugin-profile`, the `profile` extra): <logdir>/plugins/profile/<time>/
<host>.xplane.pb. train.profile_steps traces a window of session runs into the
checkpoint_dir (for a process of a job of several, <checkpoint_dir>/profile-<label>/: a
TensorBoard run each, so processes on one host do not overwrite each other's file);
`towers bench --profile` traces a few steps of each in-process row (launch/bench)."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import tensorflow as tf

V1 = tf.compat.v1

WHERE = "TensorBoard's profile tab, tensorboard-plugin-profile"


def profile_dir(checkpoint_dir: str, label: str) -> str:
    return os.path.join(checkpoint_dir, f"profile-{label}") if label else checkpoint_dir


def start_profiler(logdir: str) -> str | None:
    """Starts the profiler into logdir; returns why it could not (one runs already)."""
    try:
        tf.profiler.experimental.start(logdir)
    except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as err:
        return err.message
    return None


def stop_profiler() -> None:
    """Stops the profiler, writing its trace."""
    tf.profiler.experimental.stop()


@contextmanager
def profiling(logdir: str) -> Iterator[None]:
    """Profiles what runs inside into logdir; RuntimeError when the profiler cannot."""
    failed = start_profiler(logdir)
    if failed:
        raise RuntimeError(failed)
    try:
        yield
    finally:
        stop_profiler()


def trace_files(logdir: str) -> list[str]:
    """The profiler traces under logdir, oldest first."""
    return sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))


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
            failed = start_profiler(self._logdir)
            if failed:
                self._write(f"train.profile_steps: not profiled: {failed}")
            self._on = not failed

    def after_run(self, run_context, run_values) -> None:
        if self._runs >= self._last:
            self._stop()

    def end(self, session) -> None:
        self._stop()  # the run ended inside the window

    def _stop(self) -> None:
        if not self._on:
            return
        stop_profiler()
        self._on = False
        last = min(self._runs, self._last)
        self._write(f"profile of steps {self._first}-{last} written under {self._logdir} "
                    f"({WHERE})")
