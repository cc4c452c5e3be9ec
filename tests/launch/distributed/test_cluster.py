"""ps/worker jobs: cluster resolution, variable placement, and real clusters on 127.0.0.1.

Every process a test starts is stopped by pid in a finally block; every wait is bounded.
"""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers.checkpoints import checkpoint_variables
from helpers.commands import (
    Cluster,
    Process,
    environment,
    last_json,
    last_logged,
    ok,
    paced_mlp,
    run_in_process,
    run_towers,
    saved_steps,
    towers_command,
    wait_until,
)

from launch.config import from_dict
from launch.distributed.cluster import ClusterError, Flags, resolve
from launch.distributed.ports import free_ports
from launch.runtime.checkpoints import RESTORED_APART

# --- resolving the cluster from the job file, flags and TF_CONFIG ------------------------

PS, W0, W1 = "10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"


def cluster_cfg(**jobs):
    return from_dict({"cluster": jobs}).cluster


def tf_config(cluster, task_type=None, index=0):
    config = {"cluster": cluster}
    if task_type:
        config["task"] = {"type": task_type, "index": index}
    return {"TF_CONFIG": json.dumps(config)}


def test_three_sources_give_one_result():
    from_file = resolve(cluster_cfg(ps=[PS], worker=[W0, W1]), Flags(task_index=1), "worker", {})
    from_flags = resolve(cluster_cfg(), Flags(PS, f"{W0},{W1}", "worker", 1), "worker", {})
    from_env = resolve(cluster_cfg(), Flags(), "worker",
                       tf_config({"ps": [PS], "worker": [W0, W1]}, "worker", 1))
    assert from_file == from_flags == from_env
    assert from_file.address == W1 and not from_file.is_chief
    assert from_file.num_workers == 2 and from_file.worker_rank == 1


def test_agreeing_sources_may_be_combined():
    task = resolve(cluster_cfg(ps=[PS], worker=[W0]), Flags(PS, W0, "worker", 0), "worker",
                   tf_config({"ps": [PS], "worker": [W0]}, "worker", 0))
    assert task.is_chief


def test_tfjob_chief_is_chief_and_worker_zero_is_not():
    cluster = {"chief": [W0], "ps": [PS], "worker": [W1], "evaluator": ["10.0.0.9:2222"]}
    chief = resolve(cluster_cfg(), Flags(), "worker", tf_config(cluster, "chief", 0))
    worker = resolve(cluster_cfg(), Flags(), "worker", tf_config(cluster, "worker", 0))
    assert chief.is_chief and not worker.is_chief
    assert (chief.worker_rank, worker.worker_rank) == (0, 1)
    assert "evaluator" not in chief.cluster  # evaluators run no server


@pytest.mark.parametrize("cfg, flags, env, message", [
    (cluster_cfg(ps=[PS], worker=[W0]), Flags(ps_hosts="10.9.9.9:1"), {},
     r"cluster.ps: sources disagree: the job file's cluster section says .* --ps-hosts"),
    (cluster_cfg(), Flags(PS, W0, "worker", 0), tf_config({"ps": [PS], "worker": [W1]}),
     r"cluster.worker: sources disagree"),
    (cluster_cfg(), Flags(PS, f"{W0},{W1}", "worker", 0),
     tf_config({"ps": [PS], "worker": [W0, W1]}, "worker", 1), r"task: sources disagree"),
    (cluster_cfg(), Flags(), {}, r"no cluster given"),
    (cluster_cfg(ps=[PS], worker=[W0, W1]), Flags(), {}, r"which worker is this"),
    (cluster_cfg(ps=[PS], worker=[W0]), Flags(task_index=3), {}, r"worker 3 does not exist"),
    (cluster_cfg(ps=[PS], worker=[W0]), Flags(job_name="ps"), {}, r"this is `towers worker`"),
    (cluster_cfg(), Flags(), {"TF_CONFIG": "{not json"}, r"TF_CONFIG: not the JSON"),
])
def test_unclear_clusters_are_errors_naming_the_sources(cfg, flags, env, message):
    with pytest.raises(ClusterError, match=message):
        resolve(cfg, flags, "worker", env)


# --- variable placement over ps tasks ----------------------------------------------------

