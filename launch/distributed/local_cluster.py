"""`towers local-cluster`: a whole ps/worker job as processes on 127.0.0.1.

Each task is a `towers ps|worker|evaluator` subprocess in its own process group,
so a Ctrl-C at the terminal reaches only this process, which forwards exactly
one SIGTERM to each task (a second signal would make a trainer abort instead of
saving). Every task is waited for or, on failure, stopped; none is left behind.
Workers (and the evaluator) are stopped before the ps tasks: the chief's final
checkpoint reads every variable from the ps tasks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from launch.config import JobConfig
from launch.distributed.cluster import ClusterError
from launch.distributed.ports import free_ports
from launch.log import log
from launch.runtime.signals import StopSignals

ENDING_SECS = 30  # after its step and grace: its reports, its exit (a loaded host's seconds)


def stop_wait_secs(job: JobConfig) -> float:
    """How long a task may take to exit after SIGTERM before it is killed: its step
    (train.stop_timeout_secs; 60 s when that waits for the step), the job's end (a ps
    serves its workers for at most cluster.shutdown_grace_secs), its reports and exit."""
    step = job.train.stop_timeout_secs
    return (60.0 if step is None else step) + job.cluster.shutdown_grace_secs + ENDING_SECS


@dataclass
class _Task:
    name: str  # "ps0", "worker1", "evaluator"
    args: list[str]
    metrics_port: int = 0
    process: subprocess.Popen | None = None
    stdout: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)


def plan_tasks(
    config: str | None, overrides: Sequence[str], num_ps: int, num_workers: int, evaluator: bool
) -> list[_Task]:
    if num_ps < 0 or num_workers < 1:
        raise ClusterError("local-cluster: --workers must be at least 1 and --ps at least 0 "
                           "(0: the workers all-reduce their gradients with collective ops)")
    num_tasks = num_ps + num_workers + int(evaluator)
    ports = free_ports(num_ps + num_workers + num_tasks)
    ports, metrics_ports = ports[: num_ps + num_workers], ports[num_ps + num_workers :]
    ps_hosts = ",".join(f"127.0.0.1:{p}" for p in ports[:num_ps])
    worker_hosts = ",".join(f"127.0.0.1:{p}" for p in ports[num_ps:])
    job = (["-c", config] if config else []) + [a for o in overrides for a in ("--set", o)]
    cluster = ["--worker-hosts", worker_hosts] + (["--ps-hosts", ps_hosts] if num_ps else [])
    tasks = [_Task(f"ps{i}", ["ps", *job, *cluster, "--task-index", str(i)]) for i in range(num_ps)]
    tasks += [
        _Task(f"worker{i}", ["worker", *job, *cluster, "--task-index", str(i)])
        for i in range(num_workers)
    ]
    if evaluator:
        tasks.append(_Task("evaluator", ["evaluator", *job, *cluster]))
    # Every task serves metrics on a port of its own (the last --set wins).
    for task, port in zip(tasks, metrics_ports, strict=True):
        task.metrics_port = port
        task.args += ["--set", f"metrics.port={port}"]
    return tasks


def write_targets(tasks: list[_Task], host: str, path: str) -> None:
    """A Prometheus file_sd file listing every task's metrics endpoint."""
    groups = [
        {"targets": [f"{host}:{t.metrics_port}"], "labels": {"towers_task": t.name}} for t in tasks
    ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "w") as f:
        json.dump(groups, f, indent=2)
    os.replace(partial, path)  # Prometheus may read it at any moment: never half-written


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it if this launcher dies, even by SIGKILL.

    The tasks run in sessions of their own (see the module docstring), so
    nothing else would tell them; without this a killed launcher leaves orphans.
    Linux only (prctl); elsewhere the launcher's own cleanup is all there is.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _start(task: _Task) -> None:
    task.process = subprocess.Popen(
        [sys.executable, "-m", "launch", *task.args],
        preexec_fn=_die_with_parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    for stream, keep in ((task.process.stdout, True), (task.process.stderr, False)):
        reader = threading.Thread(target=_relay, args=(task, stream, keep), daemon=True)
        reader.start()
        task.readers.append(reader)


def _relay(task: _Task, stream, keep: bool) -> None:
    """Copy a task's lines to our stderr with its name in front; keep its stdout too."""
    for line in stream:
        if keep:
            task.stdout.append(line)
        sys.stderr.write(f"[{task.name}] {line}")
        sys.stderr.flush()


def _is_ps(task: _Task) -> bool:
    return task.name.startswith("ps")


def _failed(task: _Task, stopping: StopSignals) -> bool:
    """Whether the task ended badly. After a stop request, a task that SIGTERM ended
    outright had nothing to save: it caught the signal just before it began or after
    it had finished, where no handler is installed."""
    code = task.process.returncode
    return code not in (None, 0) and not (stopping and code == -signal.SIGTERM)


def _stop(tasks: list[_Task], wait_secs: float) -> None:
    """SIGTERM every running task once, workers before ps tasks, then kill any task
    still running after wait_secs."""
    for group in ([t for t in tasks if not _is_ps(t)], [t for t in tasks if _is_ps(t)]):
        running = [t for t in group if t.process and t.process.poll() is None]
        for task in running:
            task.process.send_signal(signal.SIGTERM)
        for task in running:
            try:
                task.process.wait(timeout=wait_secs)
            except subprocess.TimeoutExpired:
                log(f"{task.name} did not stop within {wait_secs:g} s; killing it")
                task.process.kill()
                task.process.wait()


def run_local_cluster(
    job: JobConfig,
    config: str | None,
    overrides: Sequence[str],
    num_ps: int,
    num_workers: int,
    evaluator: bool,
    targets_path: str | None = None,
) -> int:
    """Run the job's tasks to the end; 0 when every task exited 0 (or, after a stop
    request, was ended by the SIGTERM passed on to it), else the status of the first
    task that failed (1 if it was killed by a signal)."""
    tasks = plan_tasks(config, overrides, num_ps, num_workers, evaluator)
    host = "127.0.0.1" if job.metrics.addr in ("0.0.0.0", "::", "") else job.metrics.addr
    targets_path = targets_path or os.path.join(job.train.checkpoint_dir, "prometheus_targets.json")
    write_targets(tasks, host, targets_path)
    log(
        "metrics: "
        + ", ".join(f"{t.name} {host}:{t.metrics_port}" for t in tasks)
        + f"; Prometheus file_sd targets in {targets_path}"
    )
    try:
        with StopSignals() as stopping:
            for task in tasks:
                _start(task)
            log("started " + ", ".join(f"{t.name} (pid {t.process.pid})" for t in tasks))
            failed = _wait(tasks, stopping)
    finally:
        _stop(tasks, stop_wait_secs(job))
        for task in tasks:
            for reader in task.readers:
                reader.join(timeout=5)
    codes = {t.name: t.process.returncode for t in tasks}
    chief = next(t for t in tasks if t.name == "worker0")
    result = json.loads(chief.stdout[-1]) if chief.stdout else {}
    result["exit_codes"] = codes
    if job.train.timeline:
        _merge_timelines(job.train.timeline, tasks)
    print(json.dumps(result, sort_keys=True), flush=True)
    if failed:
        log(f"{failed} failed; stopped the other tasks")
        # Pass on a status an orchestrator can act on (3 diverged, 138 a lost peer, ...);
        # a task killed by a signal has a negative returncode, which is no exit status.
        return codes[failed] if codes[failed] > 0 else 1
    return 0


def _merge_timelines(path: str, tasks: list[_Task]) -> None:
    """train.timeline: the workers' files (each wrote its own) joined into `path`."""
    from launch.runtime.timeline import merge, timeline_path  # imports TensorFlow

    found = [timeline_path(path, t.name) for t in tasks if t.name.startswith("worker")]
    found = [f for f in found if os.path.exists(f)]
    if found:
        merge(found, path)
        log(f"timelines of {len(found)} worker(s) merged into {path}")


def _wait(tasks: list[_Task], stopping: StopSignals) -> str | None:
    """Wait until every task has exited; on the first failure or a signal, stop the rest
    (on a signal: the workers first, the ps tasks once no worker is left).

    Returns the name of the first task that failed, if any.
    """
    forwarded: set[str] = set()
    while True:
        running = [t for t in tasks if t.process.poll() is None]
        failed = next((t.name for t in tasks if _failed(t, stopping)), None)
        if failed or not running:
            return failed
        if stopping:
            if not forwarded:
                log("forwarding the stop to the workers, then to the ps tasks")
            workers_left = any(not _is_ps(t) for t in running)
            for task in running:
                if task.name not in forwarded and (not _is_ps(task) or not workers_left):
                    task.process.send_signal(signal.SIGTERM)
                    forwarded.add(task.name)
        try:
            running[0].process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
