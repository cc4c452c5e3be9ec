"""Fault injection: trainers and clusters as real processes on 127.0.0.1, poisoned, killed,
starved of disk, cut off from their ps, and restarted.

Each test asserts the outcome (exit status, one clear line, no traceback) and that nothing
was lost, by reading the checkpoints back: the global step is never below the last one
reported saved, every checkpoint on disk restores, and none holds NaN or Inf. Every
process a test starts is stopped by pid in a finally block; every wait is bounded.

A trainer the test signals, kills or starves is a process of its own; a run that needs
no such thing (a diverging job, a restart, a second trainer beside the first) goes
through the command's main() in this process (helpers/commands.run_in_process).
"""

import os
import re
import signal
import socket
import subprocess
import time

import pytest
import tensorflow as tf
from helpers.checkpoints import assert_nothing_lost, checkpoint_variables
from helpers.commands import (
    Cluster,
    Process,
    last_json,
    ok,
    overrides,
    run_in_process,
    saved_steps,
)
from helpers.faults import job, poisoned_csv, rows_with_dropout

from launch.config import load_job
from launch.distributed.ports import free_ports
from launch.runtime import checkpoints
from launch.runtime.checkpoints import CheckpointWriteError
from launch.runtime.train import train

pytestmark = pytest.mark.e2e  # every test here trains or starts processes

DIVERGED, RESOURCE, PEER_LOST = 3, 4, 138
def assert_one_clear_line(result, *phrases):
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("towers: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for phrase in phrases:
        assert phrase in errors[0], errors[0]


# --- divergence ---------------------------------------------------------------------------

def test_nan_gradient_stops_the_job_with_status_3_and_the_last_good_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    # The marked example of step 25 leaves the loss finite but not the gradient
    # (helpers/diverging_model.py): a loss-only check (NanTensorHook) would let this
    # update through.
    result = run_in_process("train", *job(ckpt, 40), *poisoned_csv(tmp_path / "d.csv", [25]))
    assert result.returncode == DIVERGED, result.stderr[-3000:]
    assert_one_clear_line(result, "training diverged", "non-finite", "model.ckpt-20")
    assert saved_steps(result.stderr) == [0, 10, 20]
    assert assert_nothing_lost(ckpt, 20) == 20


def test_skip_policy_drops_poisoned_steps_and_gives_up_after_too_many_in_a_row(tmp_path):
    ckpt = tmp_path / "ckpt"
    # Step 15 alone is poisoned, then steps 25 to 28: skipping 15 goes on, the fourth
    # in a row (one more than allowed) ends the job.
    result = run_in_process("train", *job(ckpt, 40),
                            *poisoned_csv(tmp_path / "d.csv", [15, 25, 26, 27, 28]),
                            "--set", "train.on_nonfinite=skip",
                            "--set", "train.max_nonfinite_steps=3")
    assert result.returncode == DIVERGED, result.stderr[-3000:]
    assert_one_clear_line(result, "4 steps in a row", "train.max_nonfinite_steps is 3",
                          "model.ckpt-20")
    skipped = [int(s) for s in re.findall(r"step (\d+): non-finite .* update skipped",
                                          result.stderr)]
    assert skipped == [15, 25, 26, 27, 28]
    assert saved_steps(result.stderr) == [0, 10, 20]
    assert assert_nothing_lost(ckpt, 20) == 20


def test_a_worker_starting_after_the_chief_diverged_learns_it_and_exits_3_too(tmp_path):
    """Asynchronous, 2 workers: the chief diverges at step 5 alone (worker 1 not yet
    started), then worker 1 starts. It used to find the ps gone (the ps waited
    cluster.shutdown_grace_secs for it, then left) and end 138, unable to learn why the
    job ended; now the ps waits for it and it stops before its first step with 3."""
    data = poisoned_csv(tmp_path / "d.csv", [5])
    cluster = Cluster(tmp_path, [*job(tmp_path / "unused", 100, 2, *data),
                                 "--set", "cluster.shutdown_grace_secs=2",
                                 "--set", "cluster.startup_timeout_secs=45"], workers=2)
    try:
        ps = cluster.start("ps", "ps", 0)
        chief = cluster.start("chief", "worker", 0)
        assert chief.wait(timeout=120) == DIVERGED, chief.stderr[-3000:]
        late = cluster.start("worker1", "worker", 1)
        codes = [late.wait(timeout=120), ps.wait(timeout=60)]
    finally:
        cluster.stop()
    assert codes == [DIVERGED, 0], (late.stderr[-3000:], ps.stderr[-2000:])
    assert_one_clear_line(subprocess.CompletedProcess([], 3, "", late.stderr),
                          "worker rank 0 diverged")
    assert "towers: step " not in late.stderr  # it took no step
    assert assert_nothing_lost(cluster.ckpt, 4) == 4


# --- a damaged newest checkpoint ----------------------------------------------------------

def test_a_damaged_newest_checkpoint_is_passed_over_for_the_newest_that_restores(tmp_path):
    ckpt = tmp_path / "ckpt"
    ok(run_in_process("train", *job(ckpt, 30)))
    # Two kinds of damage at once: the newest data file cut short (a crash or a full
    # disk mid-write), and a state file naming a checkpoint whose files are gone.
    with open(ckpt / "model.ckpt-30.data-00000-of-00001", "r+b") as f:
        f.truncate(100)
    (ckpt / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-40"\n' + "".join(
        f'all_model_checkpoint_paths: "model.ckpt-{s}"\n' for s in (0, 10, 20, 30, 40)))
    started = time.monotonic()
    result = run_in_process("train", *job(ckpt, 40))
    summary = ok(result)
    assert "model.ckpt-40 cannot be restored: its files are missing" in result.stderr
    assert "model.ckpt-30 cannot be restored" in result.stderr
    assert "resuming from" in result.stderr and "model.ckpt-20" in result.stderr
    assert saved_steps(result.stderr)[0] == 20  # resumed there, not at step 0
    assert summary["global_step"] == 40
    assert_nothing_lost(ckpt, 40)
    assert os.listdir(ckpt / "unrestorable")  # the damaged files are kept, aside
    print(f"recovered in {time.monotonic() - started:.1f} s")


