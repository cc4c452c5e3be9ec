"""One ps/worker job's life across separate network hosts, with links cut mid-run.

Every task runs on a test host of its own (a network namespace with its own address,
see tests/helpers/net_hosts.py), is given the others' addresses as it would be on real
machines, and serves on port 2222 of that address. Links are cut by taking the
host's veth down: packets vanish, as in a partition, rather than being refused.

The job lives through five runs on one set of hosts, each resuming from the
checkpoints of the one before with another worker count (2, 3, 2, 3, 2), as a real
job is restarted after a fault: a synchronous run cut short and then for good; a
synchronous run with a backup worker, resumed past a damaged checkpoint and stopped
by SIGTERM to every task at once; an asynchronous run that loses a worker and then
its ps; a run in which every worker diverges at its first step; a run that ends when its
data does; then, without ps tasks (collective all-reduce), a run that loses a worker
for good. An evaluator on a host of its own follows the whole life. The test prints
what it measured (steps lost, time to recover): docs/faults.md's fault list comes from
these lines. Every process is stopped by pid and every host removed when the test
ends; every wait is on an event, with a ceiling far above what it needs.
"""

import os
import re
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers.checkpoints import assert_nothing_lost, latest_step
from helpers.commands import (
    HELPERS,
    Process,
    last_json,
    last_logged,
    ok,
    paced_mlp,
    run_in_process,
    saved_steps,
    wait_until,
)
from helpers.diverging_model import MARK
from helpers.faults import diverging_model
from helpers.net_hosts import HostJob

from launch.data.position import DataProgress

pytestmark = pytest.mark.e2e

PEER_LOST, DIVERGED = 138, 3
JOB = ["--set", "model.name=mlp", "--set", "model.hidden_units=[16]",
       "--set", "optimizer.learning_rate=0.02", "--set", "train.batch_size=64",
       "--set", "train.log_every_steps=10", "--set", "data.num_examples=2000",
       "--set", "data.shuffle_buffer=0", "--set", "train.checkpoint_every_steps=20",
       "--set", "train.max_to_keep=1000",  # the step-20 checkpoint is compared at the end
       "--set", "cluster.startup_timeout_secs=120", "--set", "cluster.shutdown_grace_secs=5"]
# A cut meant to be ridden out lasts CUT_SECS (longer where the test waits for what
# the others do meanwhile). Short deadlines, so a cut that outlasts them ends the run
# in seconds. A session's first step may wait up to the startup timeout (every worker
# of a synchronous job must have started), so the operation timeout bounds only the
# steps after it: it need only outlast a short cut and TCP's retransmission after it
# (resent 0.2, 0.6, 1.4, 3 s after the loss: a step goes on about 3 s after a 2 s cut
# began).
CUT_SECS = 2
DEADLINES = ["--set", "cluster.reconnect_timeout_secs=8",
             "--set", "cluster.operation_timeout_secs=10"]
FOREVER = ["--set", f"train.steps={10**6}"]
# The runs whose workers train on while the test waits (for a deadline to run out, a
# restarted worker to start, an evaluation) take steps that also sleep, so that they do
# not spend the machine on steps nothing checks (helpers/paced_model.py: the mlp, its
# variables and values).
PACED = paced_mlp(0.05)
COMPARED_STEP = 20


