"""Where towers keeps what it measured or checked once per machine, so later runs need
not again: $TOWERS_CACHE_DIR, else $XDG_CACHE_HOME/towers (~/.cache/towers). Each user
keeps a file of its own there (launch.kernels' timings, launch.data's checked records).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator

CACHE_ENV = "TOWERS_CACHE_DIR"


def cache_dir(given: str | None = None) -> str:
    """`given`, else $TOWERS_CACHE_DIR, else $XDG_CACHE_HOME/towers (~/.cache/towers)."""
    return given or os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "towers")


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """`path`'s lock held (a file beside it), so the processes of one job starting
    together take turns; unlocked if it cannot be made (a read-only home)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = open(path + ".lock", "a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_json(path: str) -> dict:
    """The JSON object kept in `path`; {} if it is missing, unreadable or not one."""
    try:
        with open(path) as f:
            found = json.load(f)
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json(path: str, value: dict) -> str | None:
    """Writes `value` whole (a reader never sees half a file); the path, or None if it
    could not be written."""
    try:
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(handle, "w") as f:
            json.dump(value, f, indent=1, sort_keys=True)
        os.replace(temporary, path)
        return path
    except OSError:
        return None