# --- preemption ---------------------------------------------------------------------------

def assert_as_if_never_stopped(tmp_path, args, ckpt):
    """The resumed job's weights are within 1e-5 of the same job's run straight through
    (here, in this process): it went on at the next example with the same masks."""
    straight = tmp_path / "straight"
    cfg = load_job(None, [*overrides(args), f"train.checkpoint_dir={straight}"])
    ran = train(cfg, write=lambda line: None)
    assert ran["steps_run"] == ran["global_step"] == cfg.train.steps  # from step 0
    expected, got = checkpoint_variables(straight), checkpoint_variables(ckpt)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert abs(got[name] - value).max() <= 1e-5, name


def test_sigterm_saves_within_30_s_exits_0_and_the_restart_resumes_there(tmp_path):
    ckpt, rows = tmp_path / "ckpt", rows_with_dropout(tmp_path / "rows.npz")
    trainer = Process(tmp_path, "trainer", "train", *job(ckpt, 10**7, 200, *rows))
    try:
        trainer.wait_for(r"saved checkpoint at step [1-9]\d*")
        trainer.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert trainer.wait(timeout=60) == 0, trainer.stderr[-3000:]
        took = time.monotonic() - sent
    finally:
        trainer.stop()
    # The promise: Kubernetes' default grace after SIGTERM is 30 s, then SIGKILL.
    assert took < 30, took
    reported = saved_steps(trainer.stderr)
    summary = last_json(trainer.stdout)
    assert summary["stopped_by"] == "signal"
    assert assert_nothing_lost(ckpt, reported[-1]) == summary["global_step"] >= reported[-1]
    args = job(ckpt, summary["global_step"] + 20, 200, *rows)
    resumed = run_in_process("train", *args)
    assert ok(resumed)["global_step"] == summary["global_step"] + 20
    assert saved_steps(resumed.stderr)[0] == summary["global_step"]
    assert_as_if_never_stopped(tmp_path, args, ckpt)
    print(f"stopped {took:.1f} s after SIGTERM at step {summary['global_step']}")


# --- two writers ---------------------------------------------------------------------------

def test_a_second_trainer_on_a_directory_in_use_exits_2_naming_the_first_and_writes_nothing(
        tmp_path):
    ckpt = tmp_path / "ckpt"
    # Saves only at step 0 (and at the end), so the first alone changes no file name.
    first = Process(tmp_path, "first", "train", *job(ckpt, 10**7, 10**9))
    try:
        first.wait_for(r"saved checkpoint at step 0")
        first.wait_for(r"step \d+/")  # the first step's trace is written
        before = sorted(os.listdir(ckpt))
        second = run_in_process("train", *job(ckpt, 10**7, 10**9))
        after = sorted(os.listdir(ckpt))
        assert first.proc.poll() is None, first.stderr[-3000:]
    finally:
        first.stop()
    assert second.returncode == 2, second.stderr[-3000:]
    assert_one_clear_line(second, f"{ckpt} is in use by towers pid {first.proc.pid} on host "
                                  f"{socket.gethostname()} (since ")
    assert second.stdout == ""
    assert after == before
    assert len([name for name in after if name.startswith("events.out.tfevents.")]) == 1


