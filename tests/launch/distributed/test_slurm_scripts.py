"""examples/slurm: what each sbatch script asks Slurm for adds up, and each runs towers
as the CLI accepts it (tests/launch/distributed/test_slurm_real.py and
test_slurm_nodes.py run the collective and ps/worker scripts on a real Slurm)."""

import os
import re
import shlex

import pytest
from helpers.commands import ROOT

from launch.cli import build_parser

EXAMPLES = os.path.join(ROOT, "examples", "slurm")
SCRIPTS = ["collective.sbatch", "ps_worker.sbatch", "horovod.sbatch"]


def read(name: str) -> str:
    with open(os.path.join(EXAMPLES, name)) as f:
        return f.read()


def directives(name: str) -> dict[str, str]:
    """The #SBATCH options, --name=value -> {name: value} (a bare flag -> "")."""
    found = re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", read(name), re.M)
    return {key: value for key, value in found}


def towers_args(name: str) -> list[str]:
    """The arguments the script gives `$TOWERS`, with its variables filled in."""
    line = re.search(r"\$TOWERS (train .*?) \"\$@\"", read(name)).group(1)
    return shlex.split(line.replace('"$JOB"', "job.yaml"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_saves_before_the_time_limit_and_requeues(name):
    options = directives(name)
    assert re.fullmatch(r"B:USR1@\d+", options["signal"]), "the early warning goes to the script"
    assert "requeue" in options and options["open-mode"] == "append"
    text = read(name)
    assert "trap" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert '[ "$status" = 138 ]' in text  # a task that ends with 138 requeues the job


def test_the_collective_script_gives_each_worker_its_own_gpu():
    options = directives("collective.sbatch")
    assert options["gpus-per-task"] == "1"
    assert towers_args("collective.sbatch") == ["train", "-c", "job.yaml"]


def test_the_ps_worker_script_has_a_ps_task_and_a_worker_per_gpu_on_every_node():
    options = directives("ps_worker.sbatch")
    gpus = int(options["gres"].split(":")[-1])
    assert int(options["ntasks-per-node"]) == gpus + 1
    assert towers_args("ps_worker.sbatch")[-2:] == ["--set", "cluster.ps_per_node=1"]


def test_the_horovod_script_has_a_rank_per_gpu_and_the_cli_accepts_its_command():
    options = directives("horovod.sbatch")
    assert int(options["gres"].split(":")[-1]) == int(options["ntasks-per-node"])
    args = build_parser().parse_args(towers_args("horovod.sbatch"))
    assert (args.command, args.backend) == ("train", "horovod")
