"""Prometheus metrics: the exporter in-process, then a real `towers train` scraped over HTTP
by this test, by promtool and by a real Prometheus server, and the docker/ files against it.

promtool and prometheus come from Debian's `prometheus` package, which `make test`
installs; without them these tests fail (not skip) and say so.
"""

import json
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import pytest
import tensorflow as tf
import yaml
from helpers.commands import FAST, ROOT, last_json, ok, run_in_process, start_towers
from helpers.scraper import Scraper, unclaimable_ports
from prometheus_client.parser import text_string_to_metric_families

from launch import metrics
from launch.config import MetricsConfig, SessionConfig
from launch.metrics import exporter as exporter_module
from launch.metrics.training import _UNSCRAPED_DURATIONS
from launch.runtime.progress import ProgressHook

V1 = tf.compat.v1
RUN = "metrics-test"
BATCH = 32  # FAST's train.batch_size


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed: run `make test`, which installs Debian's "
                    "prometheus package (promtool and prometheus)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5, context: ssl.SSLContext | None = None):
    """(status, body) of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def samples(text: str) -> dict[str, list]:
    """Sample name -> [(labels, value)] of one scrape, parsed by prometheus_client."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(text: str, name: str) -> float:
    (labels, v), = samples(text)[name]
    return v


def write(_line: str) -> None:
    pass


# ---------------------------------------------------------------------------------------
# The exporter, in this process.


@pytest.fixture
def exporter():
    with metrics.serve(MetricsConfig(port=0), metrics.Identity("train", 3, "r1"), write) as e:
        yield e


def test_every_series_carries_job_task_and_run(exporter):
    exporter.gauge("towers_test_value", "a test gauge").set(7)
    status, text = get(exporter.url)
    assert status == 200
    found = samples(text)
    assert value(text, "towers_test_value") == 7
    assert "process_resident_memory_bytes" in found and "process_cpu_seconds_total" in found
    for name, series in found.items():
        for labels, _ in series:
            assert {"job": "train", "task": "3", "run": "r1"}.items() <= labels.items(), name


def test_healthz_answers_200_until_a_problem_is_reported(exporter):
    base = exporter.url.removesuffix("/metrics")
    assert get(base + "/healthz") == (200, "ok\n")
    exporter.set_unhealthy("lost the ps task")
    assert get(base + "/healthz") == (503, "lost the ps task\n")
    assert get(base + "/other")[0] == 404


def test_serving_is_off_without_a_port():
    with metrics.serve(MetricsConfig(port=None), metrics.Identity("train", 0, "r"), write) as e:
        assert e is None


def test_the_server_stops_at_the_end_of_the_block():
    with metrics.serve(MetricsConfig(port=0), metrics.Identity("eval", 0, "r"), write) as e:
        url = e.url
        assert get(url)[0] == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_a_regularly_scraped_exporter_waits_for_a_final_scrape(monkeypatch):
    longest = 120.0  # a wait far longer than the scrape below needs, however busy the machine
    monkeypatch.setattr(exporter_module, "FINAL_SCRAPE_WAIT_SECS", (longest, longest))
    e = metrics.start(MetricsConfig(port=0), metrics.Identity("train", 0, "r"), write)
    gauge = e.gauge("towers_test_value", "a test gauge")
    get(e.url)
    get(e.url)  # two scrapes: something scrapes us regularly
    gauge.set(42)  # the final value
    seen = []
    scraper = threading.Timer(0.3, lambda: seen.append(get(e.url)[1]))
    scraper.start()
    started = time.monotonic()
    e.close()
    scraper.join()
    assert value(seen[0], "towers_test_value") == 42
    # The promise: close() returns once the final scrape is sent, not at its bound.
    assert time.monotonic() - started < longest


def self_signed_certificate(directory) -> tuple[str, str]:
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


@pytest.mark.e2e
def test_tls_serves_https_only(tmp_path):
    cert, key = self_signed_certificate(tmp_path)
    cfg = MetricsConfig(port=0, certfile=cert, keyfile=key)
    with metrics.serve(cfg, metrics.Identity("train", 0, "r"), write) as e:
        assert e.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=cert)
        status, text = get(e.url, context=trusted)
        assert status == 200 and "towers_up" in text
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(e.url.replace("https://", "http://"), timeout=3)


def garbage_pem(tmp_path) -> dict:
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    return {"certfile": str(tmp_path / "bad.pem"), "keyfile": str(tmp_path / "bad.pem")}


@pytest.mark.parametrize("settings, key, says", [
    ({"addr": "local host"}, "metrics.addr", "local host"),
    ({"addr": "192.0.2.1"}, "metrics.addr", "not an address of this host"),
    ({"certfile": "/nonexistent/c.pem", "keyfile": "/nonexistent/k.pem"}, "metrics.certfile",
     "/nonexistent/c.pem"),
    ("garbage_pem", "metrics.certfile", "bad.pem"),
])
def test_bad_settings_name_the_key(tmp_path, settings, key, says):
    if settings == "garbage_pem":
        settings = garbage_pem(tmp_path)
    with pytest.raises(metrics.MetricsError) as err:
        metrics.start(MetricsConfig(port=0, **settings), metrics.Identity("train", 0, "r"), write)
    assert err.value.key == key and str(err.value).startswith(key + ": ")
    assert says in str(err.value)


def test_a_port_in_use_names_metrics_port():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        cfg = MetricsConfig(port=held.getsockname()[1])
        with pytest.raises(metrics.MetricsError, match=r"^metrics\.port: .* in use"):
            metrics.start(cfg, metrics.Identity("train", 0, "r"), write)


def test_gpu_series_come_only_from_gpus_that_exist():
    assert metrics.gpu_collector(SessionConfig()) is None  # this host has no GPU
    memory = {0: {"current": 5, "peak": 9}}
    collector = metrics.GpuCollector(["/gpu:0", "/gpu:1"], memory.get, lambda i: 0.5)
    assert list(collector.collect()) == []  # not before the session has claimed the GPUs
    collector.enable()
    families = {f.name: f for f in collector.collect()}
    assert set(families) == set(metrics.GPU_METRICS)
    memory_devices = [s.labels["device"] for s in families["towers_gpu_memory_bytes"].samples]
    assert memory_devices == ["/gpu:0"]  # no memory info for /gpu:1: absent, not zero
    assert len(families["towers_gpu_utilization_ratio"].samples) == 2


def test_metrics_hook_counts_steps_examples_and_nonfinite_losses(graph):
    step = V1.train.get_or_create_global_step()
    loss = tf.where(tf.equal(step, 2), float("nan"), 1.0 / tf.cast(step + 1, tf.float32))
    with tf.control_dependencies([loss]):  # the loss sees the step before its increment
        train_op = V1.assign_add(step, 1)
    rate, norm = tf.constant(0.1), tf.constant(2.0)
    ops = _Ops(step, loss, {"accuracy": tf.constant(0.75)}, norm)
    with metrics.serve(MetricsConfig(port=0), metrics.Identity("train", 0, "r"), write) as e:
        served = metrics.training_hooks(e, ops, rate, 2, BATCH, SessionConfig())
        assert len(served.hooks) == 1 and len(served.listeners) == 1
        progress = ProgressHook({"loss": loss, **ops.metrics}, step, BATCH, 5, 5, None, write,
                                on_step=served.on_step)
        with V1.train.MonitoredSession(hooks=[*served.hooks, progress]) as sess:
            for _ in range(5):
                sess.run(train_op)
        text = get(e.url)[1]
    assert value(text, "towers_global_step") == 5
    assert value(text, "towers_examples_total") == 5 * BATCH
    assert value(text, "towers_step_seconds_count") == 5
    assert value(text, "towers_nonfinite_loss_total") == 1
    assert value(text, "towers_loss") == pytest.approx(1 / 5)
    assert value(text, "towers_learning_rate") == pytest.approx(0.1)
    assert value(text, "towers_gradient_norm") == 2.0
    assert value(text, "towers_accuracy") == 0.75
    assert value(text, "towers_towers") == 2


def test_step_times_stay_bounded_when_nobody_scrapes(exporter):
    train = metrics.TrainMetrics(exporter, [], 1, BATCH)
    steps = _UNSCRAPED_DURATIONS + 50
    for step in range(1, steps + 1):
        train.record_step(step, 0.001, {"loss": 1.0})
    assert len(train._durations) <= _UNSCRAPED_DURATIONS
    text = get(exporter.url)[1]
    assert value(text, "towers_step_seconds_count") == steps
    assert value(text, "towers_examples_total") == steps * BATCH


@dataclass
class _Ops:
    global_step: tf.Tensor
    loss: tf.Tensor
    metrics: dict
    gradient_norm: tf.Tensor
    loss_scale: tf.Tensor | None = None


def test_no_hooks_when_not_serving(graph):
    ops = _Ops(V1.train.get_or_create_global_step(), tf.constant(1.0), {}, tf.constant(1.0))
    served = metrics.training_hooks(None, ops, tf.constant(0.1), 1, 8, SessionConfig())
    assert served == metrics.TrainingHooks([], [], None)


# ---------------------------------------------------------------------------------------
# A real `towers train`, scraped by this test and by a real Prometheus server.


@dataclass
class TrainingRun:
    """What was seen of one `towers train` process with metrics on a free port."""

    scrapes: list[str] = field(default_factory=list)
    healthz: tuple[int, str] | None = None
    prometheus: list[dict] = field(default_factory=list)  # query results
    result: dict = field(default_factory=dict)
    stderr: str = ""
    checkpoint_dir: str = ""


class Lines:
    """A process's stderr, read by a thread so the pipe never fills."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout} s:\n{''.join(self.lines)[-3000:]}")

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


def start_prometheus(directory, targets_file: str):
    """A real Prometheus on loopback, scraping every 1 s the targets in targets_file."""
    binary = require("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{
            "job_name": "towers",
            "honor_labels": True,  # keep the trainer's job/task labels, as docker/ does
            "file_sd_configs": [{"files": [targets_file], "refresh_interval": "1s"}],
        }],
    }
    config_file = os.path.join(directory, "prometheus.yml")
    with open(config_file, "w") as f:
        yaml.safe_dump(config, f)
    port = free_port()
    log = open(os.path.join(directory, "prometheus.log"), "w")
    process = subprocess.Popen(
        [binary, f"--config.file={config_file}",
         f"--storage.tsdb.path={os.path.join(directory, 'data')}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    return process, f"http://127.0.0.1:{port}", log


def write_targets(path: str, url: str) -> None:
    """file_sd targets, written whole and renamed into place as Prometheus asks."""
    host_port = urllib.parse.urlsplit(url).netloc
    with open(path + ".tmp", "w") as f:
        json.dump([{"targets": [host_port]}], f)
    os.replace(path + ".tmp", path)


def query_until_found(api: str, deadline: float) -> list[dict]:
    """Poll Prometheus's query API for towers_global_step until it has a sample."""
    query = api + "/api/v1/query?" + urllib.parse.urlencode({"query": "towers_global_step"})
    while time.monotonic() < deadline:
        try:
            status, body = get(query, timeout=2)
            if status == 200 and json.loads(body)["data"]["result"]:
                return json.loads(body)["data"]["result"]
        except OSError:
            pass  # not up yet
        time.sleep(0.5)
    return []


def has_trained(scrapes: list[str], steps: int = 50) -> bool:
    """Enough training for the checks: some steps, and a second for examples/sec."""
    last = scrapes[-1] if scrapes else ""
    return ("towers_job_examples_per_second" in last
            and value(last, "towers_global_step") >= steps)


