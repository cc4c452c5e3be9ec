"""Running the real `towers` command in a subprocess, as a user would, or in this process."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time

from launch.distributed.ports import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# This folder: as model.path, it makes its models (paced_model, counting_model, ...) a
# job's models of its own.
HELPERS = os.path.dirname(os.path.abspath(__file__))

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


def paced_mlp(delay_secs: float) -> list[str]:
    """Settings that make a job's mlp (its hidden_units set by the job) the paced one of
    tests/helpers/paced_model.py: the same variables and values, every step also sleeping
    `delay_secs`. For jobs that train on while a test waits for something else (a task
    started again importing TensorFlow, a deadline running out): steps nothing checks
    would otherwise take the CPU the suite's other tests need."""
    return ["--set", "model.name=paced_model:build",
            "--set", f"model.path={HELPERS}",
            "--set", f"model.delay_secs={delay_secs}", "--set", "model.input_dim=784",
            "--set", "model.num_classes=10"]


def towers_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "launch", *args]


def overrides(args: list[str]) -> list[str]:
    """The ``a.b=c`` strings of a command line's ``--set`` options."""
    return [value for flag, value in zip(args, args[1:], strict=False) if flag == "--set"]


def run_in_process(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    """`towers ARGS` through the command's own main() in this process, for the many cases
    that end before any work starts (bad input): each costs milliseconds, not the seconds
    of a new process importing TensorFlow. What a process adds (TensorFlow's own notices
    on stderr) is checked by the subprocess tests.

    The working directory, sys.path and modules imported from a user's model file are
    restored afterwards, so each case resolves its own files as a fresh process would.
    """
    from launch.cli import main

    out, err = io.StringIO(), io.StringIO()
    path, here = list(sys.path), os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's own errors
                code = exit_.code
    finally:
        os.chdir(here)
        added = tuple(os.path.join(d, "") for d in set(sys.path) - set(path) if d)
        sys.path[:] = path
        for name, module in list(sys.modules.items()):
            if added and (getattr(module, "__file__", None) or "").startswith(added):
                del sys.modules[name]  # the user's model code of this case
    return subprocess.CompletedProcess(["towers", *args], code, out.getvalue(), err.getvalue())


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


def run_python(code: str, timeout: float = 120,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh Python process with the tests' environment (and `env`): what a
    process imports or decides from its start, which a test's own process (TensorFlow
    loaded) cannot show."""
    return subprocess.run(
        [sys.executable, "-c", code], env={**environment(), **(env or {})},
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
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


class Process:
    """A towers command with its output in files, stopped by pid when the test ends."""

    def __init__(self, tmp_path, name, *args, env=None, prefix=(), command=None):
        """env: variables to set on top of the test environment (TF_CONFIG, say).
        prefix: a command that runs it, e.g. `ip netns exec HOST` (which execs, so the
        pid is still the towers process's). command: run this instead of towers."""
        self.err_path = tmp_path / f"{name}.err"
        self._out = open(tmp_path / f"{name}.out", "w")
        self._err = open(self.err_path, "w")
        self.proc = subprocess.Popen([*prefix, *(command or towers_command(*args))],
                                     env={**environment(), **(env or {})},
                                     stdout=self._out, stderr=self._err,
                                     stdin=subprocess.DEVNULL)

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    @property
    def stdout(self) -> str:
        return (self.err_path.parent / self.err_path.name.replace(".err", ".out")).read_text()

    def wait_for(self, pattern, timeout=120, start=0):
        """The first match of `pattern` in the process's stderr from character `start` on
        (what it wrote after an event: `start=len(process.stderr)` then), waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.stderr[start:])
            if found:
                return found
            assert self.proc.poll() is None, f"exited {self.proc.returncode}\n{self.stderr[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {pattern!r}\n{self.stderr[-3000:]}")

    def wait(self, timeout=120) -> int:
        """The exit status; a process still running after `timeout` s fails the test
        with what it wrote (a hang is read from its own output)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s\n"
                                 f"{self.stderr[-6000:]}") from None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self._err.close()


class Cluster:
    """`ps` ps tasks and `workers` workers (0 is chief) on loopback ports, each a Process.

    args: the job's settings; the checkpoint directory (ckpt, or tmp_path/ckpt) and the
    hosts are added.
    """

    def __init__(self, tmp_path, args, workers=1, ps=1, ckpt=None):
        self.tmp_path = tmp_path
        ports = [f"127.0.0.1:{p}" for p in free_ports(ps + workers)]
        self.ps, self.workers = ports[:ps], ports[ps:]
        self.ckpt = ckpt or tmp_path / "ckpt"
        self.args = [*args, "--set", f"train.checkpoint_dir={self.ckpt}",
                     "--ps-hosts", ",".join(self.ps), "--worker-hosts", ",".join(self.workers)]
        self.tasks: dict[str, Process] = {}
        self.killed: set[str] = set()

    def start(self, name, role, index, prefix=()) -> Process:
        """prefix: as Process's (`nice -n 5`, say)."""
        self.tasks[name] = Process(self.tmp_path, name, role, *self.args,
                                   "--task-index", str(index), prefix=prefix)
        return self.tasks[name]

    def kill(self, name):
        self.tasks[name].proc.kill()
        self.tasks[name].proc.wait()
        self.killed.add(name)

    def finish(self, timeout=180):
        """Every task not killed ends with status 0."""
        for name, task in self.tasks.items():
            if name not in self.killed:
                assert task.wait(timeout=timeout) == 0, (name, task.stderr[-3000:])

    def stop(self):
        for task in self.tasks.values():
            task.stop()


# --- what the logs and the checkpoints say ----------------------------------------------

def saved_steps(stderr: str) -> list[int]:
    return [int(s) for s in re.findall(r"saved checkpoint at step (\d+)", stderr)]


def logged_steps(stderr: str) -> list[int]:
    """The global steps of a trainer's progress lines, in order."""
    return [int(s) for s in re.findall(r"towers: step (\d+)/", stderr)]


def last_logged(stderr: str) -> int:
    steps = logged_steps(stderr)
    return steps[-1] if steps else -1


def wait_until(condition, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
