"""A checkpoint directory whose state file names checkpoints that are all gone (soak
collective seed 304: the newest deleted between runs, no older one): the start says it
begins from scratch, and it must, instead of restoring from the state file and failing
at every restart."""

import os

import tensorflow as tf

from launch.runtime import checkpoints

V1 = tf.compat.v1


def test_a_state_file_naming_only_gone_checkpoints_is_set_aside_and_the_session_starts(
        tmp_path, graph):
    ckpt = str(tmp_path / "ckpt")
    weight = V1.get_variable("w", initializer=1.0)
    saver = V1.train.Saver()
    with V1.Session() as session:
        session.run(weight.initializer)
        saved = saver.save(session, os.path.join(ckpt, "model.ckpt"), global_step=0)
    for name in os.listdir(ckpt):
        if name.startswith("model.ckpt-0."):
            os.remove(os.path.join(ckpt, name))
    lines = []

    assert checkpoints.fall_back_to_restorable(ckpt, lines.append) is None

    assert lines[-1].endswith("starting from scratch"), lines
    assert V1.train.get_checkpoint_state(ckpt) is None
    # What a training session does with the directory: restore from its state file if
    # it names a checkpoint, else initialise. It failed here ("not a valid checkpoint").
    session = V1.train.SessionManager().prepare_session(
        "", saver=saver, checkpoint_dir=ckpt, init_op=V1.global_variables_initializer())
    assert session.run(weight) == 1.0
    session.close()
    aside = os.path.join(ckpt, checkpoints.UNRESTORABLE_DIR, checkpoints.STATE_FILE)
    assert os.path.basename(saved) in open(aside).read()  # nothing lost: set aside
