"""Multi-process rows: whole `towers` runs (ps_worker, collective, horovod), one per timed block.

A run is `towers local-cluster` (1 ps + N workers, or N workers without ps tasks, on
127.0.0.1) or `horovodrun`
with N ranks of `towers train`; its rate comes from the processes' JSON results
and its peak RSS is the sum of the peaks of the processes holding the model.
The processes that load TensorFlow are `towers` commands, which import it
quietly; their output is captured here, and only a failed run's reason is shown.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from launch.bench.settings import FLOAT32, RUN_TIMEOUT_SECS, Row, Settings, Variant


def towers_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "launch", *args]


def run_settings(settings: Settings, checkpoint_dir: str,
                 variant: Variant = FLOAT32) -> tuple[list[str], int]:
    """--set flags for one whole run computing as `variant` says, and the steps per run.

    The run is `steps` timed steps after at least `warmup`, logged every `steps`,
    so the final progress window (the examples/sec in the JSON result) is
    exactly the last `steps` steps.
    """
    total = settings.steps * (1 + math.ceil(settings.warmup / settings.steps))
    values = {
        "model": {"name": settings.model, **settings.params,
                  **({"path": settings.model_path} if settings.model_path else {})},
        "data.source": "synthetic",
        "train.batch_size": settings.batch,
        "train.steps": total,
        "train.log_every_steps": settings.steps,
        "train.summary_every_steps": 10**9,
        "train.checkpoint_every_steps": 10**9,
        "train.checkpoint_dir": checkpoint_dir,
        "optimizer.name": "momentum",
        "optimizer.learning_rate": 0.01,
        "optimizer.momentum": 0.9,
        "towers.devices": 1,
        **variant.job_values(),
    }
    flags = [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    return [*settings.job_args, *flags], total


def horovod_missing() -> str | None:
    """Why the horovod row cannot run here, or None if it can."""
    if shutil.which("horovodrun") is None:
        return "horovodrun is not on PATH (install Horovod: make horovod)"
    probe = subprocess.run(
        [sys.executable, "-c", "import horovod.tensorflow"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"import horovod.tensorflow failed: {last}"
    return None


def cluster_command(mode: str, devices: int, args: list[str]) -> list[str]:
    if mode == "ps_worker":
        return towers_command("local-cluster", "--ps", "1", "--workers", str(devices),
                              *args, "--set", "train.sync=true")
    if mode == "collective":
        return towers_command("local-cluster", "--ps", "0", "--workers", str(devices), *args)
    return ["horovodrun", "-np", str(devices), "-H", f"localhost:{devices}", "--gloo",
            *towers_command("train", *args), "--backend", "horovod"]


# horovodrun prefixes each rank's lines: `[0]<stdout>:` with Gloo, `[1,0]<stdout>:` with MPI.
_HOROVOD_PREFIX = re.compile(r"^\[(?:\d+,)?(\d+)\]<stdout>:(.*)$")


def cluster_rate(mode: str, stdout: str, stderr: str) -> float:
    """Examples/sec of a whole multi-process run: the job's, as its chief (worker 0,
    relayed by local-cluster on stderr as `[worker0] {...}`) or Horovod's rank 0 reports
    it in its JSON result (`job_examples_per_sec`, every worker's or rank's examples).
    """
    if mode in ("ps_worker", "collective"):
        results = []
        for line in stderr.splitlines():
            match = re.match(r"^\[worker0\] (\{.*\})\s*$", line)
            if match:
                results.append(json.loads(match.group(1))["job_examples_per_sec"])
        if not results:
            raise RuntimeError("the chief reported no result")
        return results[-1]
    results = []
    for line in stdout.splitlines():
        match = _HOROVOD_PREFIX.match(line)
        rank, text = (match.group(1), match.group(2)) if match else ("0", line)
        if rank == "0" and text.strip().startswith("{"):
            results.append(json.loads(text)["job_examples_per_sec"])
    if not results:
        raise RuntimeError("rank 0 reported no result")
    return results[-1]


def _is_trainer(process) -> bool:
    """A process holding the model: a ps, worker or train task (not a launcher)."""
    try:
        command = process.cmdline()
    except Exception:  # gone, or not ours to read
        return False
    if "launch" not in command:
        return False
    role = command[command.index("launch") + 1 : command.index("launch") + 2]
    return role in (["ps"], ["worker"], ["train"])


def peak_rss_of(pid: int) -> int:
    """A process's peak resident set (VmHWM) in bytes; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_sampled(command: list[str], timeout: float) -> tuple[int, str, str, int]:
    """Run a command to the end; returns (status, stdout, stderr, summed peak RSS).

    Every half second the command's descendants that hold the model are found and
    their peaks read, so the sum counts each trainer process's own peak.
    """
    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   text=True, start_new_session=True)
        peaks: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not finish within {timeout:g} s")
                try:
                    tree = psutil.Process(process.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    tree = []
                for child in filter(_is_trainer, tree):
                    peaks[child.pid] = max(peaks.get(child.pid, 0), peak_rss_of(child.pid))
                time.sleep(0.5)
        finally:
            stop_group(process)
        out.seek(0)
        err.seek(0)
        return process.returncode, out.read(), err.read(), sum(peaks.values())


def stop_group(process: subprocess.Popen) -> None:
    """End a run's whole process group if it is still there: TERM, then KILL."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # stragglers that left the launcher
    except ProcessLookupError:
        pass
    process.wait()


class ClusterCase:
    """One multi-process row: each block is a whole run in a fresh directory."""

    def __init__(self, settings: Settings, row: Row):
        self.settings = settings
        self.row = row

    def time_block(self) -> float:
        with tempfile.TemporaryDirectory(prefix="towers-bench-") as checkpoint_dir:
            args, _ = run_settings(self.settings, checkpoint_dir, self.row.variant)
            command = cluster_command(self.row.mode, self.row.devices, args)
            status, stdout, stderr, rss = run_sampled(command, RUN_TIMEOUT_SECS)
        if status:
            raise RunFailed(f"exit status {status}: {failure_reason(stdout + stderr)}")
        self.row.peak_rss_bytes = max(self.row.peak_rss_bytes or 0, rss)
        return cluster_rate(self.row.mode, stdout, stderr)


def failure_reason(output: str) -> str:
    """The line of a failed run's output that says why: a `towers: error:` line if any."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "towers: error:" in line]
    return (errors or lines or ["no output"])[-1]


class RunFailed(RuntimeError):
    """A multi-process row's run failed; the row is reported as failed, the rest go on."""
