"""Progress and notices go to stderr, so stdout stays one JSON line per run; TensorFlow's
own start-up notices are kept out of both.

How a towers process starts TensorFlow is here too, as two steps: `quiet_tensorflow()`
imports it without its chatter, and `use_graph_mode()` is where a process that builds
tf.compat.v1 graphs says so.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


def log(message: str) -> None:
    """Write one line of progress, prefixed `towers:`, to stderr."""
    print(f"towers: {message}", file=sys.stderr, flush=True)


def debug(message: str) -> None:
    """A line for whoever looks into what towers does, with TOWERS_DEBUG=1 in the
    environment; nothing otherwise."""
    if os.environ.get("TOWERS_DEBUG", "") not in ("", "0"):
        log(f"debug: {message}")


# Notices TensorFlow's C++ core prints while loading, before it reads
# TF_CPP_MIN_LOG_LEVEL; they say nothing about the job.
_STARTUP_NOTICES = (
    "All log messages before absl::InitializeLog()",
    "oneDNN custom operations are on",
    "cpu_feature_guard",
    "To enable the following instructions",
    "rebuild TensorFlow with the appropriate compiler flags",
)


@contextlib.contextmanager
def descriptor_2_captured() -> Iterator[list[str]]:
    """What C++ code writes to file descriptor 2 inside the block, kept off stderr:
    the list yielded holds its lines once the block ends (also when it raises)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines += captured.read().decode(errors="replace").splitlines(keepends=True)


def _import_tensorflow_quietly():
    """Import TensorFlow with its start-up notices filtered out of stderr, and without
    the modules it (and Keras, later) loads that a towers process does not use
    (launch.tf_process).

    The notices are written to file descriptor 2 directly, so they are caught there
    and everything else (a real import error, say) is passed on unchanged.
    """
    from launch.tf_process import refuse_to_keras, unused_imports_skipped

    refuse_to_keras()
    written: list[str] = []
    try:
        with descriptor_2_captured() as written, unused_imports_skipped():
            import tensorflow as tf
    finally:
        for line in written:
            if not any(notice in line for notice in _STARTUP_NOTICES):
                sys.stderr.write(line)
    return tf


_quieted = False


def quiet_tensorflow() -> None:
    """Import TensorFlow with its start-up chatter kept off stderr, and choose the
    allocator of its host memory before anything allocates (launch.tf_process).

    Every process towers starts calls this first (the commands, bench's case
    processes): the chatter would drown the one line a user needs to read.
    """
    global _quieted
    if _quieted:
        return  # done already: a job's model was resolved before its command ran
    _quieted = True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    from launch.tf_process import choose_host_allocator

    tf = _import_tensorflow_quietly()
    choose_host_allocator()
    tf.get_logger().setLevel(logging.ERROR)


def use_graph_mode() -> None:
    """This process builds tf.compat.v1 graphs and runs them in sessions: eager execution off.

    TensorFlow 2 starts eager and the mode holds for the whole process, so this is a
    step of its own where such a process starts, before it builds anything: the
    commands (launch.cli), the bench's case processes and its overhead run. The bench's
    mirrored row, TF2 code, runs in a process that never takes it. Call
    quiet_tensorflow() first where stderr matters: this imports TensorFlow if nothing
    has yet.
    """
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
