"""How a collective worker's training ends when a peer fails it: the errors TensorFlow
raises, each mapped to its exit status and one line (docs/faults.md)."""

import pytest
import tensorflow as tf

from launch.config import from_dict
from launch.distributed.arrangements.collective import peer_failures
from launch.distributed.cluster import Task
from launch.distributed.health.step_deadline import StepDeadline
from launch.distributed.ports import free_ports
from launch.errors import EXIT_PEER_UNAVAILABLE, PeerUnavailable

# As a worker restarted under a leader that had not restarted met it (soak collective
# seed 103: a traceback and exit 1).
STALE_GROUP = (
    "Collective ops is aborted by: Device /job:worker/replica:0/task:1/device:CPU:0 current "
    "incarnation doesn't match with one in the group. This usually means this worker has "
    "restarted but the collective leader hasn't, or this worker connects to a wrong cluster.")

# As the leader's step met that restarted worker's reply (a one-off run: the chief frozen
# while worker 1 was killed and started again; exit 1 and a traceback).
STALE_REPLY = (
    "From /job:worker/replica:0/task:0:\nRecvBuf expects a different device incarnation: "
    "5933811734459648091 vs. 17827414500908030027. Your worker job that contains the device "
    '("/job:worker/replica:0/task:1/device:CPU:0") was probably restarted. Check your worker '
    "job for the reason why it was restarted.")

# As a worker asked its restarted leader to resolve their group (soak collective seed
# 509: worker 0 killed and started again while worker 1 ran on; exit 1, a traceback).
STALE_LEADER = (
    "From /job:worker/replica:0/task:1:\nCollective ops is aborted by: group 1 failed to "
    "resolve. This normally means the server has restarted\nAdditional GRPC error "
    "information from remote target /job:worker/replica:0/task:0 while calling "
    "/tensorflow.WorkerService/CompleteInstance:\n:UNKNOWN:Error received from peer  "
    '{grpc_message:"group 1 failed to resolve. This normally means the server has '
    'restarted", grpc_status:9}\nThe error could be from a previous operation. Restart '
    "your program to reset.\n\t [[{{node collective_all_reduce/CollectiveGather}}]]")


def _task() -> Task:
    # Ports nothing listens on: a peer that does not answer is found at once.
    hosts = [f"127.0.0.1:{port}" for port in free_ports(2)]
    return Task({"worker": hosts}, "worker", 1)


def _ending(error: tf.errors.OpError) -> BaseException:
    task = _task()
    with pytest.raises(BaseException) as raised:
        with peer_failures(task, StepDeadline(from_dict({}).cluster)):
            raise error
    return raised.value


@pytest.mark.parametrize("message, restarted", [
    (STALE_GROUP, "/job:worker/replica:0/task:1/device:CPU:0"),
    (STALE_REPLY, "/job:worker/replica:0/task:1/device:CPU:0"),
    (STALE_LEADER, "/job:worker/replica:0/task:0 "),
], ids=["group", "reply", "leader"])
def test_a_collective_that_met_a_restarted_worker_ends_with_138_naming_it(message, restarted):
    error = _ending(tf.errors.FailedPreconditionError(None, None, message))
    assert isinstance(error, PeerUnavailable), error
    assert error.exit_status == EXIT_PEER_UNAVAILABLE
    assert restarted in str(error)
    assert "\n" not in str(error)


def test_a_step_past_its_deadline_ends_with_138():
    error = _ending(tf.errors.DeadlineExceededError(None, None, "Timed out waiting"))
    assert isinstance(error, PeerUnavailable) and "startup_timeout_secs" in str(error)


def test_another_failed_precondition_is_left_as_it_is():
    error = _ending(tf.errors.FailedPreconditionError(None, None, "uninitialized value w"))
    assert isinstance(error, tf.errors.FailedPreconditionError)
