"""A Horovod job of 2 Gloo ranks with rank 1 stopped (SIGSTOP) past
train.stall_warning_secs: rank 0 names rank 1 within the warning time and a few seconds
(through horovodrun's rendezvous store, as Horovod's own check cannot see a frozen
rank); continued (SIGCONT), the job finishes with exit 0."""

import os
import re
import signal
import time

import pytest
from test_horovod import needs_horovod, start_horovodrun

WARNING_SECS = 3


def rank_pid(marker: str, rank: int) -> int:
    """The pid of the Horovod rank `rank` whose command line holds `marker` (horovodrun
    starts ranks in sessions of their own, so its process group does not hold them)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if marker.encode() in command and f"HOROVOD_RANK={rank}".encode() in env:
            return int(entry)
    raise AssertionError(f"no process of rank {rank}")


def wait_for(path, pattern, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        assert proc.poll() is None, path.read_text()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {pattern!r}\n{path.read_text()[-3000:]}")


@needs_horovod
@pytest.mark.e2e
def test_rank_0_names_a_stopped_rank_and_the_job_goes_on(tmp_path):
    log = tmp_path / "out"
    with open(log, "w") as out:
        proc = start_horovodrun(
            2, "train", "--backend", "horovod", "--set", "model.name=mlp",
            "--set", "model.hidden_units=[32]", "--set", "data.source=synthetic",
            "--set", "train.batch_size=64", "--set", "train.steps=400",
            "--set", "train.log_every_steps=50",
            "--set", f"train.stall_warning_secs={WARNING_SECS}",
            "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}", output=out)
        try:
            wait_for(log, r"step 100/400", proc)
            rank1 = rank_pid(str(tmp_path / "ckpt"), 1)
            stopped = time.monotonic()
            os.kill(rank1, signal.SIGSTOP)
            line = wait_for(log, r"towers: no step has finished for .*", proc).group(0)
            after = time.monotonic() - stopped
            os.kill(rank1, signal.SIGCONT)
            assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    print(line, f"(after {after:.1f} s)")
    assert line.startswith(f"towers: no step has finished for {WARNING_SECS} s "
                           f"(train.stall_warning_secs: {WARNING_SECS}): ranks not reporting: "
                           "rank 1 (silent for ")
    assert after < WARNING_SECS + 5
    assert "steps go on again after" in log.read_text()
