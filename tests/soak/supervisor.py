"""Running one schedule: the job's tasks started, its faults made at their times, and
what stopped restarted the way Slurm or Kubernetes would.

The supervisor restarts, while the job is not done:
- every task that ended with status 0 (a SIGTERM the schedule sent, or the stop of a
  chief the schedule stopped: a requeued node comes back), 138 (retryable) or that was
  killed by a signal;
- a task that ended with 4 (a resource failed) once the checkpoint disk is freed;
- nothing that ended with 1, 2, 3 or 5: those end the schedule (the checker says why).

The job is done when its chief (the one process, worker 0, horovodrun) exits 0 by itself:
its result not stopped by a signal. The other tasks then end by their own rules, and
nothing is restarted. Every process is started in a session of its own and stopped by
its process group when the schedule ends; links are restored and the disk freed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import tensorflow as tf
from helpers.commands import ROOT, environment, towers_command
from soak import jobs
from soak.jobs import ARRANGEMENTS, Arrangement
from soak.schedule import Fault, Schedule

from launch.distributed.ports import free_ports

RESTART_AFTER_SECS = 1.0  # a restart's back-off (Kubernetes: 10 s doubling; short here)
PORT = 2222  # every task's port on its own test host
FILLER = "filler"

# A stack dump of every thread of a task that overruns its bound, on SIGUSR2: written
# by a sitecustomize the soak puts first on the tasks' PYTHONPATH (the product is not
# changed for it).
SITE = """import faulthandler, signal
faulthandler.register(signal.SIGUSR2, all_threads=True)
"""


def stop_bound(deadlines: dict) -> float:
    """How long a task may take to exit after a SIGTERM: train.stop_timeout_secs for its
    step, then the job's end (the chief's final step, its reports: at most
    cluster.shutdown_grace_secs and a report's 10 s each), and a start-up's seconds."""
    return (deadlines["train.stop_timeout_secs"] + 2 * deadlines["cluster.shutdown_grace_secs"]
            + 2 * 10 + 15)


@dataclass
class Run:
    """One start of one task."""

    task: str
    generation: int
    size: int
    process: subprocess.Popen
    out: str
    err: str
    started: float
    ended: float | None = None
    status: int | None = None
    signals: list[tuple[float, str]] = field(default_factory=list)  # what the schedule sent

    @property
    def stderr(self) -> str:
        with open(self.err, errors="replace") as f:
            return f.read()

    @property
    def stdout(self) -> str:
        with open(self.out, errors="replace") as f:
            return f.read()

    def result(self) -> dict | None:
        """Its JSON result (for horovodrun: rank 0's), if it printed one."""
        text = self.stdout
        if self.task == "horovod":
            found = re.findall(r"^\[0\]<stdout>:(\{.*\})$", text, re.MULTILINE)
            return json.loads(found[-1]) if found else None
        lines = [line for line in text.strip().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None


@dataclass
class Record:
    """What a schedule's run did, for the checker."""

    schedule: Schedule
    runs: list[Run] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    done: bool = False
    hang: str | None = None
    overruns: list[str] = field(default_factory=list)  # SIGTERMed tasks past the stop bound
    faults_made: dict[str, int] = field(default_factory=dict)  # by kind
    fault_times: list[tuple[float, float, str]] = field(default_factory=list)  # start, end, kind
    checkpoint_dir: str = ""
    began: float = 0.0
    ended: float = 0.0
    sizes: list[int] = field(default_factory=list)

    def log(self, text: str) -> None:
        self.events.append((round(time.monotonic() - self.began, 2), text))


class Supervisor:
    """Runs `schedule` in `workdir` (its logs, the tmpfs of the checkpoint directory).

    network: test hosts (helpers.net_hosts.TestNetwork) for arrangements whose tasks run
    on hosts of their own; None runs them on 127.0.0.1 (no cut can be made).
    window_secs: how long an uninterrupted run trains (the schedule's time scale).
    """

    def __init__(self, schedule: Schedule, workdir: str, rows: str, network=None,
                 window_secs: float = 20.0):
        self.schedule = schedule
        self.arrangement: Arrangement = ARRANGEMENTS[schedule.arrangement]
        self.workdir = workdir
        self.network = network if self.arrangement.hosts else None
        self.window = window_secs
        self.disk = os.path.join(workdir, "disk")
        self.record = Record(schedule, checkpoint_dir=os.path.join(self.disk, "ckpt"))
        self.settings = jobs.job_settings(self.arrangement, rows, self.record.checkpoint_dir,
                                          schedule.ends_with_data)
        self.size = self.arrangement.size
        self.current: dict[str, Run] = {}
        self.generation: dict[str, int] = {}
        self.restart_at: dict[str, float] = {}
        self.waiting_for_disk: set[str] = set()
        self.timers: list[tuple[float, str, tuple]] = []
        self.disk_full_until = 0.0
        self.hogs: list[subprocess.Popen] = []
        self.loopback_ports: dict[str, int] = {}
        self.site = os.path.join(workdir, "site")
        self.mounted = False

    # --- the whole schedule ---------------------------------------------------------------

    def run(self) -> Record:
        record = self.record
        record.began = time.monotonic()
        os.makedirs(self.site, exist_ok=True)
        with open(os.path.join(self.site, "sitecustomize.py"), "w") as f:
            f.write(SITE)
        try:
            self._mount_disk()
            self._start_hogs()
            self._start_all()
            self._loop()
        finally:
            self._clean_up()
            record.ended = time.monotonic()
        return record

    def _deadline(self) -> float:
        """The bound on the whole schedule (a hang past it): the uninterrupted run's time
        several times over, each fault's length, each restart's stop and start, and the
        deadlines a lost peer runs out."""
        d = jobs.DEADLINES
        faults = self.schedule.faults
        spent = sum(f.secs for f in faults) + len(faults) * (stop_bound(d) + 30)
        return (self.record.began + 4 * self.window + spent + d["cluster.startup_timeout_secs"]
                + d["cluster.reconnect_timeout_secs"] + d["cluster.operation_timeout_secs"] + 120)

    def _loop(self) -> None:
        record = self.record
        deadline = self._deadline()
        first_step: float | None = None
        pending = list(self.schedule.faults)
        while True:
            now = time.monotonic()
            self._reap()
            if record.hang or self._failed():
                return
            if first_step is None and self._chief_stepped():
                first_step = now
                record.log("the job's first step")
            while first_step is not None and pending and not record.done and \
                    now >= first_step + pending[0].at:
                self._make(pending.pop(0))
                now = time.monotonic()
            self._fire_timers(now)
            if not record.done:
                self._restart_due(now)
            if record.done and not self._running() and not self.timers:
                return
            if now > deadline:
                self._hang(f"the schedule ran past its bound ({deadline - record.began:.0f} s)")
                return
            time.sleep(0.1)

    def _failed(self) -> bool:
        """A task ended with a status nothing restarts: the job cannot finish."""
        return any(_final_status(r) in (1, 2, 3, 5) for r in self.record.runs)

    # --- tasks ----------------------------------------------------------------------------

    def _task_names(self) -> list[str]:
        kind = self.arrangement.kind
        if kind == "one":
            return ["one"]
        if kind == "horovod":
            return ["horovod"]
        workers = [f"worker{i}" for i in range(self.size)]
        return (["ps0"] if kind == "ps" else []) + workers

    def _start_all(self) -> None:
        self.record.sizes.append(self.size)
        for name in self._task_names():
            self._start(name)

    def _start(self, name: str) -> None:
        gen = self.generation.get(name, 0)
        self.generation[name] = gen + 1
        label = f"{name}-{gen}"
        out, err = (os.path.join(self.workdir, f"{label}.{s}") for s in ("out", "err"))
        env = {**environment(), "PYTHONPATH": f"{self.site}{os.pathsep}"
               f"{environment()['PYTHONPATH']}"}
        with open(out, "w") as o, open(err, "w") as e:
            process = subprocess.Popen(self._command(name), cwd=ROOT, env=env, stdout=o,
                                       stderr=e, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        run = Run(name, gen, self.size, process, out, err, time.monotonic())
        self.current[name] = run
        self.record.runs.append(run)
        self.record.log(f"started {label} (pid {process.pid}, size {self.size})")

    def _command(self, name: str) -> list[str]:
        kind, args = self.arrangement.kind, jobs.as_args(self.settings)
        if kind == "one":
            return towers_command("train", *args, "--set", f"towers.devices={self.size}")
        if kind == "horovod":
            return [shutil.which("horovodrun"), "-np", str(self.size), "-H",
                    f"localhost:{self.size}", "--gloo", sys.executable, "-m", "launch", "train",
                    *args, "--backend", "horovod"]
        workers = [f"worker{i}" for i in range(self.size)]
        ps = ["ps0"] if kind == "ps" else []
        cluster = ["--worker-hosts", ",".join(self._address(w) for w in workers)]
        if ps:
            cluster += ["--ps-hosts", self._address("ps0")]
        role = "ps" if name.startswith("ps") else "worker"
        command = towers_command(role, *args, *cluster, "--task-index",
                                 name.removeprefix(role))
        if self.network is not None:
            command = self.network.host(name).command(*command)
        return command

    def _address(self, name: str) -> str:
        if self.network is not None:
            return f"{self.network.host(name).address}:{PORT}"
        if name not in self.loopback_ports:
            taken = set(self.loopback_ports.values())
            self.loopback_ports[name] = next(p for p in free_ports(8) if p not in taken)
        return f"127.0.0.1:{self.loopback_ports[name]}"

    def _running(self) -> list[Run]:
        return [r for r in self.current.values() if r.status is None]

    def _chief(self) -> str:
        return {"one": "one", "horovod": "horovod"}.get(self.arrangement.kind, "worker0")

    def _chief_stepped(self) -> bool:
        run = self.current.get(self._chief())
        # horovodrun relays its ranks' lines ("[0]<stderr>:towers: ...") on its stdout
        return run is not None and "towers: step " in run.stderr + run.stdout

    def _reap(self) -> None:
        for run in self._running():
            status = run.process.poll()
            if status is None:
                continue
            run.status, run.ended = status, time.monotonic()
            self.record.log(f"{run.task}-{run.generation} exited {status}")
            self._after_exit(run)

    def _after_exit(self, run: Run) -> None:
        record = self.record
        if record.done or _final_status(run) in (1, 2, 3, 5):
            return
        result = run.result() if run.status == 0 else None
        if run.task == self._chief() and result is not None and \
                result.get("stopped_by") != "signal":
            # As Kubernetes' success policy: the chief ending 0 by itself ends the job
            # (the checker says whether it ended where it should have).
            record.done = True
            record.log("the job is done")
            return
        if run.status == 4:
            self.waiting_for_disk.add(run.task)
            return
        now = time.monotonic()
        if run.status == 0 and self._finished(run):
            return  # its part done; started again only with the chief (below)
        self.restart_at[run.task] = now + RESTART_AFTER_SECS
        if run.task == self._chief():  # the whole job comes back, finished tasks too
            for name in self._task_names():
                current = self.current.get(name)
                if current is not None and current.status is not None and \
                        name not in self.waiting_for_disk:
                    self.restart_at.setdefault(name, now + RESTART_AFTER_SECS)

    def _finished(self, run: Run) -> bool:
        """Whether a run that exited 0 says its part of the job is done, as a Kubernetes
        pod that completed (not restarted): the end of the job in its result, not a stop
        (a signal, its own or the chief's) nor a start cut short."""
        result = run.result()
        if result is None or result.get("stopped_by") == "signal":
            return False
        if run.task.startswith("ps"):
            return result.get("workers_reported") == run.size
        if self.schedule.ends_with_data:
            return result.get("stopped_by") == "end of data"
        return result.get("global_step", 0) >= jobs.STEPS

    def _restart_due(self, now: float) -> None:
        for name in list(self.waiting_for_disk):
            if now >= self.disk_full_until:
                self.waiting_for_disk.discard(name)
                self.restart_at[name] = now
        for name, at in list(self.restart_at.items()):
            if now >= at:
                del self.restart_at[name]
                if name in self._task_names():  # not a worker a resize left out
                    self._start(name)

    # --- faults ---------------------------------------------------------------------------

    def _make(self, fault: Fault) -> None:
        record = self.record
        record.faults_made[fault.kind] = record.faults_made.get(fault.kind, 0) + 1
        now = time.monotonic()
        record.fault_times.append((now - record.began, now - record.began + fault.secs,
                                   fault.kind))
        record.log(f"fault: {fault}")
        if fault.kind in ("kill", "term", "pause"):
            sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "pause": signal.SIGSTOP}
            for target in fault.targets:
                self._signal(target, sig[fault.kind])
            if fault.kind == "pause":
                self.timers.append((now + fault.secs, "cont", fault.targets))
        elif fault.kind == "cut":
            hosts = [t for t in fault.targets if t in self._task_names()]
            for name in hosts:
                self.network.host(name).cut()
            self.timers.append((now + fault.secs, "restore", tuple(hosts)))
        elif fault.kind == "disk_full":
            self._fill_disk()
            self.disk_full_until = now + fault.secs
            self.timers.append((self.disk_full_until, "free", ()))
        elif fault.kind == "restart":
            self._restart_job(fault)

    def _fire_timers(self, now: float) -> None:
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        for _, what, targets in due:
            if what == "cont":
                for target in targets:
                    self._signal(target, signal.SIGCONT)
            elif what == "restore":
                for name in targets:
                    self.network.host(name).restore()
                self.record.log(f"links of {', '.join(targets)} restored")
            elif what == "free":
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.disk, FILLER))
                self.record.log("disk freed")

    def _signal(self, target: str, sig: signal.Signals) -> None:
        """Signal a task (a rank: the rank's own process, under horovodrun)."""
        if self.arrangement.kind == "horovod":
            run = self.current.get("horovod")
            pids = [pid for pid, rank in _ranks(run.process.pid).items()
                    if f"rank{rank}" == target] if run and run.status is None else []
        else:
            run = self.current.get(target)
            pids = [run.process.pid] if run and run.status is None else []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            run.signals.append((time.monotonic(), sig.name))
        if not pids and sig != signal.SIGCONT:
            self.record.log(f"{target} not running: {sig.name} not sent")

    def _restart_job(self, fault: Fault) -> None:
        """Every task stopped at once (SIGTERM), the newest checkpoint damaged, and the
        job started again at the fault's size."""
        for run in self._running():
            for pid in ([run.process.pid] if self.arrangement.kind != "horovod"
                        else list(_ranks(run.process.pid))):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            run.signals.append((time.monotonic(), "SIGTERM"))
        bound = time.monotonic() + stop_bound(jobs.DEADLINES) + self._paused_for()
        while self._running() and time.monotonic() < bound:
            self._reap()
            self._fire_timers(time.monotonic())
            time.sleep(0.1)
        for run in self._running():
            self.record.overruns.append(f"{run.task}-{run.generation} did not exit within "
                                        f"{stop_bound(jobs.DEADLINES):g} s of SIGTERM")
            self._dump_stacks(run)
            _kill_group(run.process)
        self._reap()
        self.restart_at.clear()
        self.waiting_for_disk.clear()
        if self.record.done:
            return
        if fault.damage:
            done = damage(self.record.checkpoint_dir, fault.damage)
            self.record.log(f"newest checkpoint: {done}")
        if self.record.hang is None:
            self.size = fault.size or self.size
            while time.monotonic() < self.disk_full_until:  # as a restart after exit 4 would
                self._fire_timers(time.monotonic())
                time.sleep(0.1)
            self._start_all()

    def _paused_for(self) -> float:
        """The longest SIGSTOP still to be lifted: a task cannot stop before SIGCONT."""
        now = time.monotonic()
        return max([at - now for at, what, _ in self.timers if what == "cont"], default=0.0)

    # --- resources --------------------------------------------------------------------------

    def _mount_disk(self) -> None:
        """A 32 MB tmpfs under the checkpoint directory, which a fault can fill."""
        os.makedirs(self.disk, exist_ok=True)
        if os.geteuid() == 0:
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs",
                                      self.disk], capture_output=True, text=True)
            self.mounted = mounted.returncode == 0

    def _fill_disk(self) -> None:
        if not self.mounted:
            self.record.log("no tmpfs: the disk cannot be filled")
            return
        try:
            with open(os.path.join(self.disk, FILLER), "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
        except OSError:
            pass

    def _start_hogs(self) -> None:
        for _ in range(self.schedule.hog):
            self.hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                              start_new_session=True,
                                              stdin=subprocess.DEVNULL))

    def _hang(self, why: str) -> None:
        self.record.hang = why
        self.record.log(f"hang: {why}")
        for run in self._running():
            self._dump_stacks(run)

    def _dump_stacks(self, run: Run) -> None:
        """Every thread's stack of the task (or of each rank) into its stderr."""
        pids = list(_ranks(run.process.pid)) if run.task == "horovod" else [run.process.pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGUSR2)
        time.sleep(1.0)

    def _clean_up(self) -> None:
        for _, what, targets in self.timers:
            if what == "cont":
                for target in targets:
                    with contextlib.suppress(Exception):
                        self._signal(target, signal.SIGCONT)
            elif what == "restore":
                for name in targets:
                    self.network.host(name).restore()
        self.timers = []
        for run in self.record.runs:
            _kill_group(run.process)
        for hog in self.hogs:
            _kill_group(hog)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.disk, FILLER))

    def unmount(self) -> None:
        """After the checker has read the checkpoints."""
        if self.mounted:
            subprocess.run(["umount", "-l", self.disk], check=False)
            self.mounted = False


