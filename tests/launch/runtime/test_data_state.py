"""What a resumed job does when its batch size, data or data.seed changed (pure: the
rule launch.runtime.data_state.reconcile states), and a checkpoint from before the data
position was saved."""

import pytest
import tensorflow as tf

from launch.data.position import DataProgress
from launch.runtime import checkpoints
from launch.runtime.data_state import Stored, reconcile

# 395 steps of 20 over 17,970 examples: the checkpoint's data state
STORED = Stored(DataProgress(0, 0, 20, 17970), seed=7, files=11)


def test_the_same_job_goes_on_as_it_was():
    assert reconcile(STORED, STORED, 395) == (STORED, None)


def test_another_batch_size_goes_on_at_the_same_next_example():
    wanted = Stored(DataProgress(0, 0, 40, 17970), 7, 11)
    settled, said = reconcile(STORED, wanted, 395)
    assert settled.progress.position(395) == 7900  # the example after the last trained
    assert settled.progress.position(396) == 7940  # then in batches of 40
    assert "train.batch_size is 40, the checkpoint's 20" in said
    assert "epoch 1, example 7,900 of 17,970" in said


@pytest.mark.parametrize("wanted, says", [
    (Stored(DataProgress(0, 0, 20, 17970), 8, 11), "data.seed 7 -> 8"),
    (Stored(DataProgress(0, 0, 20, 20000), 7, 11), "17,970 -> 20,000 examples"),
    (Stored(DataProgress(0, 0, 20, 17970), 7, 12), "other files"),
])
def test_other_data_or_seed_counts_the_epoch_under_way_as_done(wanted, says):
    settled, said = reconcile(STORED, wanted, 395)
    n = wanted.progress.num_examples
    assert settled.progress.position(395) == n  # the next epoch's first example
    assert (settled.seed, settled.files) == (wanted.seed, wanted.files)
    assert says in said and "training goes on at the start of epoch 2" in said


def test_a_checkpoint_from_before_the_data_position_is_one_line(tmp_path, graph):
    weights = tf.compat.v1.get_variable("w", [2])
    with tf.compat.v1.Session() as sess:
        sess.run(weights.initializer)
        tf.compat.v1.train.Saver([weights]).save(sess, str(tmp_path / "model.ckpt"))
    state = tf.compat.v1.get_variable("towers_data/base_step", [], tf.int64)
    with pytest.raises(checkpoints.CheckpointError) as raised:
        checkpoints.check_compatible(str(tmp_path), [weights, state])
    assert "written before towers saved the data position" in str(raised.value)
    assert "warm_start" in str(raised.value)


def worker_hook(wait_secs: float = 60.0):
    """A ps/worker worker's hook (it waits for the chief to settle the data state) on
    100 built-in examples in global batches of 10, its data.seed 2; and the state."""
    from launch.config import from_dict
    from launch.runtime.data_state import DataPositionHook, DataState
    from launch.runtime.hooks import LastStep
    from launch.runtime.inputs import training_input
    from launch.runtime.plan import make_plan

    job = from_dict({"model": {"name": "mlp"}, "data": {"num_examples": 100, "seed": 2},
                     "train": {"batch_size": 10}})
    data = training_input(make_plan(job), 10)
    step = tf.compat.v1.train.get_or_create_global_step()
    state = DataState(data, 10, 2, "/cpu:0")
    hook = DataPositionHook(state, data, step, None, LastStep(1000), rebases=False,
                            announce=False, wait_secs=wait_secs, resumed_from=None,
                            write=print)
    return hook, state, step


@pytest.mark.parametrize("seed, batch_size, says", [
    (1, 10, "the chief's -> this worker's: data.seed 1 -> 2"),
    (2, 20, "this worker's train.batch_size, 10, is not the chief's, 20"),
])
def test_a_worker_whose_data_or_batch_differ_from_the_chiefs_is_refused_once_the_chief_trains(
        graph, seed, batch_size, says):
    """The chief settles the state before its first step: once the global step moves on
    and the state is still not this worker's, it never will be, and a restart (138)
    would meet the same data again. So: one line, bad input (exit 2), no wait."""
    from launch.errors import BadInput

    hook, state, step = worker_hook()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        chiefs = Stored(DataProgress(0, 0, batch_size, 100), seed, state.wanted.files)
        state.write(sess, chiefs)
        sess.run(step.assign(3))  # the chief has trained since this worker's start, at 2
        with pytest.raises(BadInput) as raised:
            hook._settled(sess, 2, state.read(sess))
    assert says in str(raised.value), str(raised.value)


def test_a_worker_whose_data_are_the_chiefs_starts_at_the_steps_position(graph):
    hook, state, step = worker_hook(wait_secs=0)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(step.assign(3))
        hook.after_create_session(sess, None)
    assert hook.progress.position(3) == 30
