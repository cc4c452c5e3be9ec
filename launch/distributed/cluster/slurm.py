"""A cluster from the Slurm step this process is a task of, worked out by each task from
the environment srun gives it, with no host list written by hand and no talk between
the tasks.

Under `srun` (alone, or inside an `sbatch` script) every task of the step gets
SLURM_STEP_NODELIST (the step's nodes, compressed: `node[01-03,07],gpu-a[1-2]`),
SLURM_STEP_TASKS_PER_NODE (`4(x2),3`: four tasks on each of two nodes, three on the
third), SLURM_STEP_NUM_TASKS, SLURM_PROCID (its rank in the step), SLURM_NODEID,
SLURM_LOCALID (its rank on its node) and SLURM_JOB_ID; with GPUs also
CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE. A step of one task is no cluster (a
one-process job), nor is a batch script itself (it has no SLURM_STEP_* variables).
The rules every task applies alike:

- **Layout**: tasks fill the nodes in order, as Slurm's default `block` distribution
  (and TensorFlow's SlurmClusterResolver) does: ranks 0..t0-1 on the first node of the
  list, the next t1 on the second, ... Another distribution (`cyclic`, `plane`,
  `arbitrary`) is refused where it would change that, i.e. with several nodes and
  several tasks on a node.
- **Roles**: every task a worker (a collective cluster), worker i being rank i. With
  cluster.ps_per_node P (a ps/worker job), the first P tasks of every node
  (SLURM_LOCALID < P) are ps tasks and the others workers, so the variables are spread
  over the nodes as the gradients are; ps tasks and workers are each numbered node by
  node, and worker 0, the chief, is the first worker of the first node.
- **Ports**: the task with local id l listens on `port_base + l`. Unless
  cluster.port_base is given, port_base is 15000 + 16 * (SLURM_JOB_ID mod 1000): the
  tasks of one job on a node never collide, two jobs sharing a node only if their ids
  are equal modulo 1000, and every port stays below 32768, where Linux starts handing
  out ephemeral ports. A requeued job keeps its id, so its ports. At most 16 tasks per
  node then.
- **GPUs**: where Slurm gave each task its own GPUs (`--gpus-per-task`, `--gpu-bind`:
  the task sees fewer than SLURM_GPUS_ON_NODE), a worker keeps what it sees. Where every
  task of a node sees all the node's GPUs (`--gres=gpu:N` or `--gpus-per-node`), the
  workers of the node split them in order, in equal contiguous shares (the first ones a
  GPU more when they do not divide). A ps task sees none: its variables live on its CPU.

Pure: no TensorFlow, no subprocess.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from launch.distributed.cluster.resolving import Found, Given, Resolver
from launch.distributed.cluster.task import ClusterError

STEP_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
                  "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID")
PORT_LOW = 15000
PORT_STRIDE = 16  # ports per job and node, so tasks per node at most, with a derived base
PORT_SLOTS = 1000  # job ids modulo this pick the block: 15000 .. 30999


class Slurm(Resolver):
    name = "the Slurm step"
    task_name = "the Slurm step's SLURM_PROCID"
    hint = "run every task under srun (several tasks)"
    launcher = True

    def read(self, given: Given) -> Found:
        environ = given.environ
        if not in_step(environ) or _integer(environ, "SLURM_STEP_NUM_TASKS") == 1:
            return Found()
        return step_task(environ, given.cfg.ps_per_node, given.cfg.port_base)


def in_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of an `srun` step (a batch script itself is not)."""
    return "SLURM_STEP_NUM_TASKS" in environ and "SLURM_PROCID" in environ


def step_task(environ: Mapping[str, str], ps_per_node: int = 0,
              port_base: int | None = None) -> Found:
    """This task's place in its step, by the rules in the module's docstring.

    ps_per_node: ps tasks on every node (0: a collective cluster). port_base: the port
    of each node's first task (None: derived from the job id).
    """
    missing = [name for name in STEP_VARIABLES if not environ.get(name)]
    if missing:
        raise ClusterError(f"slurm: {', '.join(missing)} not set: run each task under srun "
                           "(`srun towers train ...`, also inside an sbatch script)")
    nodes = expand_hostlist(environ["SLURM_STEP_NODELIST"])
    per_node = expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    rank, local = _integer(environ, "SLURM_PROCID"), _integer(environ, "SLURM_LOCALID")
    node = _integer(environ, "SLURM_NODEID")
    _check_layout(environ, nodes, per_node, rank, node, local)
    _check_ps(ps_per_node, nodes, per_node)
    base = _port_base(environ, per_node, port_base)
    cluster: dict[str, list[str]] = {"ps": [], "worker": []}
    for host, count in zip(nodes, per_node, strict=True):
        for task in range(count):
            role = "ps" if task < ps_per_node else "worker"
            cluster[role].append(f"{host}:{base + task}")
    job_name = "ps" if local < ps_per_node else "worker"
    index = (sum(min(c, ps_per_node) for c in per_node[:node]) + local if job_name == "ps"
             else sum(c - ps_per_node for c in per_node[:node]) + local - ps_per_node)
    workers_here = per_node[node] - ps_per_node
    gpus = _gpus(environ, job_name, local - ps_per_node, workers_here)
    return Found({j: tuple(h) for j, h in cluster.items() if h}, (job_name, index), gpus)


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ClusterError(f"slurm: {name}={environ[name]!r} is not a number") from None


