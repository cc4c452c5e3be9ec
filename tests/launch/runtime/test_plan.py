"""The plan: the job's batch checked against the towers once their number is known."""

import pytest

from launch.config import from_dict
from launch.errors import EXIT_BAD_INPUT
from launch.runtime.plan import BatchSizeError, make_plan

SMALL = {"model": {"name": "mlp", "input_dim": 4, "hidden_units": [4]},
         "data": {"source": "synthetic"}}


def test_auto_devices_are_counted_once_resolved():
    """The job file names no tower count (auto: two CPU towers here), so the file's own
    check passes 3 examples in 2 micro-batches; the plan, knowing the towers, does not."""
    job = from_dict({**SMALL, "train": {"batch_size": 3, "accumulate_steps": 2}})
    with pytest.raises(BatchSizeError) as raised:
        make_plan(job)
    assert str(raised.value) == (
        "train.batch_size: a global batch of 3 examples cannot give each of 2 towers at least "
        "one example of each of 2 micro-batches; it needs at least 4")
    assert raised.value.exit_status == EXIT_BAD_INPUT


def test_every_process_sharing_the_batch_needs_its_towers_fed():
    job = from_dict({**SMALL, "towers": {"devices": 2}, "train": {"batch_size": 6}})
    assert make_plan(job, processes=3).batch_size == 6
    with pytest.raises(BatchSizeError, match="each of 2 towers in each of 4 processes"):
        make_plan(job, processes=4)
