"""Ending this process at once, from any thread: the one place towers calls os._exit.

A worker's watch on its ps tasks (launch/distributed/liveness.py) and the stall watch
(launch/runtime/stall.py, train.stall_abort_secs) end a process
this way. Once a ps has been gone for the reconnect timeout, the worker's main thread
is inside MonitoredSession's retries of the lost session: C++ calls that neither an
exception raised in another thread nor a signal handler can interrupt. So the
watch's thread ends the process itself, with the status and the one error line
`towers` gives any failure.

What a hard exit skips, and what that loses:

- Buffered output: nothing. The error line is written and flushed to stderr, then
  stdout is flushed, before the process ends; every earlier log line was flushed as
  it was written (launch.log).
- `finally` blocks, `with` exits and atexit handlers do not run. The ones that would
  have mattered:
  - the chief's final checkpoint: the variables live on the ps tasks and one of them
    is gone, so nothing could be saved. The last checkpoint reported saved is intact
    (TensorFlow renames a checkpoint into place only once it is complete);
  - the metrics exporter: a failing task never waits for a final scrape
    (metrics.serve closes without one on any error), so it loses what any failure
    loses, the values set since the last scrape. Its port closes with the process;
  - the checkpoint directory's lock: an flock, which the operating system drops with
    the process (its file stays, naming this process, until the next holder rewrites it);
  - the worker's "finished" report to the ps tasks: not sent; they end by their own
    rule (liveness.ps_rule) once no worker answers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

from launch.errors import TowersError


def exit_now(error: TowersError) -> NoReturn:
    """End the process with `error`'s exit status after one `towers: error:` line."""
    _quietly(lambda: print(f"towers: error: {error}", file=sys.stderr, flush=True))
    _quietly(sys.stdout.flush)
    os._exit(error.exit_status)


def _quietly(write: Callable[[], None]) -> None:
    try:
        write()
    except (OSError, ValueError):  # a closed or broken stream must not keep the process alive
        pass
