"""`towers train` under srun, until towers reads Slurm's environment itself: the task's
place from launch.distributed.slurm_env, handed to the `towers ps|worker` of today as
the TF_CONFIG it already reads. The sbatch examples run it as their TOWERS command in
the tests, so they run as written, and they will run towers itself once it forms
its cluster from Slurm (then this file goes).

    python slurm_towers.py train -c job.yaml [--set cluster.ps_per_node=N] [towers args]
"""

import json
import os
import sys

from launch.distributed.slurm_env import slurm_task

PS_PER_NODE = "cluster.ps_per_node="  # the job key the examples expect


def main(argv: list[str]) -> None:
    assert argv[0] == "train", argv
    args, ps_per_node = [], 0
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith(PS_PER_NODE) and argv[i - 1] == "--set":
            ps_per_node = int(arg[len(PS_PER_NODE):])
            args.pop()  # its --set
        else:
            args.append(arg)
    task = slurm_task(os.environ, ps_per_node=ps_per_node)
    os.environ["TF_CONFIG"] = json.dumps(task.tf_config())
    if task.cuda_visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = task.cuda_visible_devices
    os.execv(sys.executable, [sys.executable, "-m", "launch", task.job_name, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
