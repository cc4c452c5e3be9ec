"""The example models of examples/custom_model through every way towers runs a job.

A TF1-style model function and a Keras builder train on the digits scikit-learn ships
(a copy in tests/data) with `towers train`; the Keras one also with `towers
local-cluster --ps 1 --workers 2` and `horovodrun -np 2` (the TF1 one takes the path
of the built-in models there, which tests/launch/distributed covers); `towers eval`
reads each checkpoint; the exported SavedModels, loaded in a fresh process, predict
what `towers eval --predictions` did on the same examples. An installed package's
entry point names a model; the user's own bug is reported as theirs. The ps/worker
job also carries tests/helpers/job_rates.py's check of a 2-worker asynchronous job's
examples/sec (so test_throughput_figures.py starts no cluster of its own for it). The
runs share one module fixture: the cluster jobs run in processes of their own, the
other commands through their main() in this process meanwhile, and a fresh process
serves the exports.
"""

import os
import runpy
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers.commands import ROOT, environment, last_json, ok, run_in_process, run_towers
from helpers.doc_pages import snippet as docs_snippet
from helpers.horovod import missing
from helpers.job_rates import check_job_rate

# One fixture runs everything; on a machine other test runs share it can take longer
# than the default per-test bound.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

EXAMPLES = os.path.join(ROOT, "examples", "custom_model")
KINDS = ("tf1", "keras")
STEPS = 60  # enough for both examples to pass 80% eval accuracy on digits
# Bounds against a hung run, not speed targets: other test runs may share the cores.
TIMEOUT = 600
CLUSTER_STEPS = 10
# Enough for the ps/worker job's rates to be compared within 5% (a timed span of about
# 3 s; the workers' spans start and end apart by a step or two).
RATE_STEPS = 300


def towers_run(*args: str) -> subprocess.CompletedProcess:
    return run_towers(*args, timeout=TIMEOUT)


def job_args(kind: str, data: str, ckpt: str, steps: int = STEPS) -> list[str]:
    return ["-c", os.path.join(EXAMPLES, f"{kind}.yaml"),
            "--set", f"data.path={data}/train.npz", "--set", f"data.eval_path={data}/eval.npz",
            "--set", f"train.checkpoint_dir={ckpt}", "--set", f"train.steps={steps}",
            "--set", "train.log_every_steps=20"]


def horovodrun(*args: str) -> subprocess.CompletedProcess:
    command = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
               "launch", *args]
    return subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


SERVE_BOTH = """
import json, sys
import numpy as np
import tensorflow as tf
examples, keras_code, work, readme_snippet = sys.argv[1:5]
features = np.load(examples)["features"]
found = {}
for kind in ("tf1", "keras"):
    model = tf.saved_model.load(f"{work}/{kind}-export")
    serve = model.signatures["serving_default"]
    np.save(f"{work}/{kind}-served.npy", serve(features=tf.constant(features))["predictions"])
    found[kind] = {"ops": sorted({op.type for op in serve.graph.get_operations()}),
                   "variables": sorted(v.name for v in model.variables)}
sys.path.insert(0, keras_code)  # the Keras weights file, into the user's own model,
names = {}  # as docs/model.md's snippet says to load it
exec(readme_snippet.replace("runs/served/1", f"{work}/keras-export"), names)
net = names["net"]
np.save(f"{work}/keras-weights.npy", np.asarray(net(features)))
print(json.dumps(found))
"""


def python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=environment(), capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def local_run(kind: str, data: str, base: str) -> dict:
    """validate (the builder), train, eval --predictions, export, each through the
    command's own main() in this process (a fresh process serves the exports)."""
    ckpt, out = os.path.join(base, f"{kind}-train"), os.path.join(base, f"{kind}-export")
    args = job_args(kind, data, ckpt)
    found = {"validate": run_in_process("validate", *args)} if kind == "keras" else {}
    found["train"] = run_in_process("train", *args)
    predictions = os.path.join(base, f"{kind}-eval.npy")
    found["eval"] = run_in_process("eval", *args, "--predictions", predictions)
    found["export"] = run_in_process("export", *args, "--out", out)
    return found


def cluster_args(kind: str, data: str, base: str, how: str) -> list[str]:
    steps = RATE_STEPS if how == "local-cluster" else CLUSTER_STEPS
    return job_args(kind, data, os.path.join(base, f"{kind}-{how}"), steps=steps)


