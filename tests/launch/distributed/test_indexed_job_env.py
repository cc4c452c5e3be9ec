"""launch/distributed/indexed_job_env.py: a Kubernetes Indexed Job's cluster from the
environment of each of its pods (the manifest's own wiring is tests/docker/test_k8s.py)."""

import pytest

from launch.distributed.indexed_job_env import (
    IndexedJobError,
    in_indexed_job,
    indexed_job_task,
)

POD = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1", "TOWERS_K8S_JOB": "train",
       "TOWERS_K8S_SERVICE": "peers", "TOWERS_K8S_WORKERS": "3"}


def test_worker_i_is_the_pod_of_index_i_at_its_dns_name():
    task = indexed_job_task(POD)
    assert task.cluster == {"worker": ("train-0.peers:2222", "train-1.peers:2222",
                                       "train-2.peers:2222")}
    assert (task.job_name, task.task_index, task.cuda_visible_devices) == ("worker", 1, None)
    assert task.tf_config()["task"] == {"type": "worker", "index": 1}


def test_the_port_may_be_set():
    task = indexed_job_task({**POD, "TOWERS_K8S_PORT": "9000"})
    assert task.cluster["worker"][2] == "train-2.peers:9000"


def test_a_pod_outside_an_indexed_job_is_told_what_is_missing():
    assert in_indexed_job(POD) and not in_indexed_job({"HOSTNAME": "x"})
    with pytest.raises(IndexedJobError, match="TOWERS_K8S_SERVICE, TOWERS_K8S_WORKERS not set"):
        indexed_job_task({"JOB_COMPLETION_INDEX": "0", "TOWERS_K8S_JOB": "train"})


@pytest.mark.parametrize("change, message", [
    ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX=3 is not below TOWERS_K8S_WORKERS=3"),
    ({"TOWERS_K8S_WORKERS": "two"}, "TOWERS_K8S_WORKERS='two' is not a number"),
    ({"TOWERS_K8S_PORT": "http"}, "TOWERS_K8S_PORT='http' is not a number"),
])
def test_inconsistent_settings_are_refused_naming_them(change, message):
    with pytest.raises(IndexedJobError, match=message):
        indexed_job_task({**POD, **change})