def _check_layout(environ, nodes: list[str], per_node: list[int], rank: int, node: int,
                  local: int) -> None:
    """The step's variables agree with each other and with the block layout."""
    total = _integer(environ, "SLURM_STEP_NUM_TASKS")
    if len(nodes) != len(per_node) or sum(per_node) != total:
        raise ClusterError(
            f"slurm: SLURM_STEP_NODELIST={environ['SLURM_STEP_NODELIST']} and "
            f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']} do not make "
            f"SLURM_STEP_NUM_TASKS={total} tasks")
    if not (0 <= node < len(nodes) and 0 <= local < per_node[node]):
        raise ClusterError(f"slurm: SLURM_NODEID={node}, SLURM_LOCALID={local}: no such task "
                           f"in the step's {len(nodes)} node(s)")
    distribution = environ.get("SLURM_DISTRIBUTION", "block").split(":")[0]
    if distribution != "block" and len(nodes) > 1 and max(per_node) > 1:
        raise ClusterError(
            f"slurm: SLURM_DISTRIBUTION={distribution}: towers numbers tasks node by node, "
            "as the block distribution lays them out; run srun with --distribution=block "
            "(the default), or one task per node")
    if sum(per_node[:node]) + local != rank:
        raise ClusterError(f"slurm: SLURM_PROCID={rank} is not task {local} of node {node} "
                           "in the block layout; run srun with --distribution=block")


def _check_ps(ps_per_node: int, nodes: list[str], per_node: list[int]) -> None:
    short = [host for host, count in zip(nodes, per_node, strict=True) if count <= ps_per_node]
    if ps_per_node and short:
        raise ClusterError(
            f"cluster.ps_per_node: {ps_per_node} ps task(s) per node leave no worker on "
            f"{', '.join(short)}: ask Slurm for at least {ps_per_node + 1} tasks on every "
            "node (--ntasks-per-node)")


def _port_base(environ: Mapping[str, str], per_node: list[int], given: int | None) -> int:
    most = max(per_node)
    if given is not None:
        if given + most - 1 > 65535:
            raise ClusterError(f"cluster.port_base: {given} leaves no room for {most} tasks "
                               "on a node below port 65536; give a lower one")
        return given
    if most > PORT_STRIDE:
        raise ClusterError(
            f"slurm: {most} tasks on one node, but the ports derived from the job id leave "
            f"room for {PORT_STRIDE}: set cluster.port_base, with room for them")
    return PORT_LOW + PORT_STRIDE * (_integer(environ, "SLURM_JOB_ID") % PORT_SLOTS)


def _gpus(environ: Mapping[str, str], job_name: str, worker: int, workers: int) -> str | None:
    """CUDA_VISIBLE_DEVICES for this task: None to leave it, "" for none."""
    visible = environ.get("CUDA_VISIBLE_DEVICES", environ.get("SLURM_STEP_GPUS", "")).strip()
    if not visible:
        return None
    if job_name == "ps":
        return ""
    devices = visible.split(",")
    on_node = int(environ.get("SLURM_GPUS_ON_NODE") or len(devices))
    if len(devices) < on_node:  # Slurm bound GPUs to each task itself
        return visible
    if len(devices) < workers:
        raise ClusterError(
            f"slurm: {workers} workers on this node share {len(devices)} GPU(s): ask for "
            "a GPU per worker at least (--gpus-per-task, or more GPUs per node)")
    share, extra = divmod(len(devices), workers)
    start = worker * share + min(worker, extra)
    return ",".join(devices[start:start + share + (worker < extra)])


# --- Slurm's compressed lists --------------------------------------------------------------
# Written here rather than imported: TensorFlow's expand_hostlist lives in a module that
# loads TensorFlow (and handles one bracket group per name, where Slurm takes several:
# `n[1-2]-ib[0-1]`), and python-hostlist, the maintained library, is GPL-2.0-or-later,
# which this Apache-2.0 project does not take on. Checked against Slurm's own
# `scontrol show hostnames` in tests/launch/distributed/test_slurm_real.py.

_PART = re.compile(r"\[([^\[\]]*)\]|([^\[\],]+)")


def expand_hostlist(text: str) -> list[str]:
    """`node[01-03,07],gpu-a[1-2]` -> node01, node02, node03, node07, gpu-a1, gpu-a2.

    Order is kept and nothing is deduplicated, as in Slurm's own expansion; a name with
    several bracket groups stands for every combination, the last group varying fastest.
    """
    hosts = []
    for name in _split_top_level(text.strip()):
        pieces = _PART.findall(name)
        if not name or "".join(f"[{r}]" if r else lit for r, lit in pieces) != name:
            raise ClusterError(f"slurm: {text!r} is not a Slurm host list")
        choices = [_expand_range(r, text) if r else [lit] for r, lit in pieces]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    if not hosts:
        raise ClusterError("slurm: the step's node list is empty")
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _expand_range(ranges: str, text: str) -> list[str]:
    """`01-03,07` -> 01, 02, 03, 07: the width of each range's first number is kept."""
    values = []
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or not (high or low).isdigit() or int(high or low) < int(low):
            raise ClusterError(f"slurm: {text!r}: [{ranges}] is not a range of numbers")
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high or low) + 1)]
    return values


def expand_tasks_per_node(text: str) -> list[int]:
    """`4(x2),3` -> [4, 4, 3]: SLURM_STEP_TASKS_PER_NODE, one count per node in order."""
    counts = []
    for item in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not found:
            raise ClusterError(f"slurm: {text!r} is not a tasks-per-node list like 4(x2),3")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts
