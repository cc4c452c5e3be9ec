"""The soak's slice in the e2e tier: a fixed schedule, written out, run and checked as
`make soak` runs its random ones (tests/soak/run.py), so the harness is run with every
change; its job is compared with the same job trained in this process on one device."""

import pytest
from soak import jobs, run
from soak.schedule import Fault, Schedule

pytestmark = pytest.mark.e2e

SLICE = [
    # Synchronous ps/worker: worker 1 killed (its peers wait for it), then the ps frozen
    # for 2 s (SIGSTOP, SIGCONT). The other arrangements' schedules run in `make soak`.
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