def variables(checkpoint: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def cut_for(host, seconds: float = CUT_SECS, until=None) -> float:
    """Cut the host's link for `seconds` (making the fault, not waiting on one) and,
    given `until`, until it holds too (what the others do while the host is cut off);
    returns when the link was restored (monotonic)."""
    host.cut()
    try:
        time.sleep(seconds)
        if until is not None:
            wait_until(until, f"the others to go on while {host.name} is cut off", timeout=60)
    finally:
        host.restore()
    return time.monotonic()


def cut_for_good(host, job) -> tuple[dict[str, int], float]:
    """Cut the host's link until every task of `job` has exited; returns their exit
    statuses and the seconds from the cut to the last exit (the link is restored)."""
    host.cut()
    cut = time.monotonic()
    try:
        codes = job.codes(timeout=120)
    finally:
        host.restore()
    return codes, time.monotonic() - cut


def stop_all_at_once(tasks: dict[str, Process]) -> float:
    """SIGTERM to every task together, as Kubernetes deleting the job's pods sends it;
    returns how long the last task took to exit."""
    sent = time.monotonic()
    for task in tasks.values():
        task.proc.terminate()
    for task in tasks.values():
        task.wait(timeout=120)
    return time.monotonic() - sent


def npz_data(path, rows: int, poisoned: bool = False) -> list[str]:
    """mlp-shaped data read in order; poisoned, every example marked and the model that
    diverges at a marked step (helpers/diverging_model.py)."""
    rng = np.random.default_rng(1)
    features = rng.normal(size=(rows, 784)).astype(np.float32)
    labels = rng.integers(0, 10, size=rows).astype(np.int32)
    model = []
    if poisoned:
        features[:, 5] = MARK
        model = diverging_model("--set", "model.input_dim=784", "--set", "model.num_classes=10",
                                "--set", "model.hidden_units=[16]")
    np.savez(path, features=features, labels=labels)
    return ["--set", "data.source=npz", "--set", f"data.path={path}", *model]


def failures(tasks: dict[str, Process]) -> dict[str, str]:
    return {name: task.stderr[-1500:] for name, task in tasks.items()}


class Life:
    """The job's runs, one after another, on the network's hosts."""

    def __init__(self, network, tmp_path):
        self.network, self.tmp_path = network, tmp_path
        self.ckpt = tmp_path / "ckpt"
        self.base = [*JOB, *DEADLINES, "--set", f"train.checkpoint_dir={self.ckpt}"]
        self.runs: list[HostJob] = []
        self.evaluator: Process | None = None
        self.report: list[str] = []

    def run(self, label: str, args: list[str], workers: int) -> HostJob:
        job = HostJob(self.network, self.tmp_path, label, [*self.base, *args], workers=workers)
        self.runs.append(job)
        job.start_all()
        return job

    def host(self, name: str):
        return self.network.host(name)

    def stop(self) -> None:
        for job in self.runs:
            job.stop()
        if self.evaluator is not None:
            self.evaluator.stop()


def test_one_jobs_life_across_hosts_through_cuts_restarts_resizes_stops_and_divergence(
        network, tmp_path):
    life = Life(network, tmp_path)
    try:
        first = sync_run_cut_short_then_for_good(life)
        saved = assert_nothing_lost(life.ckpt, 50)
        resumed = sync_run_with_a_backup_worker_past_a_damaged_checkpoint(life, saved)
        good = async_run_losing_a_worker_then_its_ps(life, resumed)
        good = async_run_in_which_every_worker_diverges_at_its_first_step(life, good)
        ended = run_that_ends_with_its_data(life, good)
        collective_run_losing_a_worker(life, ended)
        assert life.evaluator.proc.poll() is None, life.evaluator.stderr[-2000:]
        took = stop_all_at_once({"evaluator": life.evaluator})
        assert life.evaluator.proc.returncode == 0, life.evaluator.stderr[-2000:]
    finally:
        life.stop()
    # Every update of the synchronous run held one gradient from each worker: the same
    # variables at the same step as one process training on the whole global batch
    # (in this process: a process of its own adds nothing to the reference).
    ok(run_in_process("train", *JOB, "--set", f"train.steps={COMPARED_STEP}",
                      "--set", f"train.checkpoint_dir={tmp_path / 'one'}"))
    here = variables(tf.train.latest_checkpoint(str(tmp_path / "one")))
    there = variables(str(life.ckpt / f"model.ckpt-{COMPARED_STEP}"))
    assert here.keys() == there.keys() and int(there["global_step"]) == COMPARED_STEP
    for name, value in here.items():
        np.testing.assert_allclose(there[name], value, rtol=0, atol=1e-6, err_msg=name)
    assert "Traceback" not in "".join(t.stderr for job in life.runs for t in job.tasks.values())
    print(f"run 1 outsider: {first}; evaluator stopped in {took:.1f} s")
    print("\n".join(life.report))


def sync_run_cut_short_then_for_good(life: Life) -> dict:
    """Two synchronous workers, an outsider probing the hosts. A 2 s cut of worker 1:
    every step waits for it, then goes on. A cut for good: every task exits 138 naming
    the peer it lost."""
    go = life.tmp_path / "probe-go"
    probe = life.host("outsider").command(
        sys.executable, os.path.join(HELPERS, "net_probe.py"), str(go),
        f"{life.host('ps0').address}:2222", f"ps_grpc={life.host('ps0').address}:2222",
        f"worker_grpc={life.host('worker0').address}:2222",
        f"ps_metrics={life.host('ps0').address}:9100",
        f"open_metrics={life.host('worker1').address}:9100")
    prober = Process(life.tmp_path, "probe", command=probe)
    life.network.processes.append(prober)
    job = HostJob(life.network, life.tmp_path, "sync2",
                  [*life.base, "--set", "train.sync=true", *FOREVER,
                   "--set", "metrics.port=9100"], workers=2)
    life.runs.append(job)
    job.start("ps0")
    job.start("worker0")
    job.start("worker1", "--set", "metrics.addr=0.0.0.0")  # as in a container
    chief, worker1, ps = job.tasks["worker0"], job.tasks["worker1"], job.tasks["ps0"]
    for task in (ps, chief, worker1):
        task.wait_for("metrics on http")
        task.wait_for(r"serving \d+\.")
    go.write_text("")
    assert prober.wait(timeout=180) == 0, prober.stderr[-2000:]
    seen = last_json(prober.stdout)
    # TensorFlow's gRPC server listens on every interface and runs any graph it is
    # sent: a host outside the job read the ps's global step with no credentials.
    assert seen["reach"] == {"ps_grpc": "accepts", "worker_grpc": "accepts",
                             "ps_metrics": "refused", "open_metrics": "accepts"}, seen
    assert seen["global_step"] is not None, seen
    wait_until(lambda: max(saved_steps(chief.stderr), default=0) >= 60, "a checkpoint",
               timeout=240)

    before = last_logged(chief.stderr)
    restored = cut_for(life.host("worker1"))
    during = last_logged(chief.stderr)
    wait_until(lambda: last_logged(chief.stderr) >= during + 30, "steps after the cut")
    short_recovery = time.monotonic() - restored
    assert during - before <= 10, (before, during)  # at most the step in flight
    # Worker 1 looks at its ps once a second: on a quiet host the chief can run its 30
    # steps before that look has found the ps again. Waited for, not read at once.
    worker1.wait_for("answers again", timeout=30)

    reached = last_logged(chief.stderr)
    codes, ended = cut_for_good(life.host("worker1"), job)
    assert codes == {"ps0": PEER_LOST, "worker0": PEER_LOST, "worker1": PEER_LOST}, failures(
        job.tasks)
    assert f"ps 0 at {job.ps[0]} has not answered for 8 s" in worker1.stderr
    assert f"not answering: worker 1 at {job.workers[1]}" in chief.stderr
    assert "no worker has answered for 8 s" in ps.stderr
    life.report.append(
        f"sync, worker cut {CUT_SECS} s: stalled at step {during}, going again "
        f"{short_recovery:.1f} s after the link returned; cut for good at step {reached}: "
        f"every task exited 138 within {ended:.1f} s")
    return {"global_step_read": seen["global_step"]}


def sync_run_with_a_backup_worker_past_a_damaged_checkpoint(life: Life, saved: int) -> int:
    """The newest checkpoint damaged, three synchronous workers with one backup: the
    evaluator and the chief pass over it; a cut of worker 1 no longer holds the
    chief up, and worker 1 trains again after it. SIGTERM to every task at once: every
    task exits 0, the chief's final checkpoint saved. Returns its step."""
    with open(life.ckpt / f"model.ckpt-{saved}.data-00000-of-00001", "r+b") as f:
        f.truncate(100)
    life.evaluator = HostJob(life.network, life.tmp_path, "eval", [*life.base, *FOREVER],
                             workers=2).start(
        "evaluator", "--set", "eval.steps=2", "--set", "eval.every_secs=1")
    life.evaluator.wait_for("watching")
    restarted = time.monotonic()
    job = life.run("sync3", ["--set", "train.sync=true", *PACED, *FOREVER,
                             "--set", "train.backup_workers=1"], workers=3)
    chief, worker1 = job.tasks["worker0"], job.tasks["worker1"]
    wait_until(lambda: last_logged(worker1.stderr) >= saved, "the restarted job", timeout=240)
    resumed = time.monotonic() - restarted
    assert saved_steps(chief.stderr)[0] == saved - 20  # passed over; 2 -> 3 workers
    assert f"model.ckpt-{saved} cannot be restored" in chief.stderr
    assert "21 examples of every global batch of 64 (part 3 of 3)" in job.tasks["worker2"].stderr

    before, stalled = last_logged(chief.stderr), last_logged(worker1.stderr)
    restored = cut_for(life.host("worker1"),  # until the chief has gone on without it
                       until=lambda: last_logged(chief.stderr) > before + 10)
    wait_until(lambda: last_logged(worker1.stderr) > stalled + 10, "worker 1 to go on")
    backup_recovery = time.monotonic() - restored
    wait_until(lambda: re.search(r"eval step \d+: loss=", life.evaluator.stderr), "an eval")
    assert f"model.ckpt-{saved} cannot be restored" in life.evaluator.stderr

    took = stop_all_at_once(job.tasks)
    assert {n: t.proc.returncode for n, t in job.tasks.items()} == {
        "ps0": 0, "worker0": 0, "worker1": 0, "worker2": 0}, failures(job.tasks)
    stopped = last_json(chief.stdout)
    assert stopped["stopped_by"] == "signal"
    final = saved_steps(chief.stderr)[-1]
    assert stopped["global_step"] == final >= last_logged(chief.stderr), (
        saved_steps(chief.stderr)[-3:], sorted(os.listdir(life.ckpt)),
        (life.ckpt / "checkpoint").read_text(), chief.stderr[-2000:])
    assert tf.train.latest_checkpoint(str(life.ckpt)).endswith(f"model.ckpt-{final}")
    life.report.append(
        f"restarted past a damaged checkpoint from step {saved - 20}, training again "
        f"{resumed:.1f} s later; with a backup worker, a cut: the chief went on, worker 1 "
        f"again {backup_recovery:.1f} s after the link returned; SIGTERM to every task at "
        f"once: all exited 0 within {took:.1f} s, the final checkpoint at step {final}")
    return final


def async_run_losing_a_worker_then_its_ps(life: Life, resumed: int) -> int:
    """Two asynchronous workers. A cut of worker 1: the chief never waits. A cut
    for good: worker 1 exits 138, the chief trains on; restarted, worker 1 rejoins. The
    ps cut off: every task exits 138. Returns the last checkpoint's step."""
    job = life.run("async2", [*PACED, *FOREVER], workers=2)
    chief, worker1 = job.tasks["worker0"], job.tasks["worker1"]
    wait_until(lambda: last_logged(worker1.stderr) > resumed, "the restarted job", timeout=240)
    assert saved_steps(chief.stderr)[0] == resumed  # 3 -> 2 workers: restored

    before, stalled = last_logged(chief.stderr), last_logged(worker1.stderr)
    restored = cut_for(life.host("worker1"),  # until the chief has gone on without it
                       until=lambda: last_logged(chief.stderr) > before)
    wait_until(lambda: last_logged(worker1.stderr) > stalled + 20, "worker 1 to go on")
    short_recovery = time.monotonic() - restored

    life.host("worker1").cut()
    assert worker1.wait(timeout=60) == PEER_LOST, worker1.stderr[-2000:]
    alone = last_logged(chief.stderr)
    wait_until(lambda: last_logged(chief.stderr) > alone + 50, "the chief to go on alone")
    life.host("worker1").restore()
    restarted = time.monotonic()
    back = HostJob(life.network, life.tmp_path, "rejoin", [*life.base, *PACED, *FOREVER],
                   workers=2).start("worker1")
    wait_until(lambda: re.search(r"step \d+/", back.stderr), "worker 1 to rejoin", timeout=240)
    rejoined = time.monotonic() - restarted

    life.host("ps0").cut()
    cut = time.monotonic()
    codes = {name: task.wait(timeout=120) for name, task in
             (("ps0", job.tasks["ps0"]), ("worker0", chief), ("worker1", back))}
    ended = time.monotonic() - cut
    reached = max(last_logged(chief.stderr), last_logged(back.stderr))
    life.host("ps0").restore()
    back.stop()
    assert codes == {"ps0": PEER_LOST, "worker0": PEER_LOST, "worker1": PEER_LOST}, codes
    assert f"ps 0 at {job.ps[0]} has not answered for 8 s" in chief.stderr + back.stderr
    assert "no worker has answered for 8 s" in job.tasks["ps0"].stderr
    saved = assert_nothing_lost(life.ckpt, resumed)
    life.report.append(
        f"async, worker cut: the chief went on, worker 1 trained again "
        f"{short_recovery:.1f} s after the link returned; cut for good: worker 1 exited 138, "
        f"the chief trained on, a restarted worker 1 rejoined in {rejoined:.1f} s; ps cut at "
        f"step {reached}: every task exited 138 within {ended:.1f} s ({reached - saved} steps "
        "after the last checkpoint lost)")
    return saved


def async_run_in_which_every_worker_diverges_at_its_first_step(life: Life, saved: int) -> int:
    """Three asynchronous workers on data every example of which is marked: each worker
    diverges at its first step (which part of the data an asynchronous worker's first
    step reads depends on when it starts). The chief stops with status 3 and nothing is
    saved after the checkpoint restored, which stays the latest. Returns its step."""
    poisoned = npz_data(life.tmp_path / "poisoned.npz", 3000, poisoned=True)
    job = life.run("async3", [*poisoned, *FOREVER], workers=3)
    codes = job.codes(timeout=240)
    assert codes["ps0"] == 0 and codes["worker0"] == DIVERGED, failures(job.tasks)
    for name in ("worker1", "worker2"):
        # One still starting when the chief stopped the job learns it from the ps tasks,
        # which wait for it, and stops before its first step.
        assert codes[name] == DIVERGED and "diverged" in job.tasks[name].stderr, failures(
            job.tasks)
    chief = job.tasks["worker0"]
    assert saved_steps(chief.stderr) == [saved]  # 2 -> 3 workers: restored, then nothing
    assert "non-finite" in chief.stderr
    good = assert_nothing_lost(life.ckpt, saved)
    last_saved = f"{life.ckpt}/model.ckpt-{saved}"
    assert tf.train.latest_checkpoint(str(life.ckpt)) == last_saved
    assert f"The latest checkpoint is {last_saved}" in chief.stderr
    life.report.append(f"the chief diverged at its first step and stopped with 3 "
                       f"({codes['worker1']} and {codes['worker2']} from the other workers), "
                       f"the last good checkpoint at step {good}")
    return good


def passes_done(ckpt, step: int) -> int:
    """The passes over its data the checkpoint's job had begun by ``step``."""
    reader = tf.train.load_checkpoint(str(ckpt))
    base = {f: int(reader.get_tensor(f"towers_data/{f}"))
            for f in ("base_step", "base_position", "batch_size", "num_examples")}
    return -(-DataProgress(**base).position(step) // base["num_examples"])


def run_that_ends_with_its_data(life: Life, good: int) -> int:
    """Two synchronous workers resumed on other data (1,023 rows): the pass under way
    counts as done, and the next, in whole global batches of 64, ends the job at step
    good + 15 for both workers, exit 0. Returns its last step."""
    drained = npz_data(life.tmp_path / "finite.npz", 1023)
    epochs = passes_done(life.ckpt, good) + 1
    job = life.run("drain", ["--set", "train.sync=true", *drained,
                             "--set", f"data.epochs={epochs}",
                             "--set", f"train.steps={good + 100}"], workers=2)
    assert set(job.codes(timeout=240).values()) == {0}, failures(job.tasks)
    assert saved_steps(job.tasks["worker0"].stderr)[0] == good  # 3 -> 2: restored
    assert f"counts as done, and training goes on at the start of epoch {epochs}" in \
        job.tasks["worker0"].stderr
    for task in ("worker0", "worker1"):
        assert f"pass(es) over the data done at step {good + 15}" in job.tasks[task].stderr
    assert latest_step(life.ckpt) == good + 15
    life.report.append(f"a pass over other data: both workers ended at step {good + 15}")
    return good + 15


def collective_run_losing_a_worker(life: Life, ended: int) -> None:
    """Two workers and no ps tasks, their gradients all-reduced by collective ops,
    resuming from the ps/worker job's checkpoint. Worker 1 cut off for good: both
    workers exit 138 within the deadline, the chief naming worker 1."""
    began = time.monotonic()
    # A deadline shorter than the other runs': no cut here is meant to be outlasted.
    job = HostJob(life.network, life.tmp_path, "collective2",
                  [*life.base, *FOREVER, "--set", "cluster.operation_timeout_secs=8"],
                  workers=2, ps=0)
    life.runs.append(job)
    job.start_all()
    chief = job.tasks["worker0"]
    wait_until(lambda: last_logged(chief.stderr) >= ended + 10, "collective steps", timeout=240)
    assert saved_steps(chief.stderr)[0] == ended  # a ps/worker checkpoint, resumed
    assert "gradients all-reduced by collective ops (ring)" in chief.stderr
    reached = last_logged(chief.stderr)
    codes, took = cut_for_good(life.host("worker1"), job)
    assert codes == {"worker0": PEER_LOST, "worker1": PEER_LOST}, failures(job.tasks)
    assert f"not answering: worker 1 at {job.workers[1]}" in chief.stderr
    life.report.append(
        f"no ps tasks (collective), resumed from the ps/worker checkpoint at step {ended}; "
        f"worker 1 cut for good at step {reached}: both workers exited 138 within {took:.1f} s "
        f"(this run took {time.monotonic() - began:.1f} s in all)")

