"""Stop requests reach a training process even while its main thread waits inside
TensorFlow: real signals sent to this process, real sessions blocked on a queue."""

import os
import signal
import threading
import time

import pytest
import tensorflow as tf
from helpers.commands import FAST, Process, environment, last_json, wait_until

from launch.runtime.hooks import StopOnSignalHook
from launch.runtime.signals import StopSignals

V1 = tf.compat.v1


def sigterm_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_other_threads_hear_a_signal_while_the_main_thread_waits_in_tensorflow(graph):
    queue = tf.queue.FIFOQueue(1, [tf.int32], shapes=[[]])
    with StopSignals(notify_threads=True) as stop, V1.Session() as sess:
        free = queue.enqueue(7)
        # The listener frees the main thread's step once it has heard the signal:
        # the step returns its value only if the signal was heard while it waited.
        listener = threading.Thread(target=lambda: stop.arrived.wait(120) and sess.run(free))
        listener.start()
        timer = sigterm_in(0.3)
        try:
            # Blocks in C++: Python's own handler cannot run until it returns.
            got = sess.run(queue.dequeue(), options=V1.RunOptions(timeout_in_ms=120_000))
        finally:
            timer.cancel()
            listener.join(timeout=120)
    assert stop.received == "SIGTERM" and got == 7


def test_a_stop_frees_a_step_blocked_on_peers_with_the_roles_unblock_op(graph):
    # The step waits on a queue nobody fills, as a synchronous worker waits for the
    # token of an update its stopped peers will never complete.
    queue = tf.queue.FIFOQueue(10, [tf.int32], shapes=[[]])
    step = queue.dequeue()
    stop = StopSignals(notify_threads=True)
    hook = StopOnSignalHook(stop, unblock=queue.enqueue(1))
    steps = 0
    started = time.monotonic()
    with stop, V1.train.MonitoredSession(hooks=[hook]) as sess:
        timer = sigterm_in(0.3)
        try:
            while not sess.should_stop():
                sess.run(step)
                steps += 1
        finally:
            timer.cancel()
    took = time.monotonic() - started
    assert stop.received == "SIGTERM" and steps == 1
    # The promise: a step is freed only once it has been blocked for BLOCKED_SECS.
    assert took > StopOnSignalHook.BLOCKED_SECS, took


def test_a_step_counts_as_blocked_only_past_three_times_the_recent_longest():
    # A slow step (a loaded host, a large model) is not one blocked on stopped peers:
    # freeing it would hand its worker a token it did not earn.
    now = [0.0]
    hook = StopOnSignalHook(StopSignals(), clock=lambda: now[0])
    hook.after_create_session(None, None)
    for seconds in (30.0, 0.5, 4.0, 1.0):  # the first waits for the peers: not counted
        hook.before_run(None)
        now[0] += seconds
        hook.after_run(type("Context", (), {"request_stop": lambda self: None})(), None)
    assert hook.blocked_after() == 12.0
    assert StopOnSignalHook(StopSignals()).blocked_after() == StopOnSignalHook.BLOCKED_SECS


def test_without_a_stop_a_blocked_step_is_left_alone(graph):
    queue = tf.queue.FIFOQueue(10, [tf.int32], shapes=[[]])
    step = queue.dequeue()
    stop = StopSignals(notify_threads=True)
    hook = StopOnSignalHook(stop, unblock=queue.enqueue(1))
    with stop, V1.train.MonitoredSession(hooks=[hook]) as sess:
        try:
            sess.run(step, options=V1.RunOptions(timeout_in_ms=3000))
            blocked = False
        except tf.errors.DeadlineExceededError:
            blocked = True
    assert blocked


