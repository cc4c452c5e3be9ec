"""The progress line's step: the job's global step, also when a step did not move it."""

import tensorflow as tf

from launch.runtime.progress import ProgressHook

V1 = tf.compat.v1


def test_the_last_line_names_the_step_the_job_ended_at_after_an_update_that_was_dropped(graph):
    """A synchronous step whose gradient was dropped (train.backup_workers) leaves the
    global step where it was. The line written at that step counts it (fetched plus
    one: 5); the line the session's end writes names where the job stands (4), and so
    does the result, as the chief's final checkpoint does."""
    step = V1.train.get_or_create_global_step()
    loss = tf.constant(1.5)
    with tf.control_dependencies([loss]):
        applied, dropped = V1.assign_add(step, 1), tf.identity(step)
    lines = []
    progress = ProgressHook({"loss": loss}, step, 16, 100, 5, None, lines.append)
    with V1.train.MonitoredSession(hooks=[progress]) as sess:
        for _ in range(4):
            sess.run(applied)
        sess.run(dropped)
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert steps == [5, 4], lines
    assert progress.record.global_step == 4
    assert progress.record.loss == 1.5


def test_no_line_is_repeated_at_the_end_when_the_step_is_where_the_last_line_said(graph):
    step = V1.train.get_or_create_global_step()
    train_op = V1.assign_add(step, 1)
    lines = []
    progress = ProgressHook({"loss": tf.constant(1.0)}, step, 16, 100, 5, None, lines.append)
    with V1.train.MonitoredSession(hooks=[progress]) as sess:
        for _ in range(5):
            sess.run(train_op)
    assert [line.split()[1] for line in lines] == ["5/100"], lines


class _UpdateAfterTheSave(V1.train.SessionRunHook):
    """What a synchronous chief's queue runner may do as the session ends: apply one more
    update from the gradients other workers had sent, after the final checkpoint."""

    def __init__(self, step):
        self._late = V1.assign_add(step, 1)

    def end(self, session):
        session.run(self._late)


def test_the_chiefs_last_line_names_its_final_checkpoints_step(graph, tmp_path):
    from launch.runtime.checkpoints import LastSave

    step = V1.train.get_or_create_global_step()
    train_op = V1.assign_add(step, 1)
    lines, last_save = [], LastSave()
    progress = ProgressHook({"loss": tf.constant(1.0)}, step, 16, 100, 3, None, lines.append,
                            final_step=lambda: last_save.step)
    saver = V1.train.CheckpointSaverHook(str(tmp_path), save_steps=1000, listeners=[last_save])
    with V1.train.MonitoredTrainingSession(
            checkpoint_dir=str(tmp_path), hooks=[_UpdateAfterTheSave(step), progress],
            chief_only_hooks=[saver], save_checkpoint_secs=None, save_summaries_steps=None,
            log_step_count_steps=None) as sess:
        for _ in range(4):
            sess.run(train_op)
    final = int(tf.train.latest_checkpoint(str(tmp_path)).rsplit("-", 1)[1])
    assert final == 4 and last_save.step == 4
    assert lines[-1].startswith("step 4/100 "), lines
    assert progress.record.global_step == 4
