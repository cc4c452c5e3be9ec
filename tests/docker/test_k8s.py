"""docker/k8s: every manifest held to Kubernetes' own schemas, and the Indexed Job's parts
held to each other and to what towers makes of a pod's environment.

No Kubernetes runs here (the pods of the Indexed Job run as processes on test hosts
of their own, with the environment and DNS names Kubernetes would give them).
kubernetes-validate ships the OpenAPI schemas of every
Kubernetes release; each manifest of a built-in kind is validated strictly (an
unknown or misspelt field fails) against 1.31, the first release where a Job's
podFailurePolicy is generally available, and against the newest release the package
knows. Kubeflow's TFJob is a custom resource whose schema no package ships (and the
project does not copy other projects' files in), so its pod templates are validated
as Kubernetes pod templates and the TFJob around them structurally
(tests/docker/test_docker.py).
"""

import copy
import os

import pytest
import yaml
from helpers import net_hosts
from helpers.commands import FAST, ROOT, last_json
from kubernetes_validate import utils as k8s

from launch import modelref
from launch.cli import build_parser
from launch.config import load_job
from launch.distributed.cluster import Flags, resolve
from launch.distributed.cluster.indexed_job import DEFAULT_PORT
from launch.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUG,
    EXIT_DIVERGED,
    EXIT_PEER_UNAVAILABLE,
    EXIT_RESOURCE,
)

K8S = os.path.join(ROOT, "docker", "k8s")
OLDEST = "1.31"  # podFailurePolicy is GA from 1.31
VERSIONS = (OLDEST, k8s.latest_version())
GPUS_PER_WORKER = 4
CUSTOM_KINDS = {"TFJob"}


def documents(name: str) -> list[dict]:
    with open(os.path.join(K8S, name)) as f:
        return list(yaml.safe_load_all(f))


def by_kind(name: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in documents(name)}


def built_in() -> list[tuple[str, dict]]:
    return [(f"{name}:{doc['kind']}", doc) for name in sorted(os.listdir(K8S))
            if name.endswith((".yaml", ".yml")) for doc in documents(name)
            if doc["kind"] not in CUSTOM_KINDS]


# --- Kubernetes' schemas ------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("where, doc", built_in(), ids=[w for w, _ in built_in()])
def test_every_built_in_manifest_is_valid_kubernetes(where, doc, version):
    try:
        k8s.validate(doc, version, strict=True)
    except k8s.ValidationError as err:
        pytest.fail(f"{where} is not valid Kubernetes {version}: {err}")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_tfjobs_pod_templates_are_valid_kubernetes_pod_templates(version):
    for rtype, spec in by_kind("tfjob.yaml")["TFJob"]["spec"]["tfReplicaSpecs"].items():
        template = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": rtype.lower()}, "template": spec["template"]}
        try:
            k8s.validate(template, version, strict=True)
        except k8s.ValidationError as err:
            pytest.fail(f"TFJob {rtype}'s pod template is not valid Kubernetes {version}: {err}")


def test_the_validation_catches_a_misspelt_field():
    job = copy.deepcopy(by_kind("indexed-job.yaml")["Job"])
    job["spec"]["template"]["spec"]["subdomian"] = job["spec"]["template"]["spec"].pop("subdomain")
    with pytest.raises(k8s.ValidationError, match="subdomian"):
        k8s.validate(job, OLDEST, strict=True)


# --- the Indexed Job ----------------------------------------------------------------------

def indexed() -> dict[str, dict]:
    return by_kind("indexed-job.yaml")


def pod_spec() -> dict:
    return indexed()["Job"]["spec"]["template"]["spec"]


def container() -> dict:
    (only,) = pod_spec()["containers"]
    return only


def env_values() -> dict[str, str]:
    return {e["name"]: e["value"] for e in container()["env"] if "value" in e}


def test_the_job_is_indexed_and_restarts_a_pod_on_138_without_counting_it():
    spec = indexed()["Job"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
    rules = spec["podFailurePolicy"]["rules"]
    on_exit = {rule["action"]: rule["onExitCodes"] for rule in rules if "onExitCodes" in rule}
    assert EXIT_PEER_UNAVAILABLE == 138
    assert on_exit["Ignore"] == {"containerName": container()["name"], "operator": "In",
                                 "values": [EXIT_PEER_UNAVAILABLE]}
    # Statuses no restart fixes end the job at once: every one towers has, but 0 and 138.
    assert on_exit["FailJob"]["operator"] == "In"
    assert sorted(on_exit["FailJob"]["values"]) == sorted(
        [EXIT_BUG, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_RESOURCE])
    disruptions = [r for r in rules if "onPodConditions" in r]
    assert [(r["action"], r["onPodConditions"][0]["type"]) for r in disruptions] == [
        ("Ignore", "DisruptionTarget")]


def test_each_pod_is_named_by_the_headless_service_it_tells_towers_of():
    service, job = indexed()["Service"], indexed()["Job"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert pod_spec()["subdomain"] == service["metadata"]["name"] == env_values()[
        "TOWERS_K8S_SERVICE"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == int(
        env_values()["TOWERS_K8S_WORKERS"])
    by_label = [e for e in container()["env"] if e["name"] == "TOWERS_K8S_JOB"]
    assert by_label[0]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/job-name']")  # the Job's own name, no copy


def job_file(tmp_path):
    """The ConfigMap's job file, loaded as the pods load it."""
    path = tmp_path / "job.yaml"
    path.write_text(indexed()["ConfigMap"]["data"]["job.yaml"])
    return load_job(str(path), check_model=modelref.check)


def test_the_cluster_port_is_the_same_everywhere(tmp_path):
    port = job_file(tmp_path).cluster.port_base or DEFAULT_PORT
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports["cluster"] == port == indexed()["Service"]["spec"]["ports"][0]["port"]
    policy = indexed()["NetworkPolicy"]["spec"]
    own = [rule for rule in policy["ingress"] if "from" in rule]
    assert own == [{"from": [{"podSelector": policy["podSelector"]}], "ports": [{"port": port}]}]
    assert policy["podSelector"]["matchLabels"].items() <= (
        indexed()["Job"]["spec"]["template"]["metadata"]["labels"].items())


def pod_environment(index: int) -> dict[str, str]:
    """What a pod of index `index` sees: Kubernetes' variables and the manifest's."""
    name = indexed()["Job"]["metadata"]["name"]
    return {"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{name}-{index}",
            "TOWERS_K8S_JOB": name, **env_values()}


def test_every_pod_finds_the_same_cluster_and_itself_at_its_own_dns_name(tmp_path):
    workers = int(env_values()["TOWERS_K8S_WORKERS"])
    cluster = job_file(tmp_path).cluster
    tasks = [resolve(cluster, Flags(), "train", pod_environment(i)) for i in range(workers)]
    assert all(t.cluster == tasks[0].cluster for t in tasks)
    for index, task in enumerate(tasks):
        env = pod_environment(index)
        assert (task.job_name, task.task_index) == ("worker", index)
        # <hostname>.<subdomain>: the record the headless Service gives this pod.
        assert task.cluster["worker"][index] == (
            f"{env['HOSTNAME']}.{pod_spec()['subdomain']}:{cluster.port_base}")


@pytest.mark.e2e
def test_the_pods_train_to_the_end_finding_each_other_by_their_dns_names(tmp_path):
    """Each pod a process on a test host of its own (tests/helpers/net_hosts.py) with the
    pod's hostname, the environment Kubernetes and the manifest give it, and the DNS
    names the headless Service publishes (as the host's /etc/hosts), running the
    container's command on the ConfigMap's job, made small: the pods form their cluster
    with no address written anywhere, train to the end, and exit 0."""
    reason = net_hosts.why_unavailable()
    if reason:
        pytest.skip(reason)
    envs = [pod_environment(i) for i in range(int(env_values()["TOWERS_K8S_WORKERS"]))]
    names = [f"{env['HOSTNAME']}.{pod_spec()['subdomain']}" for env in envs]
    path = tmp_path / "job.yaml"
    path.write_text(indexed()["ConfigMap"]["data"]["job.yaml"])
    command = [str(path) if arg.endswith("job.yaml") else arg for arg in container()["args"]]
    small = [*FAST, "--set", "train.steps=20", "--set", f"train.checkpoint_dir={tmp_path / 'c'}",
             "--set", "cluster.startup_timeout_secs=60"]
    net_hosts.sweep_stale()
    network = net_hosts.TestNetwork.create()
    try:
        hosts = [network.host(f"pod{i}") for i in range(len(envs))]
        (tmp_path / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{host.address} {name} {env['HOSTNAME']}\n"
            for host, name, env in zip(hosts, names, envs, strict=True)))
        pods = [host.start(tmp_path, f"pod{i}", *command, *small, env=env,
                           prefix=host.as_machine(tmp_path / "hosts", env["HOSTNAME"]))
                for i, (host, env) in enumerate(zip(hosts, envs, strict=True))]
        for pod in pods:
            assert pod.wait(timeout=240) == 0, pod.stderr[-3000:]
        results = [last_json(pod.stdout) for pod in pods]
    finally:
        network.close()
    assert [(r["job"], r["task"]) for r in results] == [("worker", 0), ("worker", 1)]
    assert results[0]["global_step"] == 20
    assert f"worker 0 serving {names[0]}:2222 (chief)" in pods[0].stderr


def test_the_pods_run_towers_train_on_the_configmaps_job_with_every_gpu(tmp_path):
    args = build_parser().parse_args(container()["args"])
    assert args.command == "train"
    path = tmp_path / "job.yaml"
    path.write_text(indexed()["ConfigMap"]["data"]["job.yaml"])
    job = load_job(str(path), args.overrides, check_model=modelref.check)
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    assert args.config == os.path.join(mounts["job"], "job.yaml")
    assert job.train.checkpoint_dir.startswith(mounts["checkpoints"] + "/")
    assert not job.cluster.worker, "the cluster comes from the pods' environment"
    assert job.towers.devices == "auto"
    assert container()["resources"]["limits"]["nvidia.com/gpu"] == GPUS_PER_WORKER


def test_a_stopped_pod_has_time_to_save_and_no_pre_stop_hook_eats_into_it():
    # Kubernetes' default grace is 30 s; the final step and checkpoint may need more.
    assert pod_spec()["terminationGracePeriodSeconds"] >= 60
    assert "lifecycle" not in container()


def test_the_tfjob_gives_every_worker_the_same_gpus():
    specs = by_kind("tfjob.yaml")["TFJob"]["spec"]["tfReplicaSpecs"]
    limits = specs["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == GPUS_PER_WORKER
    job_file = yaml.safe_load(by_kind("tfjob.yaml")["ConfigMap"]["data"]["job.yaml"])
    assert job_file["towers"]["devices"] == "auto"
