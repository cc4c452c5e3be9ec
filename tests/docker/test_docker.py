"""docker/: the images, the compose project and the Kubernetes TFJob, held to the real CLI.

No Docker engine or Kubernetes runs here, so nothing is built or deployed. Instead:
every YAML parses and docker-compose accepts the compose file (it needs no engine
for that); every `towers` command line in the Dockerfiles, the compose services and
the TFJob is accepted by the CLI's own argument parser, and its job file and
overrides by the job loader; each compose service resolves to the task its name
says; the compose services' metrics ports are exactly Prometheus's scrape targets;
the Dockerfiles install the project the way the README does; and the TF_CONFIG the
training operator would give each replica of the TFJob runs a real cluster of
`towers` processes on 127.0.0.1 to the end (every process stopped by pid).
"""

import configparser
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import time

import pytest
import yaml
from helpers.commands import (
    FAST,
    ROOT,
    environment,
    last_json,
    overrides,
    run_in_process,
    towers_command,
)
from helpers.doc_pages import pages

from launch import modelref
from launch.cli import build_parser
from launch.config import load_job
from launch.distributed.cluster import Flags, resolve
from launch.distributed.ports import free_ports
from launch.errors import EXIT_BAD_INPUT, EXIT_PEER_UNAVAILABLE

DOCKER = os.path.join(ROOT, "docker")
COMPOSE = os.path.join(DOCKER, "docker-compose.yml")
TFJOB = os.path.join(DOCKER, "k8s", "tfjob.yaml")
JOB_MOUNT = "/etc/towers/job.yaml"  # where the compose services and the pods read the job


def read_yaml_documents(path: str) -> list:
    with open(path) as f:
        return list(yaml.safe_load_all(f))


def compose() -> dict:
    return read_yaml_documents(COMPOSE)[0]


def tfjob_documents() -> dict:
    """The manifest's documents by kind (each kind appears once)."""
    return {doc["kind"]: doc for doc in read_yaml_documents(TFJOB)}


def towers_services() -> dict[str, dict]:
    """The compose services that run the towers image."""
    return {name: s for name, s in compose()["services"].items()
            if s.get("image", "").startswith("towers:")}


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


check_model = modelref.check  # what `towers` itself checks a job's model with


# --- every YAML file parses ---------------------------------------------------------------

def yaml_files() -> list[str]:
    found = [os.path.join(d, f) for d, _, files in os.walk(DOCKER) for f in files
             if f.endswith((".yml", ".yaml"))]
    return sorted(os.path.relpath(p, ROOT) for p in found)


def test_the_docker_directory_has_the_promised_files():
    for path in ["Dockerfile", "Dockerfile.gpu", "docker-compose.yml", "k8s/tfjob.yaml",
                 "prometheus.yml", "grafana/towers-dashboard.json"]:
        assert os.path.isfile(os.path.join(DOCKER, path)), path


@pytest.mark.parametrize("path", yaml_files())
def test_every_yaml_file_parses(path):
    documents = read_yaml_documents(os.path.join(ROOT, path))
    assert documents and all(isinstance(d, dict) for d in documents), path


# --- Dockerfiles ------------------------------------------------------------------------

def dockerfile(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    with open(os.path.join(DOCKER, name)) as f:
        text = re.sub(r"\\\n", " ", f.read())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def readme_install_extra(flavour: str) -> str:
    """The pip target the README installs on a CPU or GPU host, e.g. `.[cpu]`."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    extras = re.findall(r"pip install -e '(\.\[\w+\])'", readme) + re.findall(
        r"install `'(\.\[\w+\])'`", readme)
    matching = [e for e in extras if e == f".[{flavour}]"]
    assert matching, f"the README no longer says how to install '.[{flavour}]'"
    return matching[0]


@pytest.mark.e2e
@pytest.mark.parametrize("name, flavour", [("Dockerfile", "cpu"), ("Dockerfile.gpu", "gpu")])
def test_dockerfiles_install_the_project_as_the_readme_does_and_run_towers_as_a_user(
        name, flavour):
    steps = dockerfile(name)
    target = readme_install_extra(flavour)
    installs = [args for op, args in steps if op == "RUN" and "pip install" in args]
    assert any(f"pip install '{target}'" in args for args in installs), installs
    extras = configparser.ConfigParser()
    extras.read(os.path.join(ROOT, "setup.cfg"))
    assert flavour in extras["options.extras_require"]
    assert "towers = launch.cli:main" in extras["options.entry_points"]["console_scripts"]

    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    last_user = max(i for i, (op, _) in enumerate(steps) if op == "USER")
    assert all(i < last_user for i, (op, args) in enumerate(steps) if "pip install" in args)
    entrypoint = [json.loads(args) for op, args in steps if op == "ENTRYPOINT"]
    assert entrypoint == [["towers"]]


def test_the_gpu_image_builds_horovod_with_nccl_by_the_projects_script():
    steps = dockerfile("Dockerfile.gpu")
    arguments = dict(args.split("=", 1) for op, args in steps if op == "ARG" and "=" in args)
    base = next(args for op, args in steps if op == "FROM")
    base = arguments.get(base.strip("${}"), base)
    # TensorFlow's official GPU image, at the version setup.cfg pins.
    assert re.fullmatch(r"tensorflow/tensorflow:2\.21\.\d+-gpu", base), base
    builds = [args for op, args in steps if op == "RUN" and "install-horovod.sh" in args]
    assert len(builds) == 1 and "HOROVOD_GPU_OPERATIONS=NCCL" in builds[0], builds
    script = re.search(r"(docker/install-horovod\.sh)", builds[0]).group(1)
    assert os.path.exists(os.path.join(ROOT, script)), f"{script} is not in the tree"


def test_the_build_context_keeps_what_pip_install_needs():
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = [p.strip().rstrip("/") for p in f if p.strip() and not p.startswith("#")]
    needed = ["setup.cfg", "pyproject.toml", "README.md", "launch/cli.py", "towers/__init__.py",
              "models/__init__.py", "examples/mlp.yaml", "docker/install-horovod.sh"]
    for path in needed:
        hits = [p for p in ignored if fnmatch.fnmatch(path, p) or path.startswith(p + "/")]
        assert not hits, f"{path} is excluded from the image by {hits}"


# --- every towers command line is one the CLI accepts -------------------------------------

def command_lines() -> list[tuple[str, list[str]]]:
    """(where, argv after `towers`) for every towers command the docker/ files run."""
    found = []
    for name in ("Dockerfile", "Dockerfile.gpu"):
        for op, args in dockerfile(name):
            if op == "CMD":
                found.append((f"docker/{name} CMD", json.loads(args)))
    for name, service in towers_services().items():
        found.append((f"compose service {name}", list(service["command"])))
    for rtype, spec in tfjob_documents()["TFJob"]["spec"]["tfReplicaSpecs"].items():
        container = spec["template"]["spec"]["containers"][0]
        found.append((f"TFJob {rtype}", list(container["args"])))
    return found


def tfjob_job_file(tmp_path) -> str:
    """The ConfigMap's job.yaml, written out as the pods see it."""
    path = tmp_path / "tfjob-job.yaml"
    path.write_text(tfjob_documents()["ConfigMap"]["data"]["job.yaml"])
    return str(path)


@pytest.mark.parametrize("where, argv", command_lines(),
                         ids=[where for where, _ in command_lines()])
def test_every_command_line_is_accepted_by_the_towers_cli(where, argv, tmp_path):
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse's way of rejecting a command line
        pytest.fail(f"{where}: towers {shlex.join(argv)} is rejected (exit {exit_.code})")
    job_file = None
    if args.config is not None:  # the file mounted there: the ConfigMap's, or compose's
        assert args.config == JOB_MOUNT, where
        job_file = (tfjob_job_file(tmp_path) if where.startswith("TFJob")
                    else os.path.join(DOCKER, "compose-job.yaml"))
    load_job(job_file, args.overrides, check_model=check_model)


@pytest.mark.parametrize("job_file", ["compose", "tfjob"])
def test_the_job_files_pass_towers_validate(job_file, tmp_path):
    path = (os.path.join(DOCKER, "compose-job.yaml") if job_file == "compose"
            else tfjob_job_file(tmp_path))
    # In this process, which has TensorFlow loaded already; and fewer of the built-in
    # examples, which the job files leave at the default: validate draws them all to
    # build the input, and their number is no part of what the files say.
    result = run_in_process("validate", "-c", path, "--set", "data.num_examples=512")
    assert result.returncode == 0, result.stderr[-2000:]
    resolved = yaml.safe_load(result.stdout)
    assert resolved["metrics"]["addr"] == "0.0.0.0", "Prometheus could not reach the tasks"


# --- compose ------------------------------------------------------------------------------

def compose_job():
    return load_job(os.path.join(DOCKER, "compose-job.yaml"), check_model=check_model)


@pytest.mark.e2e
def test_docker_compose_accepts_the_compose_file():
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is not installed: run `make test`, which installs Debian's "
                    "docker-compose (it checks a compose file without a Docker engine)")
    checked = subprocess.run([binary, "-f", COMPOSE, "config", "--quiet"], cwd=DOCKER,
                             capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_each_compose_service_resolves_to_the_task_its_name_says():
    job = compose_job()
    services = towers_services()
    assert sorted(services) == ["evaluator", "ps", "worker0", "worker1"]
    for name, service in services.items():
        argv = service["command"]
        assert argv[0] == re.sub(r"\d+$", "", name)
        if argv[0] == "evaluator":
            continue  # it only reads checkpoints: no cluster
        index = int(option(argv, "--task-index"))
        task = resolve(job.cluster, Flags(task_index=index), argv[0], environ={})
        assert (task.job_name, task.task_index) == (argv[0], index)
        host, port = task.address.split(":")
        assert host == name, f"{name} is addressed as {host} in compose-job.yaml"
        assert "ports" not in service, "cluster ports must stay on the compose network"
    chief = resolve(job.cluster, Flags(task_index=0), "worker", environ={})
    assert chief.is_chief and chief.address.startswith("worker0:")


def metrics_port(argv: list[str], job) -> int:
    ports = [o.split("=", 1)[1] for o in overrides(argv) if o.startswith("metrics.port=")]
    return int(ports[-1]) if ports else job.metrics.port  # the last --set wins


def test_prometheus_scrapes_exactly_the_compose_tasks_metrics_ports():
    job = compose_job()
    assert job.metrics.addr == "0.0.0.0"
    served = {f"{name}:{metrics_port(s['command'], job)}"
              for name, s in towers_services().items()}
    assert len({t.split(":")[1] for t in served}) == len(served), "each task its own port"
    with open(os.path.join(DOCKER, "prometheus.yml")) as f:
        jobs = yaml.safe_load(f)["scrape_configs"]
    static = {t for j in jobs for group in j.get("static_configs", []) for t in group["targets"]}
    assert static == served


def mounts(service: dict) -> dict[str, str]:
    """container path -> host path (relative to docker/) of a service's bind mounts."""
    pairs = [v.removesuffix(":ro").split(":") for v in service["volumes"]]
    return {target: source for source, target in pairs if source.startswith(".")}


def test_prometheus_and_grafana_are_wired_to_the_files_in_docker():
    services = compose()["services"]
    prometheus = mounts(services["prometheus"])
    assert prometheus["/etc/prometheus/prometheus.yml"] == "./prometheus.yml"
    assert "9090:9090" in services["prometheus"]["ports"]
    grafana = mounts(services["grafana"])
    assert grafana["/etc/grafana/provisioning"] == "./grafana/provisioning"
    provisioning = os.path.join(DOCKER, "grafana", "provisioning")
    with open(os.path.join(provisioning, "dashboards", "towers.yml")) as f:
        folder = yaml.safe_load(f)["providers"][0]["options"]["path"]
    shown = [source for target, source in grafana.items() if os.path.dirname(target) == folder]
    assert shown == ["./grafana/towers-dashboard.json"]
    with open(os.path.join(provisioning, "datasources", "prometheus.yml")) as f:
        source = yaml.safe_load(f)["datasources"][0]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")


def test_compose_tasks_share_the_checkpoint_volume_that_holds_the_checkpoint_dir():
    job = compose_job()
    assert "checkpoints" in compose()["volumes"]
    for name, service in towers_services().items():
        assert f"./compose-job.yaml:{JOB_MOUNT}:ro" in service["volumes"], name
        if name != "ps":
            mount = next(v.split(":")[1] for v in service["volumes"]
                         if v.startswith("checkpoints:"))
            assert job.train.checkpoint_dir.startswith(mount + "/"), name


# --- the Kubernetes TFJob -----------------------------------------------------------------

def replica_specs() -> dict:
    return tfjob_documents()["TFJob"]["spec"]["tfReplicaSpecs"]


def test_the_tfjob_restarts_exactly_the_retryable_exits():
    # Kubeflow's ExitCode policy retries 138 (user-defined retryable) and 130/137/143
    # (signals); 1-127 are permanent. Our statuses must fall on the right sides.
    assert EXIT_PEER_UNAVAILABLE == 138
    assert 1 <= EXIT_BAD_INPUT <= 127
    job = tfjob_documents()["TFJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert set(replica_specs()) <= {"Chief", "PS", "Worker", "Evaluator"}
    for rtype, spec in replica_specs().items():
        assert spec["restartPolicy"] == "ExitCode", rtype
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "None"  # ps, evaluator end by themselves


def test_every_tfjob_pod_is_scraped_where_it_serves_metrics_and_runs_as_a_user(tmp_path):
    job = load_job(tfjob_job_file(tmp_path), check_model=check_model)
    assert job.metrics.addr == "0.0.0.0" and not job.cluster.ps  # TF_CONFIG gives the cluster
    for rtype, spec in replica_specs().items():
        pod = spec["template"]
        container = pod["spec"]["containers"][0]
        assert container["name"] == "tensorflow", "the operator only looks at this container"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        port = metrics_port(container["args"], job)
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port) == str(ports["metrics"]), rtype
        assert "tfjob-port" in ports
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["job"] == os.path.dirname(JOB_MOUNT)
        if rtype != "PS":  # the chief writes checkpoints, the evaluator reads them
            assert job.train.checkpoint_dir.startswith(mounts["checkpoints"] + "/"), rtype


def test_only_the_jobs_own_pods_reach_the_cluster_port():
    policy = tfjob_documents()["NetworkPolicy"]["spec"]
    labels = policy["podSelector"]["matchLabels"]
    for rtype, spec in replica_specs().items():
        pod_labels = spec["template"]["metadata"]["labels"]
        assert labels.items() <= pod_labels.items(), rtype
    cluster_port = [rule for rule in policy["ingress"]
                    if {"port": 2222} in rule.get("ports", [])]
    assert cluster_port and all(rule["from"] == [{"podSelector": {"matchLabels": labels}}]
                                for rule in cluster_port)


# TF_CONFIG as Kubeflow's training operator writes it: the cluster lists every replica
# type but the evaluator, as "<job>-<type>-<i>.<namespace>.svc:<tfjob-port>"; the task
# is the pod's own type (lower case) and index.

def operator_tf_configs(address) -> dict[tuple[str, int], dict]:
    """(replica type, index) -> the TF_CONFIG its pod gets; address(type, i, port) names
    each task."""
    cluster = {}
    for rtype, spec in replica_specs().items():
        if rtype == "Evaluator":
            continue
        ports = spec["template"]["spec"]["containers"][0]["ports"]
        port = next(p["containerPort"] for p in ports if p["name"] == "tfjob-port")
        cluster[rtype.lower()] = [address(rtype.lower(), i, port)
                                  for i in range(spec["replicas"])]
    return {(rtype, i): {"cluster": cluster, "task": {"type": rtype.lower(), "index": i},
                         "environment": "cloud"}
            for rtype, spec in replica_specs().items() for i in range(spec["replicas"])}


def test_each_tfjob_replica_resolves_its_task_from_tf_config(tmp_path):
    job = load_job(tfjob_job_file(tmp_path), check_model=check_model)
    name = tfjob_documents()["TFJob"]["metadata"]["name"]
    configs = operator_tf_configs(lambda rtype, i, port: f"{name}-{rtype}-{i}.default.svc:{port}")
    chiefs = []
    for (rtype, index), config in configs.items():
        command = replica_specs()[rtype]["template"]["spec"]["containers"][0]["args"][0]
        if command == "evaluator":
            continue  # reads checkpoints only; TF_CONFIG's task says evaluator
        task = resolve(job.cluster, Flags(), command, {"TF_CONFIG": json.dumps(config)})
        assert (task.job_name, task.task_index) == (rtype.lower(), index)
        chiefs += [task.address] if task.is_chief else []
    assert chiefs == [f"{name}-worker-0.default.svc:2222"]  # no Chief replica: worker 0


@pytest.mark.e2e
def test_the_tfjob_tf_config_runs_a_real_cluster_to_the_end(tmp_path):
    """Every replica's own command, job file and TF_CONFIG; loopback ports instead of
    pod addresses, and a tiny, short run on top."""
    job_file = tfjob_job_file(tmp_path)
    configs = operator_tf_configs(lambda rtype, i, port: None)
    loopback = iter(free_ports(sum(len(h) for h in next(iter(configs.values()))["cluster"]
                                   .values())))
    cluster = {job: [f"127.0.0.1:{next(loopback)}" for _ in hosts]
               for job, hosts in next(iter(configs.values()))["cluster"].items()}
    metrics = iter(free_ports(len(configs)))
    short = [*FAST, "--set", "train.steps=30", "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}",
             "--set", "train.checkpoint_every_steps=10", "--set", "eval.every_secs=1",
             "--set", "cluster.startup_timeout_secs=60", "--set", "cluster.shutdown_grace_secs=20",
             "--set", "metrics.addr=127.0.0.1"]
    processes = {}
    try:
        for (rtype, index), config in configs.items():
            args = list(replica_specs()[rtype]["template"]["spec"]["containers"][0]["args"])
            args[args.index(JOB_MOUNT)] = job_file
            env = environment()
            env["TF_CONFIG"] = json.dumps({**config, "cluster": cluster})
            processes[f"{rtype.lower()}{index}"] = subprocess.Popen(
                towers_command(*args, *short, "--set", f"metrics.port={next(metrics)}"),
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                stdin=subprocess.DEVNULL)
        outputs, deadline = {}, time.monotonic() + 240
        for name, proc in processes.items():
            outputs[name] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in processes.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    for name, proc in processes.items():
        assert proc.returncode == 0, (name, outputs[name][1][-3000:])
        assert "metrics on http://127.0.0.1:" in outputs[name][1], name
    chief = last_json(outputs["worker0"][0])
    assert (chief["job"], chief["global_step"] >= 30) == ("worker", True)
    evaluated = last_json(outputs["evaluator0"][0])
    assert evaluated["global_step"] >= 30
    assert last_json(outputs["ps0"][0])["workers_reported"] == 2, {
        name: err[-1500:] for name, (_, err) in outputs.items()}


def test_the_documented_commands_name_these_files_and_images():
    readme = "\n".join(pages().values())  # the README and docs/
    for path in set(re.findall(r"-f (docker/\S+)", readme)):
        assert os.path.isfile(os.path.join(ROOT, path)), path
    built = dict(re.findall(r"docker build -f (docker/Dockerfile\S*) -t (towers:\w+) \.", readme))
    assert built == {"docker/Dockerfile": "towers:cpu", "docker/Dockerfile.gpu": "towers:gpu"}
    assert {s["image"] for s in towers_services().values()} == {"towers:cpu"}
    assert all(s["build"]["dockerfile"] == "docker/Dockerfile" for s in towers_services().values())
    images = {spec["template"]["spec"]["containers"][0]["image"]
              for spec in replica_specs().values()}
    assert images == {"towers:gpu"}  # what docs/kubernetes.md's sed replaces with a registry's
