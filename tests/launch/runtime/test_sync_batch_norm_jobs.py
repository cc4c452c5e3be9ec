"""towers.batch_norm in whole `towers train` jobs, run in this process: a checkpoint
directory resumes when the job switches between local and sync batch norm, and a
ps/worker job refuses sync with one line."""

import pytest

from launch.config import from_dict
from launch.distributed.cluster_spec import ClusterError, Task
from launch.runtime.train import train

RESNET = {"model": {"name": "resnet20", "image_size": 8, "base_filters": 4, "num_classes": 3},
          "data": {"source": "synthetic", "num_examples": 64},
          "towers": {"devices": 2}}


def run(ckpt, steps, batch_norm):
    raw = {**RESNET, "towers": {**RESNET["towers"], "batch_norm": batch_norm},
           "train": {"batch_size": 8, "steps": steps, "log_every_steps": 2,
                     "checkpoint_dir": str(ckpt)}}
    return train(from_dict(raw), write=lambda line: None)


def test_a_sync_jobs_checkpoint_resumes_with_local_batch_norm(tmp_path):
    # The variables are the same either way (tests/towers/test_sync_batch_norm.py), so
    # one switch stands for both directions.
    for steps, batch_norm in [(2, "sync"), (4, "local")]:
        result = run(tmp_path, steps, batch_norm)
        assert (result["global_step"], result["steps_run"]) == (steps, 2)


def test_a_ps_worker_job_refuses_sync_batch_norm_naming_the_key():
    from launch.distributed.worker import worker_plan

    job = from_dict({**RESNET, "towers": {"devices": 2, "batch_norm": "sync"}})
    task = Task({"ps": ("127.0.0.1:2222",), "worker": ("127.0.0.1:2223",)}, "worker", 0)
    with pytest.raises(ClusterError, match=r"^towers.batch_norm: sync is not available in "
                                           r"ps/worker jobs.*use local, or --backend horovod"):
        worker_plan(job, task)
