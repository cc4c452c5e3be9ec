"""An asynchronous ps/worker job's worker positions (launch.runtime.worker_positions), in
this process on one device: what a checkpoint keeps of them, how they restore into a
job of the same or another number of workers or from a checkpoint without them, and
how a worker's input follows its own position: at the start, step by step, and when a
checkpoint is restored under it (a chief restarted alone)."""

import os

import pytest
import tensorflow as tf

from launch.config import from_dict
from launch.errors import EXIT_PEER_UNAVAILABLE, PeerUnavailable
from launch.runtime import checkpoints
from launch.runtime.data_state import DataPositionHook, DataState
from launch.runtime.hooks import LastStep
from launch.runtime.inputs import training_input
from launch.runtime.plan import make_plan
from launch.runtime.positions_saver import positions_saver
from launch.runtime.worker_positions import WorkerPositions

V1 = tf.compat.v1
BATCH, ROWS = 10, 100  # 10 global batches a pass


def feed():
    job = from_dict({"model": {"name": "mlp"}, "data": {"num_examples": ROWS, "seed": 2},
                     "train": {"batch_size": BATCH}})
    return training_input(make_plan(job), BATCH)


def job_graph(workers, rank=0):
    """The pieces of an asynchronous job's graph the positions touch: its input, step,
    data state, positions (``workers``, this one ``rank``), one weight and the Saver."""
    data = feed()
    step = V1.train.get_or_create_global_step()
    state = DataState(data, BATCH, 2, "/cpu:0")
    positions = WorkerPositions(workers, rank, BATCH, "/cpu:0")
    V1.get_variable("w", [2])
    train = positions.advanced_by(tf.group(data.features, step.assign_add(1)))
    return data, step, state, positions, train, positions_saver(positions, state, step)


def saved_by(ckpt, workers, live, step=7):
    """A checkpoint of a job of ``workers`` whose positions were ``live`` at step
    ``step``; its path."""
    with tf.Graph().as_default():
        _, global_step, _, positions, _, saver = job_graph(workers)
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            sess.run(global_step.assign(step))
            positions.set(sess, live)
            return saver.save(sess, str(ckpt / "model.ckpt"), global_step=step)


def test_a_checkpoint_keeps_the_positions_and_moves_the_data_base_to_the_lowest(tmp_path):
    path = saved_by(tmp_path, 2, [60, 40])
    assert tf.train.load_variable(path, "towers_data/worker_positions").tolist() == [60, 40]
    assert tf.train.load_variable(path, "towers_data/base_position") == 40
    assert tf.train.load_variable(path, "towers_data/base_step") == 7
    names = [name for name, _ in tf.train.list_variables(path)]
    assert "towers_data/worker_positions_live" not in names


def restored(path, workers):
    """The live positions a job of ``workers`` restores from ``path``, and what it says
    it found (None: each worker its own)."""
    with tf.Graph().as_default():
        _, _, _, positions, _, saver = job_graph(workers)
        checkpoints.check_compatible(os.path.dirname(path))  # no refusal: restored apart
        with V1.Session() as sess:
            saver.restore(sess, str(path))
            return positions.read(sess), positions.restored


def test_the_same_number_of_workers_restores_each_its_own(tmp_path):
    assert restored(saved_by(tmp_path, 2, [60, 40]), 2) == ([60, 40], None)


def test_another_number_of_workers_restores_every_one_at_the_lowest(tmp_path):
    path = saved_by(tmp_path, 2, [60, 40])
    assert restored(path, 3) == ([40, 40, 40], [60, 40])
    assert restored(path, 1)[0] == [40]


def test_a_checkpoint_without_positions_restores_them_at_its_data_position(tmp_path):
    with tf.Graph().as_default():  # a synchronous job's: no positions, at step 5
        step = V1.train.get_or_create_global_step()
        state = DataState(feed(), BATCH, 2, "/cpu:0")
        V1.get_variable("w", [2])
        with V1.Session() as sess:
            sess.run(V1.global_variables_initializer())
            sess.run(step.assign(5))
            path = V1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=5)
    assert state.wanted.progress.position(5) == 50
    assert restored(path, 2) == ([50, 50], None)


def run_worker(positions_at, steps, restore_to=None, restore_after=None):
    """Worker 1 of 2 starting with the positions ``positions_at``: the positions of each
    batch its steps take; ``restore_to``: positions set under it after ``restore_after``
    steps (as a chief's restore would)."""
    data, step, state, positions, train, _ = job_graph(2, rank=1)
    hook = DataPositionHook(state, data, step, 1, LastStep(1000), rebases=True,
                            announce=False, wait_secs=0, resumed_from=None, write=print,
                            positions=positions)
    taken = []
    with V1.train.MonitoredSession(hooks=[hook]) as sess:
        raw = sess._tf_sess()
        positions.set(raw, positions_at)
        hook.after_create_session(raw, None)  # as at a start from these positions
        for i in range(steps):
            if i == restore_after:
                positions.set(raw, restore_to)
            taken.append(sess.run([train, data.positions])[1][0])
        return taken, positions.read(raw), hook


def test_a_worker_starts_at_its_own_position_and_moves_it_by_a_global_batch(graph):
    taken, now, hook = run_worker([20, 50], 3)
    # its part of the global batches at 50, 60, 70 (one process: the whole batch)
    assert taken == [50, 60, 70] and now == [20, 80]
    assert hook.batches == 5  # of the pass's 10, from position 50
    # the 2 global batches before 20, and worker 1's 5 of each of the 6 from 20 to 80
    assert hook.examples_trained(0) == 20 + 6 * 5


