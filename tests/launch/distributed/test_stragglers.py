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
from launch.distributed.health.stragglers import (
    SILENT_AFTER_SECS,
    STEPS,
    WINDOW,
    OwnTimes,
    Straggler,
    StragglerWatch,
    current,
    straggler_line,
)

NOW = 1000.0  # the chief's clock, in the reports' unix seconds


def row(own=0.0, input_wait=0.0, compute=0.0, steps=0, alive=NOW):
    """A report row: when it was written, the steps done, the medians."""
    return np.array([alive, steps, own, input_wait, compute], dtype=np.float64)


def look(judge, rows, chief_steps, own_steps):
    """Straggler.judge on rows whose every process has done `own_steps`."""
    rows = np.array(rows)
    rows[:, STEPS] = own_steps
    return judge.judge(current(rows, NOW), chief_steps)


def test_a_straggler_is_named_after_the_window_and_only_it():
    judge = Straggler(ratio=1.5, steps=50, min_secs=0.02)
    rows = [row(0.010), row(0.031, 0.025, 0.005), row(0.011)]
    assert look(judge, rows, 100, 100) == ([], [])  # slow from step 100 on
    assert look(judge, rows, 149, 149) == ([], [])
    assert look(judge, rows, 150, 150) == ([1], [])  # 50 steps later: named once
    assert look(judge, rows, 151, 151) == ([], [])
    rows[1] = row(0.012)
    assert look(judge, rows, 152, 152) == ([], [])  # caught up: not yet said
    assert look(judge, rows, 202, 202) == ([], [1])  # for as long: said once


def test_a_process_slow_for_less_than_the_window_is_not_named():
    judge = Straggler(ratio=1.5, steps=50, min_secs=0.0)
    slow = [row(0.01), row(0.03)]
    fast = [row(0.01), row(0.011)]
    for step, rows in ((0, slow), (40, fast), (45, slow), (90, slow)):
        assert look(judge, rows, step, step) == ([], [])


def test_timing_noise_below_the_floor_names_no_one():
    """The chief at 0.001 s a step against a peer's 0.0004 s is 2.5x: noise, not a
    straggler (it named itself so, flipping, before the floor)."""
    judge = Straggler(ratio=1.5, steps=2, min_secs=0.02)
    for step in range(0, 1000, 10):
        assert look(judge, [row(0.001), row(0.0004)], step, step) == ([], [])


def test_evidence_must_outlast_one_window_of_the_slow_process_own_steps():
    """Slow for many of the chief's steps, but the process itself took fewer steps than
    its medians span: one noisy window could be all there is."""
    judge = Straggler(ratio=1.5, steps=5, min_secs=0.0)
    rows = [row(0.01), row(0.05)]
    assert look(judge, rows, 0, 10) == ([], [])
    assert look(judge, rows, 100, 10 + WINDOW - 1) == ([], [])
    assert look(judge, rows, 101, 10 + WINDOW) == ([1], [])


def test_a_named_straggler_dipping_below_the_ratio_once_does_not_flip():
    judge = Straggler(ratio=1.5, steps=20, min_secs=0.0)
    slow, fine = [row(0.01), row(0.05)], [row(0.01), row(0.011)]
    assert look(judge, slow, 0, 0) == ([], [])
    assert look(judge, slow, 100, 100) == ([1], [])
    said = [look(judge, rows, 100 + k, 100 + k)
            for k, rows in enumerate([fine, slow, fine, fine, slow] * 4, start=1)]
    assert said == [([], [])] * 20  # never fine for 20 of the chief's steps in a row


def test_a_frozen_process_whose_report_went_stale_takes_no_part():
    """Worker 1 frozen: its last report says it was quick. The chief is not named
    against it, and it is not named from medians written before it froze."""
    judge = Straggler(ratio=1.5, steps=2, min_secs=0.0)
    stale = NOW - SILENT_AFTER_SECS - 1
    for step in range(0, 200, 10):
        rows = [row(0.05), row(0.001, alive=stale), row(0.05)]
        assert look(judge, rows, step, step) == ([], [])


def test_the_straggler_line_says_how_much_slower_and_on_what():
    names = ["chief 0 at c:1", "worker 0 at w:1", "worker 1 at w:2"]
    rows = np.stack([row(0.01), row(0.01), row(0.04, 0.001, 0.035)])
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


def test_the_watch_writes_the_line_and_exports_the_straggler_it_names_until_it_catches_up():
    lines = []
    identity = metrics.Identity("train", 0, "r")
    with metrics.serve(MetricsConfig(port=0), identity, lambda line: None) as exporter:
        watch = StragglerWatch(1.5, 2, lines.append, exporter, 0.02)
        names = ["rank 0", "rank 1", "rank 2"]
        slow = np.stack([row(0.01), row(0.01), row(0.05, 0.04, 0.01)])
        for step in (10, 11, 12):
            slow[:, STEPS] = step * WINDOW
            watch.look(slow, names, step, NOW)
        assert straggler_series(exporter.url) == {"rank 2": 1.0}
        for step in (13, 14, 15):
            watch.look(np.stack([row(0.01, steps=1000)] * 3), names, step, NOW)
        assert straggler_series(exporter.url) == {"rank 2": 0.0}
    assert lines == [straggler_line(slow, names, 2), "straggler no more: rank 2 keeps up again"]
    assert watch.named == ["rank 2"]


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
    ranks = [RankReports(rendezvous, 0, 3, StragglerWatch(1.5, 2, lines.append, None, 0.02)),
             *(RankReports(rendezvous, r, 3, None) for r in (1, 2))]

    def steps(count):
        for rank, input_wait in zip(ranks, (0.001, 0.002, 0.03), strict=True):
            for _ in range(count):
                rank.times.on_phases({"input": input_wait, "compute": 0.01, "exchange": 0.0,
                                      "apply": 0.0})

    steps(3)
    try:
        for rank in ranks[::-1]:  # rank 0 last: it reads every rank's report
            rank.after_create_session(None, None)
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:
            # rank 0 looks once a second; a judgement takes 2 of its steps and a window
            # of the slow rank's own
            steps(WINDOW // 4)
            threading.Event().wait(0.2)
    finally:
        for rank in ranks:
            rank.end(None)
    assert len(lines) == 1
    # 0.04 s against the median of 0.011 and 0.012
    assert lines[0].startswith(f"straggler: rank 2 on {socket.gethostname()} takes 3.5x ")
    assert "mostly input (0.030 s input wait, 0.010 s compute)" in lines[0]
