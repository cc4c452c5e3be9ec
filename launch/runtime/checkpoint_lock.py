"""One writer per checkpoint directory: the process that writes checkpoint_dir holds an
flock on LOCK_FILE inside it, and others can ask who holds it."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
from collections.abc import Callable, Iterator

from launch.runtime.checkpoints import CheckpointError, unwritable

LOCK_FILE = ".towers.lock"  # held by the process writing checkpoint_dir; see hold()


@contextlib.contextmanager
def hold(checkpoint_dir: str, write: Callable[[str], None]) -> Iterator[None]:
    """Hold checkpoint_dir for this process's writes while in the block; if another
    process holds it, raise CheckpointError naming it (host, pid, since when).

    An exclusive flock on LOCK_FILE, which the holder then fills with its name. The OS
    drops the lock with the process however it ends (kill -9 too), so a holder that
    died never blocks a restart. flock, not lockf: a second open of the file conflicts
    even in the same process. A loser only reads the file. The holder removes it before
    letting go, so an ended run leaves nothing behind; a newcomer that opened it just
    before keeps its lock only if the name still leads to that file. Where the file
    system has no locks: one line, and no lock.
    """
    path = os.path.join(checkpoint_dir, LOCK_FILE)
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)
        fd = _lock(path, checkpoint_dir, write)
    except CheckpointError:
        raise
    except OSError as err:  # the disk full (or gone) as the job starts: as a failed save
        raise unwritable(checkpoint_dir, err.strerror or str(err)) from None
    try:
        if fd is not None:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, _holder().encode(), 0)
            except OSError as err:
                raise unwritable(checkpoint_dir, err.strerror or str(err)) from None
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)  # while still holding it: see _lock
            os.close(fd)


# flock's errors on a file system without locks (NFSv3 with no lock manager to reach,
# say); EOPNOTSUPP is ENOTSUP on Linux.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def _lock(path: str, checkpoint_dir: str, write: Callable[[str], None]) -> int | None:
    """The open lock file, locked; None where the file system has no locks."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never O_TRUNC: it names the holder
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 1024, 0).decode(errors="replace").strip()
            os.close(fd)
            # EACCES: byte-range locks (NFS's emulation of flock) may refuse with it.
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise CheckpointError(
                    f"train.checkpoint_dir: {checkpoint_dir} is in use by "
                    f"{holder or 'another process'}; wait for it to end (or stop it), or set "
                    "another train.checkpoint_dir"
                ) from None
            if err.errno not in _NO_LOCKS:
                raise
            with contextlib.suppress(OSError):
                os.unlink(path)
            write(f"warning: train.checkpoint_dir: {checkpoint_dir} cannot be locked "
                  f"({os.strerror(err.errno)}); nothing stops a second job writing into it")
            return None
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its holder removed it after we opened it: lock the new one


def _same_file(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino)


def _holder() -> str:
    since = datetime.datetime.now().astimezone().isoformat(sep=" ", timespec="seconds")
    return f"towers pid {os.getpid()} on host {socket.gethostname()} (since {since})\n"


def holder(checkpoint_dir: str) -> str | None:
    """Who holds checkpoint_dir, as its lock file names them; None when no one does (the
    holder removes the file as it ends; one killed leaves it, unlocked, until the next)."""
    try:
        with open(os.path.join(checkpoint_dir, LOCK_FILE)) as f:
            return f.read().strip() or "a trainer"
    except FileNotFoundError:
        return None