def test_a_trainer_killed_with_sigkill_does_not_hold_the_directory_for_its_restart(tmp_path):
    ckpt, rows = tmp_path / "ckpt", rows_with_dropout(tmp_path / "rows.npz")
    first = Process(tmp_path, "first", "train", *job(ckpt, 10**7, 20, *rows))
    try:
        first.wait_for(r"saved checkpoint at step [1-9]\d*")
        os.kill(first.proc.pid, signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        first.stop()
    saved = assert_nothing_lost(ckpt, saved_steps(first.stderr)[-1])  # it may have saved more
    assert (ckpt / ".towers.lock").exists()  # left behind, naming the dead process
    args = job(ckpt, saved + 100, 20, *rows)
    resumed = run_in_process("train", *args)
    # A checkpoint the kill cut off between its files and the state file is complete, and
    # the restart takes it: it resumes at `saved` or later, never earlier.
    start = int(re.search(r"resuming from \S+ at step (\d+)", resumed.stderr).group(1))
    assert start >= saved
    assert ok(resumed)["global_step"] == max(start, saved + 100)
    assert saved_steps(resumed.stderr)[0] == start
    assert not (ckpt / ".towers.lock").exists()
    assert_as_if_never_stopped(tmp_path, args, ckpt)


# --- resources ----------------------------------------------------------------------------

def test_a_port_in_use_is_one_line_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (ps,) = free_ports(1)
        result = run_in_process("worker", *job(tmp_path / "c", 10),
                                "--ps-hosts", f"127.0.0.1:{ps}",
                                "--worker-hosts", f"127.0.0.1:{port}", "--task-index", "0")
    assert result.returncode == 2, result.stderr[-3000:]
    assert_one_clear_line(result, str(port), "in use")


def test_an_unwritable_checkpoint_directory_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_in_process("train", *job(blocker / "ckpt", 10))
    assert result.returncode == 2, result.stderr[-3000:]
    assert_one_clear_line(result, "train.checkpoint_dir", str(blocker))


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs (needs root); elsewhere, a directory that can be made read-only."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        yield disk, "read-only"
        disk.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"root but cannot mount a tmpfs to fill ({mounted.stderr.strip()}), and "
                    "permissions do not bind root, so neither a full nor a read-only "
                    "disk can be simulated")
    try:
        yield disk, "full"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk):
    """Write zeros until the file system says no space is left (it may be full already)."""
    try:
        with open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass


def test_a_disk_that_fills_mid_run_stops_the_job_with_one_line_and_keeps_the_checkpoint(
        tmp_path, small_disk):
    disk, how = small_disk
    ckpt = disk / "ckpt"
    trainer = Process(tmp_path, "trainer", "train", *job(ckpt, 10**7, "null"),
                      "--set", "train.checkpoint_every_secs=2",
                      "--set", "train.summary_every_steps=1000")
    try:
        trainer.wait_for(r"saved checkpoint at step 0")
        if how == "full":
            fill(disk)
        else:
            ckpt.chmod(0o555)
        code = trainer.wait(timeout=60)
    finally:
        trainer.stop()
        if (disk / "filler").exists():
            os.remove(disk / "filler")
    assert code == RESOURCE, trainer.stderr[-3000:]
    assert "Traceback" not in trainer.stderr, trainer.stderr[-3000:]
    errors = [ln for ln in trainer.stderr.splitlines() if ln.startswith("towers: error:")]
    assert len(errors) == 1 and str(ckpt) in errors[0] and "model.ckpt-0" in errors[0], errors
    assert ("No space left on device" if how == "full" else "Permission denied") in errors[0]
    assert assert_nothing_lost(ckpt, 0) == 0


def test_a_disk_full_as_the_job_starts_again_is_exit_4_with_one_line(tmp_path, small_disk):
    # Its lock's name written into the full disk raised OSError: a traceback and exit 1
    # (found by the soak, one seed 101: the job restarted as the disk filled).
    disk, how = small_disk
    ckpt = disk / "ckpt"
    ok(run_in_process("train", *job(ckpt, 10)))
    if how == "full":
        fill(disk)
    else:
        ckpt.chmod(0o555)
    try:
        result = run_in_process("train", *job(ckpt, 20))
    finally:
        if (disk / "filler").exists():
            os.remove(disk / "filler")
    if how != "full":  # read-only: found before anything is built (exit 2)
        assert result.returncode == 2, result.stderr[-3000:]
        return
    assert result.returncode == RESOURCE, result.stderr[-3000:]
    assert_one_clear_line(result, str(ckpt), "No space left on device", "model.ckpt-10")
    assert assert_nothing_lost(ckpt, 10) == 10


