"""Stragglers: a process whose own time per step stays a clear margin above the others'
for a window of steps is named, once, with whether it waits on input or on compute, and
exported; one rule for ps/worker workers and Horovod ranks. The Horovod ranks' reports
go through horovodrun's own rendezvous server, run here in this process."""

import socket
import threading
import time

import numpy as np
import pytest
from helpers.scrapes import families

from launch import metrics
from launch.config import MetricsConfig
from launch.distributed.health.rank_reports import RankReports
from launch.distributed.health.stragglers import OwnTimes, Straggler, StragglerWatch, straggler_line


def times(own=0.0, input_wait=0.0, compute=0.0):
    return np.array([own, input_wait, compute], dtype=np.float64)


def test_a_straggler_is_named_after_the_window_and_only_it():
    judge = Straggler(ratio=1.5, steps=50)
    rows = np.stack([times(0.010), times(0.031, 0.025, 0.005), times(0.011)])
    assert judge.judge(rows, 100) == ([], [])  # slow from step 100 on
    assert judge.judge(rows, 149) == ([], [])
    assert judge.judge(rows, 150) == ([1], [])  # 50 steps later: named once
    assert judge.judge(rows, 151) == ([], [])
    rows[1] = times(0.012)
    assert judge.judge(rows, 152) == ([], [1])  # caught up


def test_a_process_slow_for_less_than_the_window_is_not_named():
    judge = Straggler(ratio=1.5, steps=50)
    slow = np.stack([times(0.01), times(0.03)])
    fast = np.stack([times(0.01), times(0.011)])
    for step, rows in ((0, slow), (40, fast), (45, slow), (90, slow)):
        assert judge.judge(rows, step) == ([], [])


def test_the_straggler_line_says_how_much_slower_and_on_what():
    names = ["chief 0 at c:1", "worker 0 at w:1", "worker 1 at w:2"]
    rows = np.stack([times(0.01), times(0.01), times(0.04, 0.001, 0.035)])
    assert straggler_line(rows, names, 2) == (
        "straggler: worker 1 at w:2 takes 4.0x the others' median time of its own per step "
        "(0.040 s against 0.010 s), mostly compute (0.001 s input wait, 0.035 s compute)")


def test_own_time_is_the_step_without_the_exchange_over_recent_steps():
    own = OwnTimes()
    for input_wait in (0.01, 0.02, 0.03):
        own.on_phases({"input": input_wait, "compute": 0.005, "exchange": 0.5, "apply": 0.001})
    assert own.steps == 3
    np.testing.assert_allclose(own.medians, [0.026, 0.02, 0.005])


def straggler_series(url: str) -> dict[str, float]:
    return {s.labels["peer"]: s.value for family in families(url)
            for s in family.samples if s.name == "towers_straggler"}


def test_the_watch_writes_the_line_and_exports_the_straggler_until_it_catches_up():
    lines = []
    identity = metrics.Identity("train", 0, "r")
    with metrics.serve(MetricsConfig(port=0), identity, lambda line: None) as exporter:
        watch = StragglerWatch(1.5, 2, lines.append, exporter)
        names = ["rank 0", "rank 1", "rank 2"]
        slow = np.stack([times(0.01), times(0.01), times(0.05, 0.04, 0.01)])
        for step in (10, 11, 12):
            watch.look(slow, names, step)
        assert straggler_series(exporter.url) == {"rank 2": 1.0}
        watch.look(np.stack([times(0.01)] * 3), names, 13)
        assert straggler_series(exporter.url) == {"rank 2": 0.0}
    assert lines == [straggler_line(slow, names, 2), "straggler no more: rank 2 keeps up again"]


@pytest.fixture
def rendezvous():
    """horovodrun's Gloo rendezvous server, as the ranks of a job find it."""
    http_server = pytest.importorskip("horovod.runner.http.http_server")
    server = http_server.RendezvousServer()
    port = server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_rank_0_names_a_slow_rank_by_its_host_from_the_rendezvous_store(rendezvous):
    lines = []
    ranks = [RankReports(rendezvous, 0, 3, StragglerWatch(1.5, 2, lines.append, None)),
             *(RankReports(rendezvous, r, 3, None) for r in (1, 2))]
    for rank, input_wait in zip(ranks, (0.001, 0.002, 0.03), strict=True):
        for _ in range(3):
            rank.times.on_phases({"input": input_wait, "compute": 0.01, "exchange": 0.0,
                                  "apply": 0.0})
    try:
        for rank in ranks[::-1]:  # rank 0 last: it reads every rank's report
            rank.after_create_session(None, None)
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:
            # rank 0 looks once a second; a judgement takes 2 of its steps
            ranks[0].times.on_phases({"input": 0.001, "compute": 0.01, "exchange": 0.0,
                                      "apply": 0.0})
            threading.Event().wait(0.2)
    finally:
        for rank in ranks:
            rank.end(None)
    assert len(lines) == 1
    # 0.04 s against the median of 0.011 and 0.012
    assert lines[0].startswith(f"straggler: rank 2 on {socket.gethostname()} takes 3.5x ")
    assert "mostly input (0.030 s input wait, 0.010 s compute)" in lines[0]