def _final_status(run: Run) -> int | None:
    """A run's exit status; for horovodrun (1 whenever a rank failed), its worst rank's: a
    rank's 1, 2, 3 or 5 if any, else what the launcher says."""
    if run.task != "horovod" or run.status is None:
        return run.status
    ranks = [int(s) for s in re.findall(r"^Process \d+ exit with status code (-?\d+)",
                                        run.stdout + run.stderr, re.MULTILINE)]
    return next((s for s in ranks if s in (1, 2, 3, 5)), 0 if run.status == 0 else 138)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process's session (a task; horovodrun, and the ranks it started, each in
    a session of its own) by its pid."""
    if process.poll() is None:
        for pid in _ranks(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _ranks(launcher: int) -> dict[int, int]:
    """pid -> Horovod rank of the `towers` processes horovodrun `launcher` started (its
    descendants: horovodrun starts each rank in a process group of its own)."""
    parents, found = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, launcher):
            ancestor = parents.get(ancestor)
        if ancestor != launcher:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"launch" not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"HOROVOD_RANK" in env:
            found[pid] = int(env[b"HOROVOD_RANK"])
    return found


def damage(checkpoint_dir: str, how: str) -> str:
    """Truncate or delete the newest checkpoint's files (every task is down)."""
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest is None:
        return "none to damage"
    if how == "truncate":
        data = f"{latest}.data-00000-of-00001"
        with open(data, "r+b") as f:
            f.truncate(max(0, os.path.getsize(data) // 2))
    else:
        for suffix in (".index", ".data-00000-of-00001", ".meta"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(latest + suffix)
    return f"{how}d {os.path.basename(latest)}"
