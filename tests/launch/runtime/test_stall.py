"""The stall watch: a step that has not finished for train.stall_warning_secs is named
with what it waits for, at doubling intervals; after stall_abort_secs the process is
ended with a retryable status (138); a step that then finishes says so. A step that has
not got its batch is said to wait for its input; one that has, for what its process's
role names (in one process, its devices)."""

import threading
import time

import pytest
import tensorflow as tf
from helpers.commands import run_in_process
from helpers.faults import job, poisoned_csv

from launch.errors import EXIT_DIVERGED, EXIT_PEER_UNAVAILABLE, Stalled
from launch.runtime import stall
from launch.runtime.input_watch import count_batches
from launch.runtime.stall import NO_BATCH, StallWatch, example_bytes, no_batch_text

V1 = tf.compat.v1


def test_a_blocked_step_is_named_then_named_less_often_then_aborted():
    lines, aborted, feeders = [], [], []
    with tf.Graph().as_default():
        queue = tf.queue.FIFOQueue(1, tf.float32)  # an input that gives nothing: the step blocks
        step, feed = queue.dequeue(), queue.enqueue(1.0)
        sessions = _Sessions()

        def abort(error):  # instead of ending the process: record it, then let the step go
            if not aborted:
                aborted.append(error)
                feeders.append(threading.Thread(target=sessions.last.run, args=(feed,)))
                feeders[0].start()

        watch = StallWatch(0.4, 2.5, lambda: "the input gives nothing", lines.append, abort)
        with V1.train.MonitoredSession(hooks=[sessions, watch]) as session:
            session.run(step)  # returns once abort() has fed the queue
            feeders[0].join()
    warnings = [line for line in lines if line.startswith("no step has finished")]
    seconds = [int(line.split(" for ")[1].split(" s ")[0]) for line in warnings]
    assert warnings and all("(train.stall_warning_secs: 0.4): the input gives nothing" in line
                            for line in warnings)
    assert seconds == sorted(seconds) and len(warnings) <= 3  # 0.4, 0.8, 1.6: then abort
    error = aborted[0]
    assert isinstance(error, Stalled) and error.exit_status == EXIT_PEER_UNAVAILABLE
    assert str(error).startswith("train.stall_abort_secs: no step finished for ")
    assert "the input gives nothing" in str(error)
    assert lines[-1].startswith("steps go on again after ")


def test_a_step_that_ends_while_the_watch_asks_what_it_waits_for_is_not_called_stalled():
    """A fresh-clone run beside the soak: the watch asked what the step waited for (a read
    of the session, seconds under load), the step ended meanwhile and said "steps go on
    again", and the watch's warning came after it, for a step that had finished."""
    lines = []

    def cause() -> str:
        watch.after_run(None, None)  # the step ends while the watch asks
        return "the input gives nothing"

    watch = StallWatch(0.4, None, cause, lines.append, lambda error: None)
    start = time.monotonic()
    watch.look(start + 0.5, start + 1.0)
    assert lines == []


def first_stall_line(make_step) -> str:
    """The first warning about a step that blocks until the watch's abort lets it go.

    make_step(release_queue) -> the step op: it blocks on release_queue's dequeue.
    """
    lines, feeders = [], []
    with tf.Graph().as_default():
        release = tf.queue.FIFOQueue(1, tf.float32)
        step, feed = make_step(release), release.enqueue(1.0)
        sessions = _Sessions()

        def abort(error):
            if not feeders:
                feeders.append(threading.Thread(target=sessions.last.run, args=(feed,)))
                feeders[0].start()

        watch = StallWatch(0.3, 1.0, lambda: "its devices", lines.append, abort)
        with V1.train.MonitoredSession(hooks=[sessions, watch]) as session:
            session.run(step)
            feeders[0].join()
    return next(line for line in lines if line.startswith("no step has finished"))


def test_a_step_without_its_batch_waits_for_its_input():
    def step(release):
        batch = release.dequeue()  # the input pipeline: nothing until the abort
        return tf.group(batch * 2.0, count_batches(batch, "/cpu:0"))

    assert first_stall_line(step).endswith(f"): {NO_BATCH}")


def test_a_step_with_its_batch_waits_for_what_the_role_names():
    def step(release):
        batch = tf.constant([1.0, 2.0])  # arrives at once; the compute then blocks
        return tf.group(tf.reduce_sum(batch) + release.dequeue(), count_batches(batch, "/cpu:0"))

    assert first_stall_line(step).endswith("): its devices")


