"""A real Slurm cluster for tests: munged, slurmctld and slurmd of Debian's slurm-wlm
22.05, each with its own key, socket, ports, state, pid and log files in a directory of
the test's, so nothing is left behind and two runs never meet.

`cluster()`: one node, this host under its own name (the name the jobs' node lists
carry and their tasks resolve), reached on 127.0.0.1. It declares more CPUs than the
machine has (`SlurmdParameters=config_overrides`), so a job of 3 tasks fits on 2
cores, and optionally GPUs: Slurm's gres plugin only needs a device file per GPU, so
character devices made here stand in for /dev/nvidiaN and Slurm sets
CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS as it would on a GPU node (nothing opens them).

`nodes_cluster()`: several nodes, each a test host (tests/net_hosts.py) that looks like
a machine of its own to Slurm and to the tasks: slurmd runs in the host's network
namespace, in a UTS namespace with the node's name as hostname, and in a mount
namespace whose /etc/hosts names every host (net_hosts.Host.as_machine).
slurmctld runs so on a host `ctl`, and so do the clients, as on a login node.

    with slurm.cluster(tmp_path, gpus=4) as cluster:
        job = cluster.sbatch(script, "--ntasks=2")
        assert cluster.wait_end(job).exit_code == 0

Daemons run in the foreground as this process's children and are stopped by pid;
jobs still in the queue are cancelled first, so no task outlives the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers.commands import FAST, ROOT, environment

from launch.distributed.ports import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
# Job states after which a job runs no more (until requeued), as `scontrol show job` spells them.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}
START_TIMEOUT = 60.0  # generous: the daemons are up within about a second here
EXAMPLES = Path(ROOT) / "examples" / "slurm"
# The examples' TOWERS command in the tests: towers itself, from the tree under test (the
# `towers` console script may be another checkout's), as `python -m launch`.
TOWERS = f"{sys.executable} -m launch"


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
    """A running cluster; clients run through `command` with its SLURM_CONF.

    client_prefix: what runs a client where the controller is reachable (nothing on
    one node; on test hosts, the controller's host).
    """

    root: Path
    nodes: list[str]
    client_prefix: list[str] = field(default_factory=list)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def node(self) -> str:
        """The first node (the only one of a one-node cluster)."""
        return self.nodes[0]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def environment(self, extra: dict | None = None) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def command(self, *args: str, env: dict | None = None, timeout: float = 60,
                check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, scontrol, ...) against this cluster."""
        done = subprocess.run([*self.client_prefix, *args], env=self.environment(env),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
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

    def step_environments(self, directory: Path, *options: str) -> list[dict]:
        """The environment of every task of `srun OPTIONS`, by SLURM_PROCID, each with
        HOSTNAME set to the hostname the task saw."""
        self.command("srun", *options, "bash", "-c",
                     f"env -0 > {directory}/env.$SLURM_PROCID; hostname > "
                     f"{directory}/host.$SLURM_PROCID", timeout=60)
        found = {}
        for path in directory.glob("env.*"):
            rank = path.name.split(".")[1]
            pairs = [item.split("=", 1) for item in path.read_text().split("\0") if "=" in item]
            hostname = (directory / f"host.{rank}").read_text().strip()
            found[int(rank)] = {**dict(pairs), "HOSTNAME": hostname}
        return [found[rank] for rank in sorted(found)]

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

    def start(self, name: str, *args: str, prefix: Sequence[str] = ()) -> None:
        """A daemon, `name` being its log's name too (slurmd-n1 runs slurmd)."""
        log = open(self.root / "log" / f"{name}.out", "w")
        self.daemons[name] = subprocess.Popen(
            [*prefix, name.split("-")[0], *args], env=self.environment(), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def wait_idle(self, timeout: float = START_TIMEOUT) -> None:
        """Poll the nodes' states until slurmctld has every one idle (registered, no job)."""
        deadline = time.monotonic() + timeout
        states = ["(no answer)"]
        while time.monotonic() < deadline:
            for name, daemon in self.daemons.items():
                if daemon.poll() is not None:
                    raise RuntimeError(f"{name} exited {daemon.returncode}:\n{self.log(name)}")
            done = self.command("sinfo", "--noheader", "--Node", "--format=%T", check=False,
                                timeout=10)
            states = done.stdout.split() or ["(no answer)"]
            if states == ["idle"] * len(self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError(f"nodes {self.nodes} still {states} after {timeout:g} s:\n"
                           f"{self.log('slurmctld')}\n{self.log('slurmd-' + self.node)}")

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        if not path.exists():
            path = self.root / "log" / f"{name}.out"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Cancel what still runs, then stop slurmd, slurmctld and munged, each by pid."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.cancel_all()
        order = [n for n in self.daemons if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            daemon = self.daemons.get(name)
            if daemon is None or daemon.poll() is not None:
                continue
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def write_config(root: Path, controller: tuple[str, str], nodes: Sequence[tuple[str, str]],
                 gpus: int, extra: Sequence[str]) -> None:
    """slurm.conf (and gres.conf): the controller and each node as (name, address);
    every path in root, a node's own ones named after it (%n)."""
    ctld_port, slurmd_port = free_ports(2)
    munge = root / "munge"
    gres = ""
    if gpus:
        devices = root / "dev"
        devices.mkdir()
        for index in range(gpus):  # NVIDIA's major number; Slurm only stats the file
            os.mknod(devices / f"nvidia{index}", 0o600 | stat.S_IFCHR, os.makedev(195, index))
        (root / "gres.conf").write_text(
            "".join(f"NodeName={name} Name=gpu File={devices}/nvidia[0-{gpus - 1}]\n"
                    for name, _ in nodes))
        gres = f" Gres=gpu:{gpus}"
    for name, _ in nodes:
        (root / "spool" / name).mkdir()
    lines = [
        f"ClusterName=towers{secrets.token_hex(3)}",
        f"SlurmctldHost={controller[0]}({controller[1]})",
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
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        *(["GresTypes=gpu"] if gpus else []),
        *extra,
        *(f"NodeName={name} NodeAddr={address} CPUs=8{gres} State=UNKNOWN"
          for name, address in nodes),
        f"PartitionName=test Nodes={','.join(n for n, _ in nodes)} Default=YES "
        "MaxTime=INFINITE State=UP",
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


def _layout(tmp_path: Path) -> Path:
    root = Path(tmp_path) / "slurm"
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True)
    return root


@contextlib.contextmanager
def _running(made: Cluster, prefix_of) -> Iterator[Cluster]:
    """Start munged, then slurmctld and every slurmd (prefix_of(name): what runs a
    daemon on that node or on the controller, "ctl"); stop them all when done."""
    try:
        start_munge(made)
        made.start("slurmctld", "-D", "-f", str(made.conf), prefix=prefix_of("ctl"))
        for node in made.nodes:
            made.start(f"slurmd-{node}", "-D", "-N", node, "-f", str(made.conf),
                       prefix=prefix_of(node))
        made.wait_idle()
        yield made
    finally:
        made.stop()


@contextlib.contextmanager
def cluster(tmp_path: Path, gpus: int = 0, extra_conf: Sequence[str] = ()) -> Iterator[Cluster]:
    """A one-node cluster whose files live in tmp_path/slurm; stopped when the block ends.

    gpus: GPUs the node declares (gres gpu). extra_conf: more slurm.conf lines, e.g.
    "RequeueExit=138".
    """
    root = _layout(tmp_path)
    made = Cluster(root, [socket.gethostname()])
    write_config(root, (made.node, "127.0.0.1"), [(made.node, "127.0.0.1")], gpus, extra_conf)
    with _running(made, lambda name: ()) as running:
        yield running


@contextlib.contextmanager
def nodes_cluster(tmp_path: Path, network, count: int) -> Iterator[Cluster]:
    """`count` nodes n1, n2, ... and the controller ctl, each a host of `network` (a
    net_hosts.TestNetwork); clients run on ctl. Stopped when the block ends (before
    the network is removed)."""
    root = _layout(tmp_path)
    hosts = [network.host("ctl"), *(network.host(f"n{i}") for i in range(1, count + 1))]
    (root / "hosts").write_text("127.0.0.1 localhost\n" +
                                "".join(f"{h.address} {h.name}\n" for h in hosts))

    def on(name: str) -> list[str]:
        """A command on host `name` as on a machine of its own."""
        return network.host(name).as_machine(root / "hosts", name)

    made = Cluster(root, [h.name for h in hosts[1:]], client_prefix=on("ctl"))
    write_config(root, ("ctl", hosts[0].address), [(h.name, h.address) for h in hosts[1:]],
                 0, ())
    with _running(made, on) as running:
        yield running


# --- the sbatch examples --------------------------------------------------------------------

def submit_example(cluster: Cluster, directory: Path, example: str, *options: str, steps: int,
                   towers_args: Sequence[str] = (), task_files: bool = False) -> int:
    """examples/slurm/<example> with sbatch OPTIONS, training the small built-in job with
    its checkpoints in directory/ckpt. train.steps is in the job file (directory/job.yaml),
    which each run of the job reads anew, so a test may change it while the job waits
    to be requeued.

    task_files: each task's output in a file of its own (task_results), as docs/slurm.md
    advises where a program reads the results: srun forwards the tasks' output in
    pieces, and a result line of over 1 KiB in the job's one file came out cut by
    another task's line on a loaded host."""
    write_job(directory, steps)
    env = {**environment(), "TOWERS": TOWERS, "JOB": str(directory / "job.yaml")}
    if task_files:  # srun's --output, from the environment the batch script passes on
        env["SLURM_STDOUTMODE"] = str(directory / "task-%t.out")
    return cluster.sbatch(
        EXAMPLES / example, *options, env=env,
        args=[*FAST, "--set", f"train.checkpoint_dir={directory / 'ckpt'}",
              "--set", "cluster.startup_timeout_secs=60", *towers_args])


def write_job(directory: Path, steps: int) -> None:
    (directory / "job.yaml").write_text(f"run:\n  name: slurm\ntrain:\n  steps: {steps}\n")


def results(output: str) -> list[dict]:
    """Every task's JSON result line in a job's output, in order."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def task_outputs(directory: Path) -> list[str]:
    """What each task of a job submitted with task_files wrote, by task rank."""
    files = sorted(directory.glob("task-*.out"), key=lambda f: int(f.stem.split("-")[1]))
    return [f.read_text() for f in files]


def written_since(outputs: Sequence[str], earlier: Sequence[str] = ()) -> str:
    """What the tasks' `outputs` (task_outputs) hold past `earlier` (task_outputs read
    before), task after task, each on lines of its own: srun appends to a task's file
    across requeues, as --open-mode=append has the job's own file appended to."""
    earlier = [*earlier, *[""] * (len(outputs) - len(earlier))]
    return "\n".join(now[len(before):] for now, before in zip(outputs, earlier, strict=True))


def task_results(directory: Path) -> list[dict]:
    """The results of a job submitted with task_files, by task rank."""
    return [result for output in task_outputs(directory) for result in results(output)]
