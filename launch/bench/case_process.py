"""One in-process row in its own subprocess, timing blocks of steps when the parent asks.

Each row gets a fresh process (a fresh TensorFlow: graph mode for the towers,
eager for the mirrored row, and a peak RSS of its own), builds its graph once,
runs the warm-up, then answers requests over a pipe:

    parent                      serve_case
                          <-    facts (or {"error": traceback})
    ("time", steps)       ->
                          <-    seconds for `steps` steps
    ("rss",)              ->
                          <-    peak RSS bytes so far
    ("cpu",)              ->
                          <-    CPU seconds (user + system) this process has used
    ("profile", steps, dir) ->
                          <-    {"trace": path} of a profiler trace of `steps` steps
                                written under dir, or {"error": why not}
    ("stop",)             ->    returns
"""

from __future__ import annotations

import multiprocessing.connection
import os
import resource
import sys
import time
import traceback

from launch.bench.cases import BuiltCase, build_towers_case
from launch.bench.input_case import build_input_case
from launch.bench.job_case import build_job_case
from launch.bench.mirrored import build_mirrored_case
from launch.bench.settings import FLOAT32, RUN_TIMEOUT_SECS, Settings, Variant
from launch.config import ModelConfig
from launch.log import quiet_tensorflow, use_graph_mode


def case_spec(settings: Settings, mode: str, devices: int,
              variant: Variant = FLOAT32) -> dict:
    """What a case process needs to build one row (plain values: it crosses a pipe)."""
    return {"model": settings.model, "params": settings.params, "batch": settings.batch,
            "mode": mode, "devices": devices, "warmup": settings.warmup,
            "model_path": settings.model_path, "job_dir": settings.job_dir,
            "variant": tuple(variant)}


def build_case(spec: dict) -> BuiltCase:
    """The row `spec` describes, built in this process, which has not imported
    TensorFlow yet; imported as every `towers` command imports it, so its start-up
    notices stay out of the bench's output. Every row but mirrored builds graphs; the
    mirrored row is TF2 code, and stays in the eager mode TensorFlow starts in."""
    quiet_tensorflow()
    if spec["mode"] != "mirrored":
        use_graph_mode()
    if spec.get("input"):
        return build_input_case(spec)
    if "overrides" in spec:
        return build_job_case(spec)
    from launch import modelref

    model = modelref.resolve(ModelConfig(spec["model"], spec["params"], spec["model_path"],
                                         spec["job_dir"]))
    variant = Variant(*spec["variant"])
    if spec["mode"] == "mirrored":
        return build_mirrored_case(model, spec["batch"], spec["devices"], variant.precision)
    return build_towers_case(model, spec["batch"], spec["mode"], spec["devices"], variant)


def serve_case(spec: dict, conn) -> None:
    """In a subprocess: build one in-process row, then answer requests until "stop".

    Requests: ("time", steps) -> seconds for `steps` steps; ("rss",) -> peak RSS
    bytes of this process so far. The first message sent is the graph facts,
    or {"error": traceback} if the build failed.
    """
    try:
        case = build_case(spec)
        case.run(spec["warmup"])
    except Exception:  # reported to the parent, which names the row that failed
        conn.send({"error": traceback.format_exc()})
        return
    conn.send(case.facts)
    while True:
        request = conn.recv()
        if request[0] == "time":
            start = time.perf_counter()
            case.run(request[1])
            conn.send(time.perf_counter() - start)
        elif request[0] == "rss":
            conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        elif request[0] == "cpu":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            conn.send(usage.ru_utime + usage.ru_stime)
        elif request[0] == "profile":
            conn.send(profile_case(case, request[1], request[2]))
        else:
            return