def test_a_disk_full_as_a_damaged_newest_checkpoint_is_passed_over_is_one_line(
        tmp_path, small_disk, graph):
    # The state file rewritten to name the newest good checkpoint raised TensorFlow's
    # ResourceExhaustedError: a traceback and exit 1 (the soak, sync_backup seed 403: the
    # newest checkpoint truncated, then the disk full as the job started again).
    disk, how = small_disk
    if how != "full":
        pytest.skip("needs root, to fill a tmpfs: a read-only directory fails earlier, as "
                    "the damaged checkpoint is moved aside (tested above)")
    ckpt = str(disk / "ckpt")
    weight = tf.compat.v1.get_variable("w", initializer=tf.ones([1000]))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
        session.run(weight.initializer)
        for step in (0, 1):
            saver.save(session, os.path.join(ckpt, "model.ckpt"), global_step=step)
    with open(os.path.join(ckpt, "model.ckpt-1.data-00000-of-00001"), "r+b") as f:
        f.truncate(100)  # of 4,000 bytes
    fill(disk)
    lines = []
    with pytest.raises(CheckpointWriteError) as failed:
        checkpoints.fall_back_to_restorable(ckpt, lines.append)
    message = str(failed.value)
    assert "No space left on device" in message and "model.ckpt-0" in message, message
    assert "model.ckpt-1 cannot be restored" in lines[0]


# --- ps/worker: a ps lost ------------------------------------------------------------------

CLUSTER = ["--set", "model.name=mlp", "--set", "model.hidden_units=[16]",
           "--set", "train.batch_size=32", "--set", "data.num_examples=1000",
           "--set", "train.log_every_steps=100", "--set", "cluster.startup_timeout_secs=60",
           "--set", "cluster.shutdown_grace_secs=10",
           "--set", "cluster.operation_timeout_secs=20"]


def test_a_ps_killed_and_restarted_the_chief_restores_and_the_job_completes(tmp_path):
    # One worker, the chief: a second one would rejoin too, but only after
    # MonitoredSession's 30 s recovery poll, too long for this suite.
    cluster = Cluster(tmp_path, [*CLUSTER, "--set", "train.steps=800",
                                 "--set", "train.checkpoint_every_steps=100",
                                 "--set", "cluster.reconnect_timeout_secs=60"])
    try:
        cluster.start("ps", "ps", 0)
        chief = cluster.start("chief", "worker", 0)
        chief.wait_for(r"saved checkpoint at step [1-9]\d*")
        cluster.kill("ps")
        killed = time.monotonic()
        saved_before = saved_steps(chief.stderr)
        count = len(saved_before)
        cluster.start("ps-again", "ps", 0)
        # After the restart the chief restores the last checkpoint, and saves it again.
        deadline = time.monotonic() + 120
        while len(saved_steps(chief.stderr)) <= count and time.monotonic() < deadline:
            assert chief.proc.poll() is None, chief.stderr[-3000:]
            time.sleep(0.2)
        recovered = time.monotonic() - killed
        cluster.finish()
    finally:
        cluster.stop()
    after = saved_steps(chief.stderr)[count:]
    assert after and after[0] >= saved_before[-1], (saved_before, after)
    assert "lost ps 0" in chief.stderr
    assert assert_nothing_lost(cluster.ckpt, 800) >= 800
    print(f"saved {saved_before[-1]} before the kill; resumed at {after[0]}, "
          f"{recovered:.1f} s later")


def test_a_ps_that_stays_down_ends_its_workers_and_then_the_other_ps_with_138(tmp_path):
    # Two ps tasks: losing ps 1 for good ends the worker after the deadline, and ps 0,
    # left with no worker that will ever report, ends after the same deadline.
    cluster = Cluster(tmp_path, [*CLUSTER, "--set", f"train.steps={10**6}",
                                 "--set", "cluster.reconnect_timeout_secs=5"], workers=1, ps=2)
    try:
        ps0 = cluster.start("ps0", "ps", 0)
        cluster.start("ps1", "ps", 1)
        chief = cluster.start("chief", "worker", 0)
        chief.wait_for(r"step \d+/")
        cluster.kill("ps1")
        killed = time.monotonic()
        codes = [chief.wait(timeout=60)]
        worker_took = time.monotonic() - killed
        codes.append(ps0.wait(timeout=60))
        ps_took = time.monotonic() - killed
    finally:
        cluster.stop()
    assert codes == [PEER_LOST, PEER_LOST], (chief.stderr[-2000:], ps0.stderr[-2000:])
    assert "Traceback" not in chief.stderr + ps0.stderr
    assert f"ps 1 at {cluster.ps[1]} has not answered for 5 s" in chief.stderr
    assert "no worker has answered for 5 s" in ps0.stderr
    assert_nothing_lost(cluster.ckpt, 0)
    print(f"worker gave up {worker_took:.1f} s after ps 1 was killed; "
          f"ps 0 ended at {ps_took:.1f} s")
