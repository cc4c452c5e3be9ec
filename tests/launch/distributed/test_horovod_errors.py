"""How a Horovod rank's training ends when another rank leaves the job: the errors its
collectives raise, each mapped to 138 and one line (docs/faults.md)."""

import pytest
import tensorflow as tf

from launch.distributed.arrangements.horovod import ranks_leaving
from launch.errors import EXIT_PEER_UNAVAILABLE, PeerUnavailable

# Horovod's own, once the rank that left has shut it down.
SHUT_DOWN = "Horovod has been shut down. This was caused by an exception on one of the ranks"

# Gloo's, as the other rank was killed mid-exchange (soak horovod seed 629: a traceback
# and exit 1 before horovodrun ended the rank).
RESET = ("[/tmp/tmp.gb9j5TvpiX/horovod-0.28.1/third_party/compatible17_gloo/gloo/transport/"
         "tcp/pair.cc:589] Read error [127.0.0.1]:15284: Connection reset by peer")


def _ending(error: tf.errors.OpError) -> BaseException:
    with pytest.raises(BaseException) as raised:
        with ranks_leaving(1):
            raise error
    return raised.value


@pytest.mark.parametrize("message", [SHUT_DOWN, RESET], ids=["shut-down", "gloo-reset"])
def test_a_collective_failed_by_a_rank_that_left_ends_with_138(message):
    error = _ending(tf.errors.UnknownError(None, None, message))
    assert isinstance(error, PeerUnavailable), error
    assert error.exit_status == EXIT_PEER_UNAVAILABLE
    assert "rank 1's collective failed: another rank has left the job" in str(error)


def test_another_error_is_left_as_it_is():
    error = _ending(tf.errors.UnknownError(None, None, "Read error in a user's own op"))
    assert isinstance(error, tf.errors.UnknownError)