def case_process_main(spec: dict, conn) -> None:
    """A case process's life: serve_case, then exit at once. Every answer has been sent
    by then and nothing is left to save, while the interpreter's usual exit tears down
    every TensorFlow module first: CPU time each row's end waited for."""
    serve_case(spec, conn)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def profile_case(case: BuiltCase, steps: int, logdir: str) -> dict:
    """{"trace": path} of a profiler trace of `steps` steps of the case, written under
    logdir where TensorBoard's profile plugin finds it, or {"error": why not}."""
    from launch.runtime.profile import profiling, trace_files

    try:
        with profiling(logdir):
            case.run(steps)
    except RuntimeError as err:
        return {"error": str(err)}
    files = trace_files(logdir)
    return {"trace": files[-1]} if files else {"error": "the profiler wrote no trace"}


class NoAnswer(RuntimeError):
    """A row's process did not answer within its time, or ended without answering."""


class CaseProcess:
    """The parent's handle on one serve_case subprocess; each request is answered
    within `timeout` seconds or raises NoAnswer."""

    def __init__(self, spec: dict, timeout: float = RUN_TIMEOUT_SECS):
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fresh TensorFlow per row
        self.conn, child = context.Pipe()
        self.process = context.Process(target=case_process_main, args=(spec, child), daemon=True)
        self.process.start()
        child.close()
        self.spec = spec
        self.timeout = timeout
        self.facts: dict = {}

    def ready(self) -> dict:
        self.facts = self._receive(self.timeout)
        if "error" in self.facts:
            raise RuntimeError(f"{self.spec['mode']} on {self.spec['devices']} device(s) "
                               f"failed to build:\n{self.facts['error']}")
        return self.facts

    def time_block(self, steps: int) -> float:
        self.conn.send(("time", steps))
        return self._receive(self.timeout)

    def peak_rss(self) -> int:
        self.conn.send(("rss",))
        return self._receive(60)

    def cpu_seconds(self) -> float:
        """CPU time the row's process has used (its every thread), so far."""
        self.conn.send(("cpu",))
        return self._receive(60)

    def profile(self, steps: int, logdir: str) -> dict:
        """profile_case's answer, from the row's process."""
        self.conn.send(("profile", steps, logdir))
        return self._receive(self.timeout)

    def _receive(self, timeout: float):
        if not self.conn.poll(timeout):
            raise NoAnswer(f"did not answer within {timeout:g} s (--timeout)")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise NoAnswer(f"its process ended without answering (exit status "
                           f"{self.process.exitcode})") from None

    def stop(self) -> None:
        """Ask the process to end, without waiting: stopping every row before joining
        any lets their TensorFlow shutdowns overlap."""
        try:
            self.conn.send(("stop",))
        except OSError:  # already gone, or already asked
            pass

    def kill(self) -> None:
        """End the process now: it did not answer, so it would not read a stop."""
        self.process.kill()
        self.process.join()

    def close(self) -> None:
        self.stop()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def start_in_turns(specs: dict[int, dict], timeout: float,
                   at_once: int) -> tuple[dict[int, CaseProcess], dict[int, str]]:
    """A case process for each spec, at most `at_once` building at a time (a build
    imports TensorFlow and builds a graph: many at once on a few cores miss every
    deadline); returns ({index: ready CaseProcess}, {index: why it is not ready}: the
    build's last error line, or that it did not answer within `timeout`)."""
    waiting = list(specs.items())
    building: dict[int, tuple[CaseProcess, float]] = {}
    ready: dict[int, CaseProcess] = {}
    failed: dict[int, str] = {}
    while waiting or building:
        while waiting and len(building) < at_once:
            i, spec = waiting.pop(0)
            building[i] = (CaseProcess(spec, timeout), time.monotonic() + timeout)
        first_deadline = min(deadline for _, deadline in building.values())
        answered = multiprocessing.connection.wait(
            [case.conn for case, _ in building.values()],
            max(0.0, first_deadline - time.monotonic()))
        for i, (case, deadline) in list(building.items()):
            if case.conn in answered:
                try:
                    case.ready()
                    ready[i] = case
                except RuntimeError as err:
                    failed[i] = str(err).strip().splitlines()[-1]
            elif time.monotonic() >= deadline:
                failed[i] = f"did not answer within {timeout:g} s (--timeout)"
            else:
                continue
            del building[i]
            if i in failed:
                case.kill()
    return ready, failed