def test_two_ps_tasks_hold_resnet20_bytes_within_20_percent(graph):
    from launch.distributed.arrangements.ps_worker.plan import worker_plan
    from launch.distributed.cluster import Task
    from launch.runtime.training_graph import build_training_graph

    job = from_dict({"model": {"name": "resnet20"}, "data": {"source": "synthetic"},
                     "towers": {"devices": 2}, "train": {"batch_size": 8}})
    task = Task({"ps": (PS, "10.0.0.4:2222"), "worker": (W0,)}, "worker", 0)
    build_training_graph(job, worker_plan(job, task))
    held = {}
    for var in tf.compat.v1.global_variables():
        ps = tf.DeviceSpec.from_string(var.device).task
        assert tf.DeviceSpec.from_string(var.device).job == "ps", var.op.name
        held[ps] = held.get(ps, 0) + var.shape.num_elements() * var.dtype.size
    assert set(held) == {0, 1}
    assert max(held.values()) <= 1.2 * min(held.values()), held


def test_a_worker_of_ps_tasks_checks_that_the_chief_initialised_the_variables(graph):
    """Its session waits for the chief's variables on the ps tasks: the scaffold keeps
    TensorFlow's readiness checks, which name every variable not yet initialised (an
    in-process job has none to wait for: test_plan.py)."""
    from launch.distributed.arrangements.ps_worker.plan import worker_plan
    from launch.distributed.cluster import Task
    from launch.runtime.training_graph import build_training_graph

    job = from_dict({"model": {"name": "mlp", "hidden_units": [8]},
                     "data": {"source": "synthetic"}, "towers": {"devices": 1}})
    task = Task({"ps": (PS,), "worker": (W0,)}, "worker", 0)
    scaffold = build_training_graph(job, worker_plan(job, task)).scaffold
    scaffold.finalize()
    for check in (scaffold.ready_op, scaffold.ready_for_local_init_op):
        made_by = [check.op.name, *(t.op.name for t in check.op.inputs)]
        assert any(name.startswith("report_uninitialized_variables") for name in made_by), \
            made_by


def saved_variables(workers: int, sync: bool) -> dict[str, list]:
    """Name -> shape of what the chief of a job of `workers` workers saves."""
    from launch.distributed.arrangements.ps_worker.plan import worker_plan
    from launch.distributed.arrangements.ps_worker.role import WorkerRole
    from launch.distributed.cluster import Task
    from launch.runtime.training_graph import build_training_graph

    job = from_dict({"model": {"name": "mlp", "hidden_units": [8]}, "data": {"source": "synthetic"},
                     "train": {"batch_size": 64, "sync": sync}, "towers": {"devices": 1}})
    hosts = tuple(f"10.0.1.{i}:2222" for i in range(workers))
    task = Task({"ps": (PS,), "worker": hosts}, "worker", 0)
    plan = worker_plan(job, task)
    role = WorkerRole(job, task, type("Server", (), {"target": ""})())
    with tf.Graph().as_default():
        build_training_graph(job, plan, role.wrap_optimizer)
        role.hooks(None, None)
        # What the job's Saver saves: the global variables and any other saveables; but
        # for an asynchronous job's worker positions, which a restore sets from any
        # checkpoint, of any number of workers or none (test_worker_positions.py).
        saved = tf.compat.v1.global_variables() + tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        apart = tf.compat.v1.get_collection(RESTORED_APART)
        return {v.op.name: v.shape.as_list() for v in saved if v not in apart}


def test_what_a_job_saves_does_not_depend_on_its_worker_count_or_mode():
    # A checkpoint restores into any job whose saved variables have the same names and
    # shapes: 2 -> 3 and 3 -> 2 workers, synchronous or not, and across the two.
    found = {(n, sync): saved_variables(n, sync) for n in (2, 3) for sync in (False, True)}
    reference = found[(2, False)]
    assert "global_step" in reference and any(n.startswith("mlp/") for n in reference)
    for key, saved in found.items():
        assert saved == reference, key


