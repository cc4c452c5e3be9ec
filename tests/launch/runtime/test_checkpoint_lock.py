"""One writer per checkpoint directory: checkpoint_lock.hold, in this process. The real
commands racing for a directory, and a holder killed with SIGKILL, are in test_faults.py."""

import errno
import fcntl
import os
import socket

import pytest
from helpers.commands import ok, run_in_process

from launch.runtime import checkpoints
from launch.runtime.checkpoint_lock import LOCK_FILE, hold
from launch.runtime.checkpoints import CheckpointError


def files(directory):
    return sorted(os.listdir(directory))


def test_a_second_holder_is_refused_naming_the_first_even_in_the_same_process(tmp_path):
    # flock belongs to the open file, not the process: a second open conflicts too.
    ckpt = tmp_path / "ckpt"
    with hold(str(ckpt), print):
        named = (ckpt / LOCK_FILE).read_text()
        with pytest.raises(CheckpointError) as refused, hold(str(ckpt), print):
            pytest.fail("took a directory already held")
        assert (ckpt / LOCK_FILE).read_text() == named  # the loser only read it
    message = str(refused.value)
    assert message.startswith(f"train.checkpoint_dir: {ckpt} is in use by towers pid "
                              f"{os.getpid()} on host {socket.gethostname()} (since ")
    assert "\n" not in message and "another train.checkpoint_dir" in message
    assert refused.value.exit_status == 2


def test_releasing_it_removes_the_lock_file_and_lets_another_take_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    with hold(str(ckpt), print):
        assert files(ckpt) == [LOCK_FILE]
    assert files(ckpt) == []
    with hold(str(ckpt), print):
        pass


def test_the_file_of_a_holder_that_died_does_not_block(tmp_path):
    # What a kill -9 leaves: the file naming it, with no lock on it any more.
    (tmp_path / LOCK_FILE).write_text("towers pid 4242 on host gone (since then)\n")
    with hold(str(tmp_path), print):
        assert f"pid {os.getpid()} " in (tmp_path / LOCK_FILE).read_text()


def test_a_holder_that_has_not_yet_named_itself_is_another_process(tmp_path):
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(CheckpointError, match="is in use by another process; "):
            with hold(str(tmp_path), print):
                pass
    finally:
        os.close(fd)


def test_a_file_system_without_locks_gets_one_warning_and_no_lock(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    said = []
    with hold(str(tmp_path), said.append):
        assert files(tmp_path) == []
    assert len(said) == 1 and said[0].startswith(f"warning: train.checkpoint_dir: {tmp_path} "
                                                 "cannot be locked (No locks available)")


MLP = ["--set", "model.name=mlp", "--set", "model.input_dim=8", "--set", "model.num_classes=2",
       "--set", "model.hidden_units=[4]", "--set", "train.batch_size=8",
       "--set", "data.source=synthetic", "--set", "eval.steps=1", "--set", "eval.batch_size=8"]


def test_a_held_directory_stops_a_trainer_but_not_its_readers(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = [*MLP, "--set", f"train.checkpoint_dir={ckpt}", "--set", "train.steps=2"]
    ok(run_in_process("train", *job))
    before = files(ckpt)
    with hold(str(ckpt), print):
        refused = run_in_process("train", *job, "--set", "train.steps=4")
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.count("\n") == 1 and f"pid {os.getpid()}" in refused.stderr
        assert files(ckpt) == sorted([*before, LOCK_FILE])
        # eval, export and the evaluator read the directory beside the lock file, and
        # the trainer's own look for a checkpoint that restores passes over it.
        assert ok(run_in_process("eval", *job))["global_step"] == 2
        ok(run_in_process("export", *job, "--out", str(tmp_path / "served")))
        latest = str(ckpt / "model.ckpt-2")
        assert checkpoints.newest_restorable(str(ckpt), "train.checkpoint_dir", print) == latest
        assert checkpoints.fall_back_to_restorable(str(ckpt), print) == latest
        assert files(ckpt) == sorted([*before, LOCK_FILE, "eval"])
