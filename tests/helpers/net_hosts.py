"""Test hosts: Linux network namespaces joined by a bridge, with links a test can cut.

Each host is a namespace with loopback up and one veth pair: `eth0` inside, with an
address in a private test subnet, and its peer in the root namespace, enslaved to a
bridge. Cutting a host's link (`ip link set <peer> down`) is a cable pulled: packets
vanish, nothing is refused, exactly as a partition looks to TCP. `tc`/netem is not
in every kernel (not in the CI one), so links are cut, never shaped.

Names carry this process's pid and a random tag, so a run never collides with
another run or with what a crashed run left behind; `sweep_stale` removes the
leftovers of runs whose process is gone. Only the hosts' addresses and loopback
are ever targets: the bridge has no address, so the root namespace cannot reach the
hosts and the hosts cannot reach anything else.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from helpers.commands import Process

PREFIX = "towers"  # namespaces: towers-<pid>-<tag>-<host>
_NAMESPACE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]+)-\w+$")


class Unavailable(Exception):
    """Namespaces cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def why_unavailable() -> str | None:
    """None when this process can make network namespaces, else the reason."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    trial = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(2)}-trial"
    made = _ip("netns", "add", trial, check=False)
    if made.returncode != 0:  # root without CAP_SYS_ADMIN, as in a default container
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", trial, check=False)
    return None


@dataclass
class Host:
    """One test host: a namespace, its address, and the root-side end of its link."""

    name: str
    namespace: str
    address: str
    link: str  # the veth end in the root namespace; down = the host is cut off
    network: TestNetwork

    def command(self, *args: str) -> list[str]:
        """args run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def as_machine(self, hosts_file, hostname: str) -> list[str]:
        """A prefix that runs a command on this host as on a machine of its own: in its
        network namespace, with `hostname` as its hostname and hosts_file as its
        /etc/hosts (`nsenter --net` + `unshare --mount --uts`; `ip netns exec` would
        remount /sys, where slurmd needs the cgroup tree). Each execs the next, so the
        pid is the command's."""
        return ["nsenter", f"--net=/run/netns/{self.namespace}", "unshare", "--mount",
                "--uts", "sh", "-c",
                f'mount --bind {hosts_file} /etc/hosts && hostname {hostname} && exec "$@"',
                "sh"]

    def start(self, tmp_path, name: str, *towers_args: str, env=None,
              prefix: list[str] | None = None) -> Process:
        """A `towers` command on this host (prefix: what runs it there, by default
        `ip netns exec`), stopped by pid when the network is closed."""
        process = Process(tmp_path, name, *towers_args, env=env,
                          prefix=prefix or self.command())
        self.network.processes.append(process)
        return process

    def cut(self) -> None:
        _ip("link", "set", self.link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")


@dataclass
class TestNetwork:
    """A bridge and any number of hosts on it; close() removes all of it."""

    tag: str
    subnet: str  # the first three octets, e.g. "10.231.7"
    bridge: str
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)

    @classmethod
    def create(cls) -> TestNetwork:
        tag = secrets.token_hex(2)
        network = cls(tag, f"10.231.{os.getpid() % 250 + 1}", f"tb{tag}{os.getpid()}")
        try:
            _ip("link", "add", network.bridge, "type", "bridge")
            _ip("link", "set", network.bridge, "up")
        except BaseException:
            network.close()
            raise
        return network

    def host(self, name: str) -> Host:
        """The host called `name`, made on first use."""
        return self.hosts[name] if name in self.hosts else self.add_host(name)

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        assert index <= 9, "at most 9 hosts: a link's name must fit in 15 characters"
        namespace = f"{PREFIX}-{os.getpid()}-{self.tag}-{name}"
        link = f"{self.bridge}h{index}"  # tb + 4 + a pid of at most 7 + h + 1: 15, the limit
        host = Host(name, namespace, f"{self.subnet}.{index}", link, self)
        self.hosts[name] = host
        _ip("netns", "add", namespace)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", link, "master", self.bridge)
        _ip("link", "set", link, "up")
        _ip("-n", namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Stop every process started on a host (by pid), then remove namespaces, links
        and the bridge. Safe to call twice and after a partial create."""
        for process in self.processes:
            process.stop()
        for host in self.hosts.values():
            _kill_namespace_processes(host.namespace)
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL what still runs in one of our namespaces (a child a test lost track of)."""
    listed = _ip("netns", "pids", namespace, check=False)
    for pid in listed.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def sweep_stale() -> None:
    """Remove namespaces (and their links) left by test runs whose process has died."""
    listed = _ip("netns", "list", check=False).stdout
    for line in listed.splitlines():
        namespace = line.split()[0] if line.split() else ""
        match = _NAMESPACE.match(namespace)
        if not match or os.path.exists(f"/proc/{match.group(1)}"):
            continue
        _kill_namespace_processes(namespace)
        _ip("netns", "del", namespace, check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for found in re.finditer(r"^\d+: (tb[0-9a-f]{4}(\d+))(?:h\d+)?[@:]", links, re.M):
        if not os.path.exists(f"/proc/{found.group(2)}"):
            _ip("link", "del", found.group(1), check=False)


class HostJob:
    """One run of a ps/worker job (or, with ps=0, a job without ps tasks) with every task
    on a test host of its own, named after
    the task (ps0, worker1, ...; hosts are made on first use and kept across runs), each
    task serving on port 2222 of its host's address, the way separate machines do.

    label: names this run's output files, so several runs of a test keep theirs.
    args: the job's settings; the cluster flags are added.
    """

    PORT = 2222

    def __init__(self, network: TestNetwork, tmp_path, label: str, args, workers: int,
                 ps: int = 1):
        self.network, self.tmp_path, self.label = network, tmp_path, label
        self.ps = [f"{network.host(f'ps{i}').address}:{self.PORT}" for i in range(ps)]
        self.workers = [f"{network.host(f'worker{i}').address}:{self.PORT}"
                        for i in range(workers)]
        self.args = [*args, *(["--ps-hosts", ",".join(self.ps)] if ps else []),
                     "--worker-hosts", ",".join(self.workers)]
        self.tasks: dict[str, Process] = {}

    def start(self, name: str, *extra: str) -> Process:
        """Start task `name` ("ps0", "worker1", "evaluator") on its host."""
        role = name.rstrip("0123456789")
        index = [] if role == "evaluator" else ["--task-index", name[len(role):]]
        host = self.network.host(name)
        self.tasks[name] = host.start(self.tmp_path, f"{self.label}-{name}", role, *self.args,
                                      *index, *extra)
        return self.tasks[name]

    def start_all(self, evaluator: bool = False) -> None:
        names = [f"ps{i}" for i in range(len(self.ps))]
        names += [f"worker{i}" for i in range(len(self.workers))]
        for name in names + (["evaluator"] if evaluator else []):
            self.start(name)

    def codes(self, timeout: float = 120) -> dict[str, int]:
        """Every task's exit status, waiting for each at most `timeout` seconds."""
        return {name: task.wait(timeout=timeout) for name, task in self.tasks.items()}

    def stop(self) -> None:
        for task in self.tasks.values():
            task.stop()