def stop_by_pid(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def training(tmp_path_factory) -> TrainingRun:
    """`towers train` with metrics on a free port, scraped every 50 ms by this test and
    every 1 s by Prometheus, stopped by SIGTERM once Prometheus has its step."""
    require("promtool")
    base = tmp_path_factory.mktemp("metrics")
    run = TrainingRun(checkpoint_dir=str(base / "ckpt"))
    targets = str(base / "targets.json")
    prometheus, api, prometheus_log = start_prometheus(str(base), targets)
    trainer = start_towers(
        "train", *FAST, "--set", "train.steps=100000", "--set", "train.log_every_steps=1000",
        "--set", f"train.checkpoint_dir={run.checkpoint_dir}", "--set", f"run.name={RUN}",
        "--set", "metrics.port=0",
    )
    scraper = None
    try:
        stderr = Lines(trainer.stderr)
        url = stderr.wait_for("metrics on http://", timeout=60).split("metrics on ")[1].strip()
        write_targets(targets, url)
        scraper = Scraper(url)
        run.healthz = get(url.removesuffix("/metrics") + "/healthz")
        run.prometheus = query_until_found(api, time.monotonic() + 60)
        deadline = time.monotonic() + 60
        while not has_trained(scraper.texts) and trainer.poll() is None:
            assert time.monotonic() < deadline, "no training progress within 60 s"
            time.sleep(0.1)
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=120)  # stderr is the Lines thread's to read, not communicate()'s
        out = trainer.stdout.read()
        run.stderr = stderr.text()
        assert trainer.returncode == 0, run.stderr[-3000:]
        run.result = last_json(out)
    finally:
        if scraper is not None:
            scraper.stop()
        stop_by_pid(trainer)
        stop_by_pid(prometheus)
        prometheus_log.close()
    run.scrapes = scraper.texts
    return run


@pytest.mark.e2e
def test_the_step_gauge_only_rises_and_ends_at_the_final_step(training):
    # The first scrapes come while the graph is built, before the training series exist.
    steps = [value(t, "towers_global_step") for t in training.scrapes if "towers_global_step" in t]
    assert len(set(steps)) > 2, "the scrapes saw no progress"
    assert steps == sorted(steps)
    assert steps[-1] == training.result["global_step"] > 0


@pytest.mark.e2e
def test_the_examples_counter_is_steps_times_the_global_batch(training):
    final = training.scrapes[-1]
    assert value(final, "towers_examples_total") == training.result["global_step"] * BATCH
    assert value(final, "towers_step_seconds_count") == training.result["global_step"]
    # where the data stands, as the result says it (the positions the steps took)
    assert value(final, "towers_examples_trained") == training.result["examples_trained"] > 0
    assert value(final, "towers_data_epoch") == pytest.approx(training.result["epoch"])


@pytest.mark.e2e
def test_a_training_scrape_has_every_promised_series(training):
    found = samples(training.scrapes[-1])
    for name in ("towers_global_step", "towers_examples_total", "towers_job_examples_per_second",
                 "towers_process_examples_per_second",
                 "towers_step_seconds_bucket", "towers_loss", "towers_learning_rate",
                 "towers_gradient_norm", "towers_towers", "towers_accuracy",
                 "towers_nonfinite_loss_total", "towers_checkpoint_last_save_timestamp_seconds",
                 "towers_checkpoint_save_seconds_count", "process_resident_memory_bytes",
                 "process_cpu_seconds_total", "towers_up"):
        assert name in found, name
    assert not set(metrics.GPU_METRICS) & set(found), "GPU series on a host without a GPU"
    assert value(training.scrapes[-1], "towers_nonfinite_loss_total") == 0
    assert math.isfinite(value(training.scrapes[-1], "towers_loss"))
    for name, series in found.items():
        for labels, _ in series:
            assert {"job": "train", "task": "0", "run": RUN}.items() <= labels.items(), name


