"""A process ended by launch.hard_exit, from a thread while its main thread is
blocked (as a worker's is inside TensorFlow's retries): nothing it wrote is lost."""

import subprocess
import sys
import textwrap

import pytest
from helpers.commands import environment

from launch.errors import EXIT_PEER_UNAVAILABLE

pytestmark = pytest.mark.e2e  # starts a process

ENDED_FROM_A_THREAD = textwrap.dedent('''
    import sys, threading
    from launch import hard_exit
    from launch.errors import PeerUnavailable
    from launch.log import log

    sys.stdout.write('{"global_step": 7}')  # buffered: a pipe, no newline, no flush
    log("the last progress line")
    error = PeerUnavailable("cluster: ps 0 at 10.0.0.1:2222 has not answered for 5 s")
    threading.Thread(target=hard_exit.exit_now, args=(error,), daemon=True).start()
    try:
        threading.Event().wait()  # blocked for good, as in a C++ call
    finally:
        print("a finally block ran", file=sys.stderr)
''')


def test_a_hard_exit_from_a_thread_keeps_stdout_the_last_log_line_and_the_error_line():
    env = environment()
    env.pop("PYTHONUNBUFFERED", None)  # stdout buffered, as in production
    ended = subprocess.run([sys.executable, "-c", ENDED_FROM_A_THREAD], env=env,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ended.returncode == EXIT_PEER_UNAVAILABLE, ended.stderr
    assert ended.stdout == '{"global_step": 7}'
    assert ended.stderr.splitlines()[-2:] == [
        "towers: the last progress line",
        "towers: error: cluster: ps 0 at 10.0.0.1:2222 has not answered for 5 s",
    ]
    assert "a finally block ran" not in ended.stderr  # a hard exit, as documented
