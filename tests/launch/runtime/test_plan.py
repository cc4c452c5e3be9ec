"""The plan: the job's batch checked against the towers once their number is known; the
update mode resolved once, from the in-process sharing and the cross-process reduction."""

import dataclasses

import pytest
import tensorflow as tf

import towers
from launch.config import from_dict
from launch.errors import EXIT_BAD_INPUT
from launch.runtime.plan import BatchSizeError, Share, make_plan
from launch.runtime.training_graph import build_training_graph

SMALL = {"model": {"name": "mlp", "input_dim": 4, "hidden_units": [4]},
         "data": {"source": "synthetic"}}


@pytest.mark.parametrize("towers_cfg, train, message", [
    ({"devices": 2}, {"batch_size": 6, "accumulate_steps": 4},
     "a global batch of 6 examples cannot give each of 2 towers at least one example of each "
     "of 4 micro-batches; it needs at least 8"),
    ({"devices": 4}, {"batch_size": 2},
     "a global batch of 2 examples cannot give each of 4 towers at least one example"),
])
def test_a_batch_too_small_for_the_towers_the_job_names_is_refused(towers_cfg, train, message):
    job = from_dict({**SMALL, "towers": towers_cfg, "train": train})
    with pytest.raises(BatchSizeError, match=f"^train.batch_size: {message}"):
        make_plan(job)


def test_auto_devices_are_counted_once_resolved():
    """The job file names no tower count (auto: two CPU towers here); the plan, knowing
    the towers, refuses 3 examples in 2 micro-batches."""
    job = from_dict({**SMALL, "train": {"batch_size": 3, "accumulate_steps": 2}})
    with pytest.raises(BatchSizeError) as raised:
        make_plan(job)
    assert str(raised.value) == (
        "train.batch_size: a global batch of 3 examples cannot give each of 2 towers at least "
        "one example of each of 2 micro-batches; it needs at least 4")
    assert raised.value.exit_status == EXIT_BAD_INPUT


def test_every_process_sharing_the_batch_needs_its_towers_fed():
    job = from_dict({**SMALL, "towers": {"devices": 2}, "train": {"batch_size": 6}})
    assert [make_plan(job, Share(i, 3)).process_batch_size for i in range(3)] == [2, 2, 2]
    with pytest.raises(BatchSizeError, match="each of 2 towers in each of 4 processes"):
        make_plan(job, Share(0, 4))


def test_horovod_ranks_share_their_towers_as_parameter_server_and_reduce_across():
    job = from_dict({**SMALL, "towers": {"variable_update": "horovod", "devices": 1}})
    plan = make_plan(job)
    assert plan.sharing == "parameter_server"
    # As launch.distributed.horovod.rank_plan makes it: Horovod fuses tensors itself.
    rank = dataclasses.replace(plan, reduce_gradients=lambda values: values, pack_bytes=0)
    mode = rank.variable_update()
    assert isinstance(mode, towers.CrossProcess) and mode.reduce is rank.reduce_gradients
    assert isinstance(mode.within, towers.ParameterServer)


def test_the_jobs_pack_size_reaches_the_reduction_across_processes_and_not_the_push():
    job = from_dict({**SMALL, "towers": {"devices": 1, "pack_gradients_bytes": 1024}})
    plan = make_plan(job)
    assert plan.pack_bytes == 1024
    across = dataclasses.replace(plan, reduce_gradients=lambda values: values)
    mode = across.variable_update()
    assert mode.reduce is not across.reduce_gradients  # wrapped: towers.packed
    assert mode.within.pack_bytes == 0  # measured slower on the push to ps tasks


@pytest.mark.parametrize("towers_cfg, step_device", [
    ({"param_device": "cpu"}, "/device:CPU:0"),
    ({"param_device": "/cpu:1"}, "/device:CPU:1"),
    ({"param_device": "least_loaded"}, "/device:CPU:0"),
    ({"variable_update": "replicated"}, "/device:CPU:0"),
])
def test_the_global_step_is_where_the_update_mode_keeps_it(graph, towers_cfg, step_device):
    job = from_dict({**SMALL, "towers": {"devices": 2, **towers_cfg}})
    ops = build_training_graph(job, make_plan(job)).ops
    assert ops.global_step.device == step_device
    assert tf.compat.v1.train.get_global_step() is ops.global_step


@pytest.mark.parametrize("towers_cfg", [{"devices": 1}, {"devices": 2},
                                        {"devices": 2, "variable_update": "replicated"}])
def test_a_process_that_alone_initialises_its_variables_does_not_check_them(graph, towers_cfg):
    """The scaffold's default readiness checks, two session runs over every variable,
    find nothing where no other process initialises them: 0.4-0.5 s of a 2-tower
    resnet20 start on a loaded CPU. Here the check reports nothing with no variable
    initialised; a worker of ps tasks keeps it (test_cluster.py)."""
    job = from_dict({**SMALL, "towers": towers_cfg})
    plan = make_plan(job)
    scaffold = build_training_graph(job, plan).scaffold
    scaffold.finalize()
    with tf.compat.v1.Session(config=plan.session) as session:
        assert list(session.run(scaffold.ready_op)) == []
        assert list(session.run(scaffold.ready_for_local_init_op)) == []