def cluster_run(kind: str, data: str, base: str, how: str) -> subprocess.CompletedProcess | None:
    """A whole job as 1 ps + 2 workers, or as two Horovod ranks (None: no Horovod here)."""
    args = cluster_args(kind, data, base, how)
    if how == "local-cluster":
        return towers_run("local-cluster", "--ps", "1", "--workers", "2", *args)
    if missing() is None:
        return horovodrun("train", *args, "--backend", "horovod")
    return None


ENTRY_POINT_MODULE = """
import tensorflow as tf


def build(units=4):
    def model_fn(features, labels, ctx):
        w = tf.compat.v1.get_variable("w", [8 * 8, units])
        logits = tf.matmul(tf.reshape(features, [-1, 64]), w)
        return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return model_fn
"""


def install_entry_point_package(base: str) -> str:
    """A package installed as a bare *.dist-info in a folder of its own, registering
    `mynet`; returns the folder (the entry on sys.path that installs it)."""
    site = os.path.join(base, "site")
    os.makedirs(os.path.join(site, "their_models"))
    with open(os.path.join(site, "their_models", "__init__.py"), "w") as f:
        f.write(ENTRY_POINT_MODULE)
    info = os.path.join(site, "their_models-1.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: their-models\nVersion: 1.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[towers.models]\nmynet = their_models:build\n")
    return site


def entry_point_args(data: str, base: str) -> list[str]:
    return ["--set", "model.name=mynet", "--set", "model.units=10", "--set", "data.source=npz",
            "--set", f"data.path={data}/train.npz",
            "--set", f"train.checkpoint_dir={os.path.join(base, 'mynet')}",
            "--set", "train.steps=3", "--set", "train.batch_size=32"]


def entry_point_runs(data: str, base: str) -> dict:
    """`towers validate` and `towers train` through main() in this process, with the
    package's folder on sys.path as PYTHONPATH puts it there for a process."""
    site = os.path.join(base, "site")
    sys.path.insert(0, site)
    try:
        return {command: run_in_process(command, *entry_point_args(data, base), cwd=base)
                for command in ("validate", "train")}
    finally:
        sys.path.remove(site)
        sys.modules.pop("their_models", None)


BROKEN = """
import tensorflow as tf


def model_fn(features, labels, ctx):
    w = tf.compat.v1.get_variable("w", [64, 10])
    logits = tf.matmul(tf.reshape(features, [-1, 64]), w)
    if ctx.index == 1:
        logits = check_shapes(logits)
    return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def check_shapes(logits):
    return tf.reshape(logits, [-1, 7])   # the user's bug: 10 classes do not make rows of 7
"""


