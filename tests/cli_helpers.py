"""Running the real `towers` command in a subprocess, as a user would."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small, fast settings for the built-in convnet job; tests add their own on top.
FAST = [
    "--set", "train.batch_size=32",
    "--set", "train.log_every_steps=10",
    "--set", "data.num_examples=512",
    "--set", "model.filters=[4,8]",
    "--set", "model.dense_units=16",
    "--set", "eval.steps=2",
    "--set", "eval.batch_size=32",
]


def towers_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "launch", *args]


def environment() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_towers(*args: str, cwd=None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        towers_command(*args), cwd=cwd, env=environment(), capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )


def start_towers(*args: str, cwd=None) -> subprocess.Popen:
    return subprocess.Popen(
        towers_command(*args), cwd=cwd, env=environment(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )


def last_json(stdout: str) -> dict:
    """The command's result: one JSON object on the last line of stdout."""
    lines = stdout.strip().splitlines()
    assert lines, "no output on stdout"
    return json.loads(lines[-1])


def ok(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    return last_json(result.stdout)