def test_each_sync_worker_keeps_its_local_step_on_itself():
    # TensorFlow leaves the SyncReplicasOptimizer's local step without a device, so the
    # placer put it on the ps, shared by every worker: a worker starting later reset it
    # to 0 and a resumed job's first gradients were dropped as stale, for ever.
    from launch.distributed.arrangements.ps_worker.plan import worker_plan
    from launch.distributed.arrangements.ps_worker.role import WorkerRole
    from launch.distributed.cluster import Task
    from launch.runtime.training_graph import build_training_graph

    job = from_dict({"model": {"name": "mlp", "hidden_units": [8]}, "data": {"source": "synthetic"},
                     "train": {"batch_size": 64, "sync": True}, "towers": {"devices": 1}})
    task = Task({"ps": (PS,), "worker": (W0, W1)}, "worker", 1)
    plan = worker_plan(job, task)
    role = WorkerRole(job, task, type("Server", (), {"target": ""})())
    with tf.Graph().as_default():
        build_training_graph(job, plan, role.wrap_optimizer)
        local = [v for v in tf.compat.v1.local_variables() if "local_step" in v.op.name]
        assert len(local) == 1
        device = tf.DeviceSpec.from_string(local[0].device)
        assert (device.job, device.task) == ("worker", 1), local[0].device


def test_a_worker_takes_its_share_of_the_global_batch_and_of_the_data():
    from launch.distributed.arrangements.ps_worker.plan import worker_plan
    from launch.distributed.cluster import Task

    job = from_dict({"model": {"name": "mlp"}, "data": {"source": "synthetic"},
                     "train": {"batch_size": 64}, "towers": {"devices": 1}})
    for workers, shares in ((2, [32, 32]), (3, [22, 21, 21])):
        hosts = tuple(f"10.0.1.{i}:2222" for i in range(workers))
        plans = [worker_plan(job, Task({"ps": (PS,), "worker": hosts}, "worker", i))
                 for i in range(workers)]
        assert [p.process_batch_size for p in plans] == shares
        assert [p.share for p in plans] == [(i, workers) for i in range(workers)]


# --- real clusters -----------------------------------------------------------------------

MLP = ["--set", "model.name=mlp", "--set", "model.hidden_units=[32]",
       "--set", "optimizer.learning_rate=0.02", "--set", "train.batch_size=64",
       "--set", "train.log_every_steps=5", "--set", "data.num_examples=2000",
       "--set", "cluster.startup_timeout_secs=60", "--set", "cluster.shutdown_grace_secs=20"]


TRAINING = re.compile(r"towers: step \d+/")


def losses(stderr: str, *tasks: str) -> list[float]:
    """The losses the tasks logged, in the order of the global step each line names."""
    found = []
    for task in tasks:
        found += [(int(step), float(loss)) for step, loss in re.findall(
            rf"\[{task}\] towers: step (\d+)/\d+ loss=([\d.]+)", stderr)]
    return [loss for _, loss in sorted(found)]


@pytest.mark.e2e
def test_one_ps_two_workers_and_an_evaluator_train_to_the_end_and_exit(tmp_path):
    # Synchronous jobs run to their end in the TF_CONFIG test below and across hosts
    # (test_hosts.py); this one is asynchronous.
    ckpt = tmp_path / "ckpt"
    result = run_towers("local-cluster", *MLP, "--set", f"train.checkpoint_dir={ckpt}",
                        "--set", "train.steps=60", "--ps", "1", "--workers", "2",
                        "--evaluator", "--set", "eval.every_secs=1", timeout=240)
    summary = ok(result)
    assert summary["exit_codes"] == {"ps0": 0, "worker0": 0, "worker1": 0, "evaluator": 0}
    assert "[evaluator] towers: eval step" in result.stderr
    assert os.listdir(ckpt / "eval")

    # Run again (its tasks started by hand: the launcher's part is checked above): the
    # job is done, so no task takes a step, and every task ends.
    latest = tf.train.latest_checkpoint(str(ckpt))
    again = Cluster(tmp_path, [*MLP, "--set", "train.steps=60"], workers=2, ckpt=ckpt)
    try:
        for name, role, index in (("ps", "ps", 0), ("worker0", "worker", 0),
                                  ("worker1", "worker", 1)):
            again.start(name, role, index)
        again.finish()
    finally:
        again.stop()
    for worker in ("worker0", "worker1"):
        rerun = last_json(again.tasks[worker].stdout)
        assert rerun["steps_run"] == 0 and rerun["global_step"] == summary["global_step"]
        assert re.search(r"towers: at step \d+ already, train.steps is 60: no step to take",
                         again.tasks[worker].stderr), again.tasks[worker].stderr[-3000:]
    assert tf.train.latest_checkpoint(str(ckpt)) == latest
    assert summary["global_step"] >= 60
    assert int(tf.train.load_variable(tf.train.latest_checkpoint(str(ckpt)), "global_step")) >= 60
    # Asynchronous workers share the steps unevenly (under load one may log only once):
    # the job's loss is read from both workers' lines, by global step.
    logged = losses(result.stderr, "worker0", "worker1")
    assert len(logged) >= 2 and logged[-1] < logged[0], logged