def test_a_worker_whose_position_is_restored_under_it_goes_on_there(graph):
    taken, now, _ = run_worker([20, 50], 4, restore_to=[20, 30], restore_after=2)
    # steps at 50 and 60; then the restore to 30; the step after it took 70 (its input
    # ran on) and moved the position to 40: the worker goes on a batch before, at 30
    assert taken == [50, 60, 70, 30]
    assert now == [20, 40]


def wait_at_the_end(graph, moves: tuple[int, int] | None, wait_secs: float = 30.0,
                    lose_ps: bool = False, gone_first: bool = False, stopped: bool = False):
    """Worker 0 of 2, its parts of the pass (10 global batches) done, worker 1's one part
    short; ``moves``: (worker, position) a thread sets while it waits (worker 1 trains
    its part, or a checkpoint restored under worker 0 puts one of its own back);
    ``lose_ps``: the positions' variable is gone meanwhile, as on a ps lost or started
    again. What the hook's end said, whether it stopped the stall watch, the positions
    after it, and the hook."""
    import threading

    from launch.runtime.worker_positions import OthersPartsHook

    positions = WorkerPositions(2, 0, BATCH, "/cpu:0")
    lines, stopped_watch = [], []
    left = lambda now: [max(ROWS - p, 0) // BATCH for p in now]  # noqa: E731
    hook = OthersPartsHook(positions, left, lambda: stopped, wait_secs, lines.append,
                           on_wait=lambda: stopped_watch.append(True))
    with V1.Session(graph=graph) as sess:
        sess.run(V1.global_variables_initializer())
        positions.set(sess, [ROWS, ROWS - BATCH])
        if gone_first:  # lost before the session's end, as the worker's stop arrived
            sess.run(tf.raw_ops.DestroyResourceOp(resource=positions.live.handle))
            hook.end(sess)
            return lines, stopped_watch, None, hook
        if moves is not None:
            move = V1.scatter_update(positions.live, [moves[0]], [moves[1]])
            threading.Timer(0.3, lambda: sess.run(move)).start()
        if lose_ps:
            gone = tf.raw_ops.DestroyResourceOp(resource=positions.live.handle)
            threading.Timer(0.3, lambda: sess.run(gone)).start()
            hook.end(sess)
            return lines, stopped_watch, None, hook
        hook.end(sess)
        return lines, stopped_watch, positions.read(sess), hook


def test_a_worker_done_with_its_parts_waits_for_the_others(graph):
    lines, stopped_watch, now, hook = wait_at_the_end(graph, moves=(1, ROWS))
    assert now == [ROWS, ROWS] and stopped_watch
    assert lines == ["1 part(s) of the data's passes left to the other workers: waiting "
                     "for them"]
    hook.check_trained()  # every part trained: the worker ends 0


def test_it_stops_waiting_when_the_positions_stand_still_and_ends_with_138(graph):
    """Exit 0 here told the soak's supervisor (and would tell an orchestrator) that the
    job was done with parts of its data never trained (soak async seed 100)."""
    lines, _, now, hook = wait_at_the_end(graph, moves=None, wait_secs=0.6)
    assert now == [ROWS, ROWS - BATCH]
    assert "stood still for 0.6 s with 1 part(s) left" in lines[-1]
    with pytest.raises(PeerUnavailable, match=r"1 part\(s\) of the data's passes were not "
                       "trained") as raised:
        hook.check_trained()
    assert raised.value.exit_status == EXIT_PEER_UNAVAILABLE


def test_a_restore_that_puts_back_its_own_parts_ends_the_wait_with_138(graph):
    """A chief restarted alone restored a checkpoint under this worker: its own parts are
    left again, and no one else trains them (before: it waited on, then ended 0)."""
    _, _, now, hook = wait_at_the_end(graph, moves=(0, ROWS - BATCH))
    assert now == [ROWS - BATCH, ROWS - BATCH]
    with pytest.raises(PeerUnavailable, match="put back parts of its own"):
        hook.check_trained()


def test_a_ps_lost_while_it_waits_ends_the_wait_with_138(graph):
    with pytest.raises(PeerUnavailable, match="ps holding the workers' positions was lost"):
        wait_at_the_end(graph, moves=None, lose_ps=True)


def test_a_ps_lost_before_the_end_ends_it_with_138(graph):
    with pytest.raises(PeerUnavailable, match="ps holding the workers' positions was lost"):
        wait_at_the_end(graph, moves=None, gone_first=True)


def test_a_stopped_worker_ends_without_reading_the_positions_of_a_ps_gone_with_it(graph):
    """The soak (async seed 721): SIGTERM to both workers as ps 0 was killed; the stopped
    chief's end read the positions from the dead ps: a traceback and exit 1."""
    lines, stopped_watch, _, hook = wait_at_the_end(graph, moves=None, gone_first=True,
                                                    stopped=True)
    assert lines == [] and not stopped_watch and hook.untrained is None


def test_the_resume_line_says_where_the_workers_start_and_what_is_trained_again(tmp_path):
    path = saved_by(tmp_path, 2, [60, 40])
    lines = []
    with tf.Graph().as_default():
        data, step, state, positions, _, saver = job_graph(3)
        hook = DataPositionHook(state, data, step, 1, LastStep(1000), rebases=True,
                                announce=True, wait_secs=0, resumed_from=path,
                                write=lines.append, positions=positions)
        with V1.Session() as sess:
            saver.restore(sess, path)
            hook.after_create_session(sess, None)
    # worker 0 was 2 global batches ahead: its 5 examples of each, trained again
    assert lines == [f"resuming from {path} at step 7: epoch 1 of 1, example 40 of 100; "
                     "the checkpoint's 2 workers stood at positions 60, 40: each of the 3 "
                     "starts at the lowest, and the 10 examples trained beyond it are "
                     "trained again"]
