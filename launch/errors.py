"""Exit statuses and the errors that map to them: the one place `towers` decides how a run ends.

Every failure that is not a bug is a `TowersError` subclass carrying its exit status, so
the command line needs one `except` clause, and lower layers never import it.

    0 done, or stopped by a signal after saving
    1 an internal error (a bug: the traceback is shown)
    2 bad input: job file, flags, data, devices, checkpoint directory, ports
    3 diverged: a non-finite loss or gradient, never applied
    4 a resource failed mid-run (a checkpoint write); the previous checkpoint is intact
    5 out of memory: a device could not hold the step (the batch per tower too large);
        nothing was saved after the latest checkpoint
    6 towers verify: the towers differ from one device beyond a variable's tolerance
    138 a peer task of a ps/worker job could not be reached in time, or no step
        finished for train.stall_abort_secs (retryable)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_BUG = 1
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_RESOURCE = 4
EXIT_OUT_OF_MEMORY = 5
EXIT_NOT_EQUIVALENT = 6
# Retryable. 138 (128 + SIGUSR1) is the code Kubeflow's TFJob `restartPolicy:
# ExitCode` reserves for a user-defined retryable error; it treats 1-127 as
# permanent, so a small code here would never be retried there.
EXIT_PEER_UNAVAILABLE = 138


class TowersError(Exception):
    """A failure that is not a bug: the run ends with `exit_status` and one line."""

    exit_status = EXIT_BUG


class BadInput(TowersError, ValueError):
    """Something the user gave cannot work (job file, flags, data, devices, paths, ports).

    Raised before anything is written. Each concern has its own subclass
    (ConfigError, DataError, ...) so a caller can tell them apart.
    """

    exit_status = EXIT_BAD_INPUT


class Diverged(TowersError, RuntimeError):
    """A step's loss or gradient was NaN or infinite; the job stops without saving it."""

    exit_status = EXIT_DIVERGED


class ResourceFailed(TowersError, RuntimeError):
    """A write into checkpoint_dir failed mid-run (disk full, directory read-only or gone)."""

    exit_status = EXIT_RESOURCE


class OutOfMemory(TowersError, RuntimeError):
    """A device could not hold what a step computes: a smaller batch per tower fits."""

    exit_status = EXIT_OUT_OF_MEMORY


class PeerUnavailable(TowersError, RuntimeError):
    """A peer task never answered within its deadline: worth retrying, not bad input."""

    exit_status = EXIT_PEER_UNAVAILABLE


class Stalled(PeerUnavailable):
    """No step finished for train.stall_abort_secs: retryable, like a lost peer (a
    restart resumes from the last checkpoint)."""