LAUNCHER_ALONE = """
import sys
from launch.distributed import local_cluster


class Started(Exception):
    pass


def start(task):
    raise Started(task.name)


local_cluster._start = start
from launch.cli import main

try:
    main(["local-cluster", "--ps", "1", "--workers", "2", "--set", "model.name=resnet20",
          "--set", "train.checkpoint_dir=" + sys.argv[1]])
except Started as started:
    print("started", started, "tensorflow" in sys.modules)
"""


@pytest.mark.e2e
def test_local_cluster_starts_its_tasks_without_importing_tensorflow(tmp_path):
    """Each task checks the model as it loads; the launcher importing TensorFlow and the
    model to check it first cost 2-4 s a run. Its first task's start is where it stops."""
    run = subprocess.run([sys.executable, "-c", LAUNCHER_ALONE, str(tmp_path / "c")],
                         env=environment(), capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert run.stdout.split() == ["started", "ps0", "False"], (run.stdout, run.stderr[-2000:])


def start(args, env=None):
    return subprocess.Popen(towers_command(*args), env=env or environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def stop_all(processes):
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
    for proc in processes:
        proc.wait()


@pytest.mark.e2e
def test_a_tfjob_cluster_starts_in_any_order_and_its_first_step_matches_one_device(tmp_path):
    """Synchronous: the chief's first step waits for the worker's first gradient. The
    worker starts long after that step began, later than the operation timeout allows
    any step after the first, sooner than the startup timeout.

    That step, of 2 workers of 2 towers each running its share as 2 micro-batches
    (accumulation under SyncReplicasOptimizer is still one update), matches one device's
    step on the combined batch, trained here from the same start (in this process: a
    process adds nothing to it)."""
    start_ckpt = tmp_path / "start"
    ok(run_in_process("train", *MLP, "--set", f"train.checkpoint_dir={start_ckpt}",
                      "--set", "train.steps=1", "--set", "towers.devices=1"))
    step = [*MLP, "--set", "train.steps=1", "--set", "optimizer.name=sgd",
            "--set", f"train.warm_start.path={start_ckpt}", "--set", "data.shuffle_buffer=0"]
    ok(run_in_process("train", *step, "--set", f"train.checkpoint_dir={tmp_path / 'one'}",
                      "--set", "towers.devices=1"))

    ps, chief, worker = (f"127.0.0.1:{p}" for p in free_ports(3))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker]}
    timeout = 3
    args = [*step, "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}",
            "--set", "train.sync=true", "--set", "towers.devices=2",
            "--set", "train.accumulate_steps=2",
            "--set", f"cluster.operation_timeout_secs={timeout}"]
    tasks = []
    try:
        tasks.append(Process(tmp_path, "chief", "worker", *args, env=tf_config(cluster, "chief")))
        tasks[0].wait_for("waiting for ps 0")  # up before its ps
        tasks.append(Process(tmp_path, "ps", "ps", *args, env=tf_config(cluster, "ps", 0)))
        tasks[0].wait_for("model mlp on")  # its session, then its first step, comes next
        time.sleep(timeout + 3)  # makes the late start; no outcome waits on it
        tasks.append(Process(tmp_path, "worker", "worker", *args,
                             env=tf_config(cluster, "worker", 0)))
        for task in tasks:
            assert task.wait(timeout=180) == 0, task.stderr[-3000:]
    finally:
        for task in tasks:
            task.stop()
    assert last_json(tasks[0].stdout)["global_step"] == 1
    assert last_json(tasks[0].stdout)["job"] == "chief"

    one, two = (checkpoint_variables(tmp_path / name, "mlp/") for name in ("one", "ckpt"))
    assert one.keys() == two.keys() and one
    for name, value in one.items():
        np.testing.assert_allclose(two[name], value, atol=1e-5, rtol=0, err_msg=name)
    initial = checkpoint_variables(start_ckpt, "mlp/")
    assert any(not np.allclose(initial[n], one[n]) for n in one), (
        "the step changed nothing, so agreement proves nothing")