def test_a_process_done_with_its_work_outlives_a_late_stop_request(monkeypatch):
    # A ps that has served its last worker is only shutting down when local-cluster's
    # forwarded SIGTERM arrives; the default action would report it killed (-SIGTERM).
    # The command's own StopSignals, left after that, must not bring the default back.
    from launch.runtime import signals as signals_module
    from launch.runtime.signals import STOP_SIGNALS, StopSignals, ignore_from_now

    monkeypatch.setattr(signals_module, "_ignoring", False)  # put back for later tests
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        with StopSignals():
            ignore_from_now()
        os.kill(os.getpid(), signal.SIGTERM)  # with the default action, pytest would die
        os.kill(os.getpid(), signal.SIGINT)
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in STOP_SIGNALS)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_once_the_training_session_has_ended_a_stop_signal_meets_a_finished_job(tmp_path):
    # After the session a worker still reports to its peers (Role.finish: TensorFlow
    # calls, bounded): the command's own handler raised into them ("received SIGTERM
    # before training started"; inside a TensorFlow call, exit 1 and a traceback, found
    # by the soak, async seed 0). The work is done from the session's end on.
    from launch.config import load_job
    from launch.runtime import signals as signals_module
    from launch.runtime.role import Role
    from launch.runtime.train import train

    done_when_finishing = []

    class Recording(Role):
        def finish(self, result: dict) -> dict:
            done_when_finishing.append(signals_module.is_work_done())
            return result

    signals_module.work_done(False)
    job = load_job(None, ["train.steps=1", "train.batch_size=4", "model.name=mlp",
                          "model.hidden_units=[4]", "model.input_dim=4", "model.num_classes=2",
                          "data.source=synthetic", f"train.checkpoint_dir={tmp_path / 'ckpt'}"])
    try:
        train(job, role=Recording(), write=lambda line: None)
    finally:
        signals_module.work_done(False)
    assert done_when_finishing == [True]


# A user's model module whose import meets SIGTERM inside a library's handler of errors,
# as TensorFlow's own import does (inspect.getfullargspec: `except Exception as ex: raise
# TypeError('unsupported callable') from ex`).
MEETS_SIGTERM_WHILE_IMPORTED = '''
import os, signal

def _library_call():
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        return None
    except Exception as err:
        raise TypeError("unsupported callable") from err

_library_call()

def model_fn(features, labels, ctx):
    raise AssertionError("never built: the stop came first")
'''