def broken_run(data: str, base: str) -> subprocess.CompletedProcess:
    folder = os.path.join(base, "broken")
    os.makedirs(folder)
    with open(os.path.join(folder, "broken_model.py"), "w") as f:
        f.write(BROKEN)
    with open(os.path.join(folder, "job.yaml"), "w") as f:
        f.write(f"model: {{name: 'broken_model:model_fn'}}\n"
                f"data: {{source: npz, path: {data}/train.npz}}\n"
                f"towers: {{devices: 2}}\ntrain: {{checkpoint_dir: {folder}/ckpt}}\n")
    return run_in_process("train", "-c", os.path.join(folder, "job.yaml"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("user_models"))
    data = os.path.join(base, "digits")
    digits = np.load(os.path.join(ROOT, "tests", "data", "digits.npz"))
    runpy.run_path(os.path.join(EXAMPLES, "digits.py"))["write"](
        digits["images"], digits["target"], data)
    install_entry_point_package(base)
    # Before the threads start: they work in another directory for a moment.
    found = {"entry-point": entry_point_runs(data, base)}
    # The cluster jobs, processes by nature, in threads while this process runs the
    # other commands through their main() (which holds this process's stdout and
    # stderr while it runs: one at a time, here).
    # One thread, so one cluster job at a time: the ps/worker job's rates are checked,
    # and its two workers should share the cores with this process's short commands,
    # not with two Horovod ranks as well.
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The TF1 model takes the same cluster paths as the built-in ones
        # (tests/launch/distributed); the Keras one is new there.
        futures = {how: pool.submit(cluster_run, "keras", data, base, how)
                   for how in ("local-cluster", "horovod")}
        for kind in KINDS:
            found[f"{kind}-local"] = local_run(kind, data, base)
        found["broken"] = broken_run(data, base)
        ran = {how: future.result() for how, future in futures.items()}
    for how in ("local-cluster", "horovod"):
        evaluated = ran[how] and run_in_process("eval", *cluster_args("keras", data, base, how))
        found[f"keras-{how}"] = {"run": ran[how], "eval": evaluated} if ran[how] else {}
    found["serve"] = python("-c", SERVE_BOTH, f"{data}/eval.npz", EXAMPLES, base,
                            docs_snippet("net.load_weights"))
    found["base"] = base
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_trains_and_evaluates(runs, kind):
    found = runs[f"{kind}-local"]
    assert ok(found["train"])["global_step"] == STEPS
    scored = ok(found["eval"])
    assert scored["global_step"] == STEPS and scored["accuracy"] > 0.8


def test_validate_says_what_the_name_resolved_to_with_every_parameter(runs):
    validated = runs["keras-local"]["validate"]
    assert validated.returncode == 0, validated.stderr
    lines = validated.stdout.splitlines()
    assert lines[0] == (f"# model keras_model:build: a builder in "
                        f"{os.path.join(EXAMPLES, 'keras_model.py')}")
    assert lines[1] == "# parameters: filters=16, hidden=64"


@pytest.mark.parametrize("kind", KINDS)
def test_the_export_serves_what_eval_predicted(runs, kind):
    exported = ok(runs[f"{kind}-local"]["export"])
    assert exported["outputs"] == {"predictions": [None, 10]}
    served = runs["serve"]
    assert served.returncode == 0, served.stderr[-3000:]
    graph = last_json(served.stdout)[kind]
    assert not [op for op in graph["ops"] if op.startswith(("Apply", "ResourceApply"))]
    assert not [v for v in graph["variables"]
                if "global_step" in v or "Momentum" in v or "Adam" in v]
    expected = np.load(os.path.join(runs["base"], f"{kind}-eval.npy"))
    got = np.load(os.path.join(runs["base"], f"{kind}-served.npy"))
    assert got.shape == expected.shape == (300, 10)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-5)  # class probabilities


def test_the_keras_weights_file_loads_into_the_users_model(runs):
    assert ok(runs["keras-local"]["export"])["keras_weights"].endswith("model.weights.h5")
    assert runs["serve"].returncode == 0, runs["serve"].stderr[-3000:]
    logits = np.load(os.path.join(runs["base"], "keras-weights.npy"))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = np.load(os.path.join(runs["base"], "keras-eval.npy"))
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


@pytest.mark.parametrize("name", ["keras-local-cluster", "keras-horovod"])
def test_cluster_jobs_train_and_their_checkpoints_evaluate(runs, name):
    found = runs[name]
    if not found:
        pytest.skip("horovod is not installed (`make horovod` builds it)")
    assert found["run"].returncode == 0, found["run"].stderr[-3000:]
    scored = ok(found["eval"])
    # Asynchronous workers may each take a step past the last: the job ends at or after it.
    assert scored["global_step"] >= CLUSTER_STEPS
    assert np.isfinite(scored["loss"])


def test_a_ps_worker_jobs_examples_per_sec_is_what_its_workers_records_add_up_to(runs):
    check_job_rate(runs["keras-local-cluster"]["run"])


def test_an_installed_package_names_a_model_by_entry_point(runs):
    found = runs["entry-point"]
    assert found["validate"].returncode == 0, found["validate"].stderr
    first = found["validate"].stdout.splitlines()[0]
    assert "entry point mynet of their-models 1.0" in first and "their_models:build" in first
    assert "units=10" in found["validate"].stdout.splitlines()[1]
    assert ok(found["train"])["global_step"] == 3


def test_the_users_own_bug_shows_their_frames_and_the_tower(runs):
    result = runs["broken"]
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Traceback (the model's own code")
    assert any("broken_model.py" in line and "in check_shapes" in line for line in lines)
    assert not any("site-packages" in line or "/towers/" in line for line in lines)
    assert lines[-1].startswith("towers: error: ") and "tower 1" in lines[-1]
    assert "broken_model:model_fn" in lines[-1]
    checkpoints = os.path.join(runs["base"], "broken", "ckpt")
    assert not os.path.exists(checkpoints) or not os.listdir(checkpoints)