@pytest.mark.e2e
def test_a_ps_that_never_comes_is_a_clear_error_after_the_deadline(tmp_path):
    ps, worker = (f"127.0.0.1:{p}" for p in free_ports(2))
    result = run_towers("worker", *MLP, "--set", f"train.checkpoint_dir={tmp_path / 'c'}",
                        "--set", "cluster.startup_timeout_secs=3", "--ps-hosts", ps,
                        "--worker-hosts", worker, "--task-index", "0", timeout=120)
    assert result.returncode == 138, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"gave up after 3 s waiting for ps 0 at {ps}" in result.stderr


def started_pids(proc, seen=""):
    """Read the launcher's stderr until a task trains; the task pids by name, and the text."""
    pids, deadline = {}, time.monotonic() + 120
    while not TRAINING.search(seen) and time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        pids.update({name: int(pid) for name, pid in re.findall(r"(\w+) \(pid (\d+)\)", line)})
    assert pids and TRAINING.search(seen), seen[-3000:]
    return pids, seen


@pytest.mark.e2e
def test_a_worker_killed_under_local_cluster_the_chief_still_saves_its_final_checkpoint(
        tmp_path):
    ckpt = tmp_path / "c"
    proc = start(["local-cluster", *MLP, "--set", f"train.checkpoint_dir={ckpt}",
                  "--set", "train.steps=100000", "--set", "train.sync=true",
                  "--set", "cluster.reconnect_timeout_secs=60", "--ps", "1", "--workers", "2"])
    try:
        pids, seen = started_pids(proc)
        os.kill(pids["worker1"], 9)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        stop_all([proc])
    summary = last_json(out)
    # Reported as what it is, a failed worker; the others stopped cleanly, and the
    # chief, whose synchronous step waited for the dead worker, still saved.
    assert proc.returncode == 1, err[-3000:]
    assert summary["exit_codes"] == {"ps0": 0, "worker0": 0, "worker1": -9}, err[-3000:]
    final = [int(s) for s in re.findall(r"\[worker0\] towers: saved checkpoint at step (\d+)",
                                        seen + err)][-1]
    assert checkpoint_step(ckpt) == final and final > 0
    print(f"worker 1 killed: the others exited 0 within {took:.1f} s; final checkpoint at "
          f"step {final}")


def _is_zombie_free(pid: int) -> bool:
    """A pid may have been reused by an unrelated process; ours would be a towers task."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"launch" not in f.read()
    except OSError:
        return True


# --- a task killed with SIGKILL and started again ------------------------------------------

def restarted_job(tmp_path) -> Cluster:
    """1 ps, the chief and worker 1 of a job that runs until stopped, all started; a test
    kills and restarts. Its steps are paced: while a task started again imports
    TensorFlow, the others train on."""
    cluster = Cluster(tmp_path, [*MLP, *paced_mlp(0.01), "--set", f"train.steps={10**6}",
                                 "--set", "train.log_every_steps=50",
                                 "--set", "train.checkpoint_every_steps=100"], workers=2)
    try:
        for name, role, index in (("ps", "ps", 0), ("chief", "worker", 0),
                                  ("worker1", "worker", 1)):
            cluster.start(name, role, index)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def checkpoint_step(ckpt_dir) -> int:
    latest = tf.train.latest_checkpoint(str(ckpt_dir)) if os.path.isdir(ckpt_dir) else None
    return int(tf.train.load_variable(latest, "global_step")) if latest else -1


@pytest.mark.e2e
def test_killed_tasks_started_again_rejoin_and_the_chief_resumes_from_its_checkpoint(tmp_path):
    """Worker 1 killed (-9) and started again rejoins; then the chief, killed and started
    again, resumes from its last checkpoint; the job, stopped, ends cleanly. One job for
    both saves a whole cluster's start-up."""
    cluster = restarted_job(tmp_path)
    try:
        worker1 = cluster.tasks["worker1"]
        wait_until(lambda: TRAINING.search(worker1.stderr), "worker 1 to train")
        cluster.kill("worker1")
        worker_again = cluster.start("worker1-again", "worker", 1)
        wait_until(lambda: TRAINING.search(worker_again.stderr), "worker 1 to train again")
        wait_until(lambda: checkpoint_step(cluster.ckpt) >= 200, "a checkpoint past 200")
        cluster.kill("chief")
        saved = checkpoint_step(cluster.ckpt)
        chief_again = cluster.start("chief-again", "worker", 0)
        wait_until(lambda: last_logged(chief_again.stderr) >= saved + 50, "the chief to resume")
        for name, task in cluster.tasks.items():
            if name not in cluster.killed:
                task.proc.terminate()
        cluster.finish()
    finally:
        cluster.stop()
    resumed = saved_steps(chief_again.stderr)
    assert resumed and resumed[0] >= saved, (saved, resumed)
    assert resumed[-1] > saved  # its final checkpoint, on SIGTERM, is the latest:
    assert tf.train.latest_checkpoint(str(cluster.ckpt)).endswith(f"model.ckpt-{resumed[-1]}")


