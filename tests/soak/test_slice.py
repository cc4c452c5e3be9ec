"""The soak's slice in the e2e tier: fixed schedules, written out, run and checked as
`make soak` runs its random ones (tests/soak/run.py). Each job is compared with the same
job trained in this process on one device."""

import pytest
from soak import jobs, run
from soak.schedule import Fault, Schedule

pytestmark = pytest.mark.e2e

SLICE = [
    # One process: killed as it trains; restarted, then stopped with every task down,
    # its newest checkpoint cut short, and started again on 1 tower instead of 2.
    Schedule(9001, "one", True, 0, (
        Fault(1.5, "kill", ("one",)),
        Fault(9.0, "restart", (), damage="truncate", size=1),
    )),
    # Synchronous ps/worker: worker 1 killed (its peers wait for it), then the ps frozen
    # for 2 s (SIGSTOP, SIGCONT).
    Schedule(9002, "sync", True, 0, (
        Fault(1.0, "kill", ("worker1",)),
        Fault(10.0, "pause", ("ps0",), secs=2.0),
    )),
]


@pytest.mark.parametrize("schedule", SLICE, ids=lambda s: s.arrangement)
def test_a_fixed_schedule_keeps_every_invariant(schedule, tmp_path):
    rows = jobs.write_rows(str(tmp_path / "rows.npz"))
    references = run.one_device_reference(str(tmp_path), rows, schedule.ends_with_data)
    lines = []
    summary = run.run_schedule(schedule, str(tmp_path), rows, write=lines.append,
                               references=references)
    print(*lines, sep="\n")
    assert summary["violations"] == [], "\n".join(lines)
    assert sum(summary["faults"].values()) == len(schedule.faults)