def test_a_stop_signal_while_the_job_loads_ends_it_cleanly_whatever_code_it_meets(tmp_path):
    """The soak (sync and async seed 401): SIGTERM arrived while a task imported
    TensorFlow; the stop raised inside a library's `except Exception`, which made it a
    TypeError: exit 1 and a traceback, for a stop the command should end on with 0."""
    from helpers.commands import run_in_process

    (tmp_path / "meets_sigterm.py").write_text(MEETS_SIGTERM_WHILE_IMPORTED)
    done = run_in_process("train", "--set", "model.name=meets_sigterm:model_fn",
                          "--set", f"model.path={tmp_path}",
                          "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "received SIGTERM before training started; stopping" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "ckpt").exists()


# A user's model module whose import meets SIGTERM inside a weakref callback, where
# Python drops whatever is raised (as importlib's own module-lock callbacks do: the
# soak, async seed 406).
MEETS_SIGTERM_IN_A_CALLBACK = '''
import os, signal, weakref

import models
import models.mlp

class _Thing:
    pass

def _callback(ref):
    os.kill(os.getpid(), signal.SIGTERM)

_thing = _Thing()
_ref = weakref.ref(_thing, _callback)
del _thing  # the callback runs here, and the stop's handler inside it

def build(*, input_dim, hidden_units, num_classes):
    return models.mlp.build_model_fn(models.mlp.Params(input_dim, tuple(hidden_units),
                                                       num_classes))

build.input_spec = models.build("mlp", {"input_dim": 4, "num_classes": 2}).input_spec
'''


def test_a_stop_whose_action_python_dropped_is_taken_over_by_the_next_block(tmp_path):
    """The soak (async seed 406): SIGTERM reached a ps while it imported, inside a
    callback whose exception Python drops ("Exception ignored in", a traceback); the ps
    then served on until killed. The stop now carries into the work's own handling."""
    from helpers.commands import last_json, run_in_process

    (tmp_path / "in_a_callback.py").write_text(MEETS_SIGTERM_IN_A_CALLBACK)
    done = run_in_process("train", "--set", "model.name=in_a_callback:build",
                          "--set", f"model.path={tmp_path}", "--set", "model.input_dim=4",
                          "--set", "model.hidden_units=[4]", "--set", "model.num_classes=2",
                          "--set", "data.source=synthetic", "--set", "train.batch_size=4",
                          "--set", "train.steps=200",
                          "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert "received SIGTERM" in done.stderr
    assert last_json(done.stdout)["global_step"] < 200  # stopped, not trained to the end


def test_a_stop_raised_while_tensorflow_makes_an_error_is_still_the_stop(graph, monkeypatch):
    """The soak (sync seed 505): SIGTERM reached a worker as TensorFlow's C++ made the
    error of a timed-out read, inside the error's __init__; pybind11 reported the stop
    that replaced it as a RuntimeError: exit 1 and a traceback."""
    from tensorflow.python.framework import errors_impl

    from launch.runtime import signals as signals_module
    from launch.runtime.before_start import StoppedBeforeStart, stops_before_start

    monkeypatch.setattr(signals_module, "_done", False)  # as a command begins
    made = errors_impl.InvalidArgumentError.__init__

    def meets_sigterm(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        made(self, *args, **kwargs)

    monkeypatch.setattr(errors_impl.InvalidArgumentError, "__init__", meets_sigterm)
    value = V1.placeholder(tf.float32, [])
    checked = tf.debugging.check_numerics(value, "not a number")
    with pytest.raises(StoppedBeforeStart, match="SIGTERM"):
        with stops_before_start(), V1.Session() as sess:
            sess.run(checked, {value: float("nan")})


def test_a_block_opened_inside_one_that_received_a_stop_begins_stopped(monkeypatch):
    from launch.runtime import signals as signals_module

    monkeypatch.setattr(signals_module, "_done", False)  # as a command begins
    with StopSignals(hand_over=True) as outer:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: outer.received, "the outer block to hear the signal")
        with StopSignals() as inner:
            assert inner.received == "SIGTERM" and inner.arrived.is_set()
        with StopSignals() as second:  # taken over once: a block for a second signal
            assert second.received is None
    with StopSignals() as later:  # the command that received it has ended
        assert later.received is None


def test_a_second_sigterm_leaves_the_stop_under_way_and_a_second_ctrl_c_stops_now():
    """Soak collective seed 423: the schedule's SIGTERM, then the restart's SIGTERM to
    every task 0.1 s later; the second raised KeyboardInterrupt into the stopping
    worker's step: a traceback and death by SIGINT instead of its checkpoint and exit 0.
    Orchestrators send SIGTERM more than once; only a user's second Ctrl-C means now."""
    with StopSignals(escalate=True) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: stop.received, "the first signal")
        os.kill(os.getpid(), signal.SIGTERM)  # raised KeyboardInterrupt here before
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            wait_until(lambda: False, "the second Ctrl-C", timeout=30)
    assert stop.received == "SIGTERM"


# A towers process whose interpreter takes its time to shut down (as one with
# TensorFlow's threads may): it says when it begins, and ends once told to.
SLOW_EXIT = '''
import atexit, os, pathlib, time

def _slow_exit():
    pathlib.Path(os.environ["EXITING_FILE"]).write_text("exiting")
    while not pathlib.Path(os.environ["GO_FILE"]).exists():
        time.sleep(0.05)

atexit.register(_slow_exit)
'''


@pytest.mark.e2e
def test_a_stop_signal_meeting_a_finished_job_as_it_exits_leaves_it_exiting_0(tmp_path):
    """A job ended by its data has printed its result; the SIGTERM meant for it arrives
    as the process shuts down. It exits 0, not 143, which an orchestrator would take for a
    failure and restart."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_EXIT)
    exiting, go = tmp_path / "exiting", tmp_path / "go"
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{environment()['PYTHONPATH']}",
           "EXITING_FILE": str(exiting), "GO_FILE": str(go)}
    job = Process(tmp_path, "train", "train", *FAST, "--set", "train.steps=2",
                  "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}", env=env)
    try:
        wait_until(exiting.exists, "the process to finish its work", timeout=180)
        assert last_json(job.stdout)["global_step"] == 2  # its result is out
        # SIGTERM's default action ends a process as the signal is sent: once sent, the
        # process may go on only if it does not take it.
        job.proc.send_signal(signal.SIGTERM)
        go.write_text("go")
        assert job.wait(timeout=60) == 0, job.stderr[-2000:]
    finally:
        go.write_text("go")
        job.stop()
