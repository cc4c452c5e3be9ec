"""Examples per second, each figure by its one definition (launch/metrics/throughput.py,
docs/figures.md): the job's from the global step, this process's from its own steps, over
an interval and over the run, which starts once the first step (its set-up) is done."""

import pytest

from launch.metrics.throughput import Throughput, job_examples_per_global_step


@pytest.mark.parametrize("processes, aggregated, expected", [
    (1, 1, 64),  # one process
    (2, 2, 64),  # collective workers, Horovod ranks, a synchronous ps/worker job
    (2, 1, 32),  # an asynchronous ps/worker job: each worker's step moves the global step
    (4, 3, 48),  # synchronous with one backup worker: its gradient trains nothing
])
def test_the_examples_a_global_step_stands_for(processes, aggregated, expected):
    assert job_examples_per_global_step(64, processes, aggregated) == expected


def test_an_asynchronous_workers_own_rate_is_its_share_of_the_jobs():
    """Two workers of 32 examples a step: the global step moves twice per step of this
    one's. The job ran twice this worker's rate (the chief once reported its own)."""
    figures = Throughput(32, job_examples_per_global_step(64, 2, 1))
    figures.starting(0, now=100.0)
    figures.step(1, now=105.0)  # the first step: five seconds of set-up
    for i in range(1, 11):
        figures.step(1 + 2 * i, now=105.0 + 0.1 * i)
    run = figures.run()
    assert run.process == pytest.approx(10 * 32 / 1.0)
    assert run.job == pytest.approx(20 * 32 / 1.0)
    assert figures.timed() == {"from": 105.0, "to": 106.0, "steps": 10, "global_steps": 20}


def test_an_interval_holding_a_freeze_shows_it():
    figures = Throughput(64, 64)
    figures.starting(0, now=0.0)
    start = figures.step(1, now=1.0)
    for i in range(2, 12):
        figures.step(i, now=1.0 + 0.01 * i + (30.0 if i >= 6 else 0.0))  # frozen 30 s
    end = figures.last
    assert figures.between(start, end).job == pytest.approx(10 * 64 / (30.0 + 0.11), rel=1e-6)


def test_a_run_of_one_step_is_that_step():
    figures = Throughput(8, 8)
    figures.starting(4, now=10.0)
    only = figures.step(5, now=12.0)
    assert figures.run().job == figures.between(only, only).job == pytest.approx(4.0)
    assert figures.timed() == {"from": 10.0, "to": 12.0, "steps": 1, "global_steps": 1}
    assert figures.seconds_per_global_step(only, only) == pytest.approx(2.0)
