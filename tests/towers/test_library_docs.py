"""What docs/library.md ("As a library") tells a library user holds: its recipes run,
and the equivalence the README promises is qualified where it is made."""

import os

import tensorflow as tf
from conftest import cpu_session_config
from helpers.doc_pages import snippet

import towers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_the_monitored_training_session_recipe_trains_and_resumes_from_its_checkpoint(
        tmp_path):
    with tf.Graph().as_default():
        names: dict = {}
        exec(snippet("towers.build_train_op"), names)  # the example, in replicated mode
        names["two_cpus"] = cpu_session_config(2)
        exec(snippet("MonitoredTrainingSession"), names)
        assert names["train"](str(tmp_path), 2) == 2
        # A new session restores the checkpoint: only a sync after the restore fills the
        # replicas, or the first step fails saying they were never filled.
        assert names["train"](str(tmp_path), 4) == 4


def test_the_equivalence_promise_names_per_tower_batch_norm_where_it_is_made():
    opening = readme().split("\n## ", 1)[0]
    assert "single-device training on the whole batch" in opening
    assert "batch norm" in opening and "towers.batch_norm: sync" in opening
    doc = towers.build_train_op.__doc__
    assert "equals a single-device step on the whole batch" in doc
    assert 'batch_norm="local"' in doc.split("equals a single-device step", 1)[1][:200]
