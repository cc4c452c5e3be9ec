"""A real Slurm cluster of one node for tests: munged, slurmctld and slurmd of Debian's
slurm-wlm, each with its own key, socket, ports, state, pid and log files in a
directory of the test's, so nothing is left behind and two runs never meet.

The node is this host under its own name (the name the jobs' node lists carry and
their tasks resolve), reached on 127.0.0.1; it declares more CPUs than the machine
has (`SlurmdParameters=config_overrides`), so a job of 3 tasks fits on 2 cores, and
optionally GPUs: Slurm's gres plugin only needs a device file per GPU, so character
devices made here stand in for /dev/nvidiaN and Slurm sets CUDA_VISIBLE_DEVICES and
SLURM_STEP_GPUS as it would on a GPU node (nothing ever opens them).

    with slurm.cluster(tmp_path, gpus=4) as cluster:
        job = cluster.sbatch(script, "--ntasks=2")
        assert cluster.wait_end(job).exit_code == 0

Daemons run in the foreground as this process's children and are stopped by pid;
jobs still in the queue are cancelled first, so no task outlives the cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch.distributed.local_cluster import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
# Job states after which a job runs no more (until requeued), as `scontrol show job` spells them.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}
START_TIMEOUT = 60.0  # generous: the daemons are up within about a second here


def why_unavailable() -> str | None:
    """None when a Slurm cluster can run here, else the reason (for a skip)."""
    missing = [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): run `make test`, "
                "which installs Debian's slurmctld, slurmd, slurm-client and munge")
    if os.geteuid() != 0:
        return "the test cluster runs slurmd as root (SlurmUser=root)"
    return None


@dataclass(frozen=True)
class JobEnd:
    state: str  # COMPLETED, FAILED, CANCELLED, ...
    exit_code: int  # the batch script's exit status
    signal: int  # the signal that ended it, 0 if none
    restarts: int  # how many times it was requeued


@dataclass
class Cluster:
    """A running one-node cluster; clients run through `command` with its SLURM_CONF."""

    root: Path
    node: str
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def environment(self, extra: dict | None = None) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def command(self, *args: str, env: dict | None = None, timeout: float = 60,
                check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, scontrol, ...) against this cluster."""
        done = subprocess.run(args, env=self.environment(env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    # --- jobs -----------------------------------------------------------------------------

    def sbatch(self, script: str | os.PathLike, *options: str, env: dict | None = None,
               args: Sequence[str] = ()) -> int:
        """Submit a batch script (a path); its output goes to `output(job)`. Returns the id."""
        done = self.command("sbatch", "--parsable", f"--output={self.root}/job-%j.out",
                            *options, str(script), *args, env=env)
        return int(done.stdout.strip().split(";")[0])

    def output(self, job: int) -> str:
        path = self.root / f"job-{job}.out"
        return path.read_text() if path.exists() else ""

    def job(self, job: int) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, ExitCode, Restarts, ...)."""
        text = self.command("scontrol", "show", "job", "--oneliner", str(job)).stdout
        return dict(re.findall(r"(\w[\w/:]*)=(\S*)", text))

    def state(self, job: int) -> str:
        return self.job(job)["JobState"]

    def wait_state(self, job: int, states: set[str] | str, timeout: float = 120) -> str:
        """Wait until the job is in one of `states`; fails on an ended job that is not."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(job)
            if state in wanted:
                return state
            if state in ENDED:
                raise AssertionError(f"job {job} ended {state}, not {wanted}:\n"
                                     f"{self.output(job)[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still {state} after {timeout:g} s, not {wanted}"
                                     f":\n{self.output(job)[-3000:]}")
            time.sleep(0.2)

    def wait_end(self, job: int, timeout: float = 300, restarts: int = 0) -> JobEnd:
        """Wait until the job has ended after at least `restarts` requeues."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job)
            if fields["JobState"] in ENDED and int(fields["Restarts"]) >= restarts:
                code, sig = (int(x) for x in fields["ExitCode"].split(":"))
                return JobEnd(fields["JobState"], code, sig, int(fields["Restarts"]))
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still {fields['JobState']} (restarts "
                                     f"{fields['Restarts']}) after {timeout:g} s:\n"
                                     f"{self.output(job)[-3000:]}")
            time.sleep(0.2)

    def scancel(self, job: int, *options: str) -> None:
        self.command("scancel", *options, str(job))

    def requeue(self, job: int) -> None:
        self.command("scontrol", "requeue", str(job))

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job still queued or running and wait until none runs."""
        listed = self.command("squeue", "--noheader", "--format=%i", check=False).stdout.split()
        for job in listed:
            self.command("scancel", job, check=False)
        deadline = time.monotonic() + timeout
        while listed and time.monotonic() < deadline:
            listed = self.command("squeue", "--noheader", "--format=%i", check=False).stdout.split()
            time.sleep(0.2)

    # --- daemons --------------------------------------------------------------------------

    def start(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")
        self.daemons[name] = subprocess.Popen(
            [name, *args], env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        log.close()

    def wait_idle(self, timeout: float = START_TIMEOUT) -> None:
        """Poll the node's state until slurmctld has it idle (registered, no job)."""
        deadline = time.monotonic() + timeout
        state = "(no answer)"
        while time.monotonic() < deadline:
            for name, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    raise RuntimeError(f"{name} exited {daemon.returncode}:\n{self.log(name)}")
            done = self.command("sinfo", "--noheader", "--format=%T", "--nodes", self.node,
                                check=False, timeout=10)
            state = done.stdout.strip() or "(no answer)"
            if state == "idle":
                return
            time.sleep(0.1)
        raise RuntimeError(f"node {self.node} still {state} after {timeout:g} s:\n"
                           f"{self.log('slurmctld')}\n{self.log('slurmd')}")

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        if not path.exists():
            path = self.root / "log" / f"{name}.out"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Cancel what still runs, then stop slurmd, slurmctld and munged, each by pid."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            daemon = self.daemons.get(name)
            if daemon is None or daemon.poll() is not None:
                continue
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def write_config(root: Path, node: str, gpus: int, extra: Sequence[str]) -> None:
    """slurm.conf (and gres.conf) for one node reached on 127.0.0.1, every path in root."""
    ctld_port, slurmd_port = free_ports(2)
    munge = root / "munge"
    gres = ""
    if gpus:
        devices = root / "dev"
        devices.mkdir()
        for index in range(gpus):  # NVIDIA's major number; Slurm only stats the file
            os.mknod(devices / f"nvidia{index}", 0o600 | stat.S_IFCHR, os.makedev(195, index))
        (root / "gres.conf").write_text(
            f"NodeName={node} Name=gpu File={devices}/nvidia[0-{gpus - 1}]\n")
        gres = f" Gres=gpu:{gpus}"
    lines = [
        f"ClusterName=towers{secrets.token_hex(3)}",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire is also how long a requeued job waits before it may start again
        # (120 s by default, 5 at the least): short, so the requeue tests are quick.
        f"AuthInfo=socket={munge}/munge.socket,cred_expire=5",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SlurmUser=root",
        "SlurmdUser=root",
        "MpiDefault=none",
        "ReturnToService=2",
        # The main scheduler looks at pending jobs every second, not every minute, so a
        # requeued job starts as soon as it may.
        "SchedulerParameters=sched_interval=1",
        "SlurmdParameters=config_overrides",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.log",
        *(["GresTypes=gpu"] if gpus else []),
        *extra,
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=8{gres} State=UNKNOWN",
        f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    (root / "slurm.conf").write_text("\n".join(lines) + "\n")


def start_munge(cluster: Cluster) -> None:
    """munged with a fresh key and its own socket, in the foreground."""
    munge = cluster.root / "munge"
    munge.mkdir(mode=0o755)  # munged wants its socket's directory searchable by all
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(128))
    key.chmod(0o600)
    cluster.start("munged", "--foreground", "--force", f"--key-file={key}",
                  f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                  f"--log-file={cluster.root}/log/munged.log", f"--seed-file={munge}/seed")
    deadline = time.monotonic() + START_TIMEOUT
    while not (munge / "munge.socket").exists():
        if cluster.daemons["munged"].poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start:\n{cluster.log('munged')}")
        time.sleep(0.05)


@contextlib.contextmanager
def cluster(tmp_path: Path, gpus: int = 0, extra_conf: Sequence[str] = ()) -> Iterator[Cluster]:
    """A one-node cluster whose files live in tmp_path/slurm; stopped when the block ends.

    gpus: GPUs the node declares (gres gpu). extra_conf: more slurm.conf lines, e.g.
    "RequeueExit=138".
    """
    root = Path(tmp_path) / "slurm"
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True)
    made = Cluster(root, socket.gethostname())
    try:
        write_config(root, made.node, gpus, extra_conf)
        start_munge(made)
        made.start("slurmctld", "-D", "-f", str(made.conf))
        made.start("slurmd", "-D", "-f", str(made.conf))
        made.wait_idle()
        yield made
    finally:
        made.stop()