class _Sessions(V1.train.SessionRunHook):
    """Keeps the session, so another thread can run an op in it."""

    def after_create_session(self, session, coord):
        self.last = session


def test_a_process_that_did_not_run_says_so_and_blames_nothing_it_waits_for():
    """SIGSTOP and SIGCONT (or a paused VM): the watch's next look comes far later than
    due. The process was not running, so no peer or ps held its step up."""
    lines = []
    watch = StallWatch(3.0, None, lambda: "every worker reports; a ps busy or slow",
                       lines.append, lambda error: None)
    start = time.monotonic()
    assert watch.look(start, start + 31.6) == start + 31.6
    assert lines == ["this process did not run for 31 s (it was suspended: SIGSTOP, a paused "
                     "container or VM, or a host starved of CPU); its steps go on"]
    watch.look(start + 31.6, start + 32.1)
    watch.look(start + 32.1, start + 32.6)
    assert len(lines) == 1  # its stall clock started again when it ran again
    watch.look(start + 32.6, start + 35.0)  # a real stall since: named as before
    assert lines[-1].startswith("no step has finished for 3 s") and len(lines) == 2


def test_a_batch_too_large_to_assemble_is_named_as_the_cause():
    # The default job (28x28x1 float32 images, int32 labels) at train.batch_size
    # 100,000,000 on a host of 24 GiB: its input stalled for an hour, said to be "a
    # source that gives no data, or a reader that is stuck".
    with tf.Graph().as_default():
        features = V1.placeholder(tf.float32, [None, 28, 28, 1])
        labels = V1.placeholder(tf.int32, [None])
        size = example_bytes(features, labels)
    assert size == 28 * 28 * 4 + 4
    assert no_batch_text(100_000_000, size, 24 * 2**30) == (
        "the step waits for its input: its batch of 100,000,000 examples (292.4 GiB) is too "
        "large to assemble in this host's 24.0 GiB of memory; lower train.batch_size (each "
        "process assembles its own part of the global batch: more workers or ranks split it)")
    assert no_batch_text(256, size, 24 * 2**30) == NO_BATCH
    assert no_batch_text(100_000_000, size, None) == NO_BATCH


class _SessionThatNeverAnswers:
    def run(self, *args, **kwargs):
        threading.Event().wait()  # as a Horovod rank's session, stuck in a collective


def test_a_session_that_does_not_answer_does_not_hold_up_the_watch(monkeypatch):
    # A Horovod rank in a collective its peer never joined: the read of its batch count
    # blocked past its own timeout, and with it the stall lines, the stall's abort and a
    # stop's deadline (found by the soak's uninterrupted Horovod run).
    monkeypatch.setattr(stall, "READ_WAIT_SECS", 0.3)
    lines = []
    watch = StallWatch(0.5, None, lambda: "its peers", lines.append, lambda error: None)
    with tf.Graph().as_default():
        count_batches(tf.constant([1.0]), "/cpu:0")
        watch.begin()
    watch.after_create_session(_SessionThatNeverAnswers(), None)
    watch.stop()  # the watch's own thread: this test looks itself
    start = time.monotonic()
    looking = threading.Thread(target=watch.look, args=(start + 0.6, start + 1.1), daemon=True)
    looking.start()
    looking.join(8)
    assert not looking.is_alive(), "the watch waited for the session"
    assert lines and lines[-1].endswith("): its peers")
    assert watch.waits_for() == "the session is closing (its final checkpoint, its peers' end " \
        "of the job)"


@pytest.mark.e2e
def test_a_job_that_fails_leaves_no_watch_running_in_the_process_that_called_it(
        tmp_path, monkeypatch):
    """A session that raises (here, the job diverges at step 5) calls no hook's end().
    The job's watch must end all the same: left running, it went on warning about a job
    that had ended ("no step has finished for 121 s"), and with train.stall_abort_secs
    set it would end the process that called train() and went on."""
    watches = []
    start_watching = StallWatch.after_create_session

    def noted(watch, session, coord):  # the real watch, its thread noted as it starts
        start_watching(watch, session, coord)
        watches.append(watch._thread)

    monkeypatch.setattr(StallWatch, "after_create_session", noted)
    result = run_in_process("train", *job(tmp_path / "ckpt", 20),
                            *poisoned_csv(tmp_path / "d.csv", [5]))
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert watches, "the job started no watch: this test tests nothing"
    for watch in watches:
        watch.join(timeout=10 * stall.LOOK_EVERY_SECS)  # a watch looks every 0.5 s
    assert not [watch for watch in watches if watch.is_alive()]
