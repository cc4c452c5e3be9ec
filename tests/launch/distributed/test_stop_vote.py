"""The stop vote of collective workers and Horovod ranks: a process that stops because
another one was signalled says so, as its own signal would (soak collective seed 419:
the chief, stopped by worker 1's SIGTERM at step 49 of 64, reported no `stopped_by`,
exited 0, and was taken for a finished job).

The vote's sum across the job is an all-reduce; here it is this process's vote plus the
other process's, a constant: the hook and the session are real."""

import tensorflow as tf

from launch.distributed.health.stop_vote import StopVoteHook
from launch.runtime.signals import StopSignals

V1 = tf.compat.v1


def run_one_step(other_votes: float, stop: StopSignals) -> bool:
    """One step with the hook; whether the session then stops."""
    with tf.Graph().as_default():
        step = V1.train.get_or_create_global_step().assign_add(1)
        hook = StopVoteHook(stop, lambda vote: vote + other_votes)
        with V1.train.MonitoredSession(hooks=[hook]) as session:
            session.run(step)
            return session.should_stop()


def test_a_process_stopped_by_another_ones_signal_says_it_was_stopped():
    heard = []
    with StopSignals(on_arrival=heard.append) as stop:
        assert run_one_step(1.0, stop)
    assert stop and stop.received == "another process's stop signal"
    assert heard == [stop.received]  # the training's line and the stop's deadline


def test_without_a_vote_nothing_stops():
    with StopSignals() as stop:
        assert not run_one_step(0.0, stop)
    assert not stop