@pytest.mark.e2e
def test_every_series_the_grafana_dashboard_draws_is_one_training_serves(training):
    """A renamed series breaks the dashboard's panel silently: its series must exist."""
    with open(os.path.join(ROOT, "docker", "grafana", "towers-dashboard.json")) as f:
        exprs = [t["expr"] for p in json.load(f)["panels"] for t in p.get("targets", [])]
    drawn = {name for expr in exprs for name in re.findall(r"\b((?:towers|process)_\w+)\{", expr)}
    assert "towers_job_examples_per_second" in drawn
    served = set(samples(training.scrapes[-1]))
    assert drawn - set(metrics.GPU_METRICS) <= served, drawn - served  # GPU hosts only


@pytest.mark.e2e
def test_healthz_answers_200_while_training(training):
    assert training.healthz == (200, "ok\n")


@pytest.mark.e2e
def test_promtool_accepts_a_scrape(training):
    promtool = require("promtool")
    for text in (training.scrapes[0], training.scrapes[-1]):
        checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                                 capture_output=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.e2e
def test_a_prometheus_server_scrapes_the_trainer(training):
    assert training.prometheus, "Prometheus returned no towers_global_step within 60 s"
    (series,) = training.prometheus
    labels = series["metric"]
    assert (labels["job"], labels["task"], labels["run"]) == ("train", "0", RUN)
    assert float(series["value"][1]) >= 0


@pytest.mark.e2e
def test_eval_publishes_its_results(training):
    # `towers eval` in this process (a process of its own adds nothing to what it serves),
    # scraped from a thread from before its server is up.
    port = unclaimable_ports()
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics")
    try:
        evaluated = run_in_process(
            "eval", *FAST, "--set", f"train.checkpoint_dir={training.checkpoint_dir}",
            "--set", f"run.name={RUN}", "--set", f"metrics.port={port}",
        )
    finally:
        scraper.stop()
    result = ok(evaluated)
    assert scraper.texts, "nothing was scraped from the evaluator"
    final = scraper.texts[-1]
    assert value(final, "towers_eval_global_step") == result["global_step"]
    assert value(final, "towers_eval_loss") == pytest.approx(result["loss"])
    assert value(final, "towers_eval_accuracy") == pytest.approx(result["accuracy"])
    assert "towers_eval_examples_per_second" in samples(final)
    for labels, _ in samples(final)["towers_eval_loss"]:
        assert (labels["job"], labels["task"], labels["run"]) == ("eval", "0", RUN)


# ---------------------------------------------------------------------------------------
# docker/: the Prometheus config and the Grafana dashboard.

DOCKER = os.path.join(ROOT, "docker")


@pytest.mark.e2e
def test_the_docker_prometheus_config_passes_promtool():
    promtool = require("promtool")
    config = os.path.join(DOCKER, "prometheus.yml")
    checked = subprocess.run([promtool, "check", "config", config], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with open(config) as f:
        jobs = yaml.safe_load(f)["scrape_configs"]
    assert all(job.get("honor_labels") for job in jobs), "the trainers' job labels would be lost"
    assert any(job.get("file_sd_configs") for job in jobs)


def dashboard_queries() -> list[str]:
    with open(os.path.join(DOCKER, "grafana", "towers-dashboard.json")) as f:
        dashboard = json.load(f)
    return [target["expr"] for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


@pytest.mark.e2e
def test_the_dashboard_only_uses_series_a_training_run_exports(training):
    import re

    queries = dashboard_queries()
    assert len(queries) >= 6
    used = {name for q in queries for name in re.findall(r"\b(?:towers|process)_\w+", q)}
    exported = {name for text in training.scrapes for name in samples(text)}
    missing = used - exported - set(metrics.GPU_METRICS)
    assert not missing, f"the dashboard queries series no training run exports: {missing}"
    assert used & set(metrics.GPU_METRICS), "no GPU memory panel"