# --- metrics from every task ---------------------------------------------------------------

def series(url: str) -> dict:
    """{metric name: its labels and "value"} from one real HTTP scrape; {} if not answering
    yet."""
    from helpers.scrapes import families

    return {sample.name: sample.labels | {"value": sample.value}
            for family in families(url) for sample in family.samples}


@pytest.mark.e2e
def test_every_task_serves_its_metrics_and_a_sigterm_saves_and_every_task_exits_0(tmp_path):
    # Then the user's stop of the synchronous job: the chief saves its final checkpoint
    # while the ps still serves it, and no task waits for a peer that has gone.
    ckpt = tmp_path / "ckpt"
    proc = start(["local-cluster", *MLP, "--set", f"train.checkpoint_dir={ckpt}",
                  "--set", "train.steps=100000", "--set", "train.sync=true",
                  "--set", "cluster.reconnect_timeout_secs=60", "--ps", "1", "--workers", "2"])
    try:
        pids, seen = started_pids(proc)
        assert len(pids) == 3
        groups = json.loads((ckpt / "prometheus_targets.json").read_text())
        urls = {g["labels"]["towers_task"]: f"http://{g['targets'][0]}/metrics" for g in groups}
        assert set(urls) == {"ps0", "worker0", "worker1"}
        assert len(set(urls.values())) == 3

        def ready(samples, name):
            return samples and ("towers_global_step" in samples if name != "ps0"
                                else "towers_ps_variable_bytes" in samples)

        scraped = {}
        deadline = time.monotonic() + 120
        while len(scraped) < 3 and time.monotonic() < deadline:
            for name, url in urls.items():
                samples = series(url)
                if ready(samples, name):
                    scraped[name] = samples
            time.sleep(0.5)
        assert set(scraped) == set(urls), f"not all tasks scrapable: {sorted(scraped)}"
        identities = {(s["towers_up"]["job"], s["towers_up"]["task"]) for s in scraped.values()}
        assert identities == {("ps", "0"), ("worker", "0"), ("worker", "1")}
        assert scraped["ps0"]["towers_ps_variable_bytes"]["value"] > 0
        assert scraped["worker1"]["towers_global_step"]["value"] >= 0

        proc.terminate()
        sent = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        stop_all([proc])
    assert proc.returncode == 0, err[-3000:]
    summary = last_json(out)
    assert summary["exit_codes"] == {"ps0": 0, "worker0": 0, "worker1": 0}
    assert summary["stopped_by"] == "signal"
    final = [int(s) for s in re.findall(r"\[worker0\] towers: saved checkpoint at step (\d+)",
                                        seen + err)][-1]
    assert checkpoint_step(ckpt) == final == summary["global_step"]
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie_free(pid), pid
    print(f"every task exited 0 {took:.1f} s after SIGTERM; final checkpoint at step {final}")


@pytest.mark.e2e
def test_tasks_stop_when_local_cluster_is_killed(tmp_path):
    # One ps and one worker: a task of each kind.
    proc = start(["local-cluster", *MLP, "--set", f"train.checkpoint_dir={tmp_path / 'c'}",
                  "--set", "train.steps=100000", "--ps", "1", "--workers", "1"])
    pids: list[int] = []
    try:
        seen, deadline = "", time.monotonic() + 120
        while not TRAINING.search(seen) and time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen += line
            pids += [int(p) for p in re.findall(r"\(pid (\d+)\)", line)]
        assert len(pids) == 2 and TRAINING.search(seen), seen[-3000:]
        proc.kill()  # SIGKILL: the launcher gets no chance to stop its tasks itself
        proc.wait()
        deadline = time.monotonic() + 90
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        stop_all([proc])
        for pid in pids:
            if _alive(pid):
                os.kill(pid, 9)


def _alive(pid: int) -> bool:
    """Running and still ours (a reused pid would not be running `launch`)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[-1].startswith("Z"):
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"launch" in f.read()
    except OSError:
        return False
