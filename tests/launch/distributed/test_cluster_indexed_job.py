"""launch/distributed/cluster/indexed_job.py: a Kubernetes Indexed Job's cluster from the
environment of each of its pods, as `towers train` resolves it (the manifest's own
wiring, and its pods training on test hosts, are in tests/docker/test_k8s.py)."""

import pytest
from helpers.launched import task_of

from launch.distributed.cluster import ClusterError

POD = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1", "TOWERS_K8S_JOB": "train",
       "TOWERS_K8S_SERVICE": "peers", "TOWERS_K8S_WORKERS": "3"}


def test_worker_i_is_the_pod_of_index_i_at_its_dns_name():
    task = task_of(POD)
    assert task.cluster == {"worker": ("train-0.peers:2222", "train-1.peers:2222",
                                       "train-2.peers:2222")}
    assert (task.job_name, task.task_index, task.gpus) == ("worker", 1, None)
    assert task_of(POD, "worker") == task


def test_the_port_is_cluster_port_base():
    assert task_of(POD, port_base=9000).cluster["worker"][2] == "train-2.peers:9000"


def test_a_job_of_one_pod_and_a_pod_not_set_up_for_towers_are_one_process():
    assert task_of({**POD, "JOB_COMPLETION_INDEX": "0", "TOWERS_K8S_WORKERS": "1"}) is None
    # Any Indexed Job has an index (its pods may be a sweep); the Service makes it a cluster.
    assert task_of({"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "sweep-1"}) is None


def test_a_pod_missing_a_variable_is_told_which():
    with pytest.raises(ClusterError, match="TOWERS_K8S_JOB, TOWERS_K8S_WORKERS not set"):
        task_of({"JOB_COMPLETION_INDEX": "0", "TOWERS_K8S_SERVICE": "peers"})


@pytest.mark.parametrize("change, message", [
    ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX=3 is not below TOWERS_K8S_WORKERS=3"),
    ({"TOWERS_K8S_WORKERS": "two"}, "TOWERS_K8S_WORKERS='two' is not a number"),
])
def test_inconsistent_settings_are_refused_naming_them(change, message):
    with pytest.raises(ClusterError, match=message):
        task_of({**POD, **change})


def test_ps_tasks_per_node_are_refused_since_every_pod_is_a_worker():
    with pytest.raises(ClusterError, match="cluster.ps_per_node: 1, but each pod of an Indexed "
                                           "Job is one worker"):
        task_of(POD, ps_per_node=1)


def test_a_cluster_given_elsewhere_too_must_agree():
    with pytest.raises(ClusterError, match="cluster.worker: sources disagree"):
        task_of(POD, worker=["a:1", "b:1", "c:1"])
