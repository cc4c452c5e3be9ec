"""A synchronous job of 1 ps and 2 workers, stopped while its chief is held up (here
frozen by SIGSTOP, as a chief stuck in a long step or a slow save would be): worker 1,
stopped by SIGTERM, waits for the chief's final step; the ps, stopped next, serves it
for its grace (15 s) and leaves. Worker 1 then ends with 0 within seconds, its result
the step it saw. Before, its report to the ps that had gone waited without end inside
TensorFlow (a session's device search has no timeout) until its ps watch ended it with
138, cluster.reconnect_timeout_secs later: the hang seen once when a whole job was
stopped at once on a loaded machine."""

import os
import signal
import time

import pytest
from helpers.commands import Cluster, last_json

JOB = ["--set", "model.name=mlp", "--set", "model.hidden_units=[8]",
       "--set", "train.batch_size=8", "--set", "data.num_examples=256",
       "--set", "train.sync=true", "--set", "train.steps=1000000",
       "--set", "train.log_every_steps=1", "--set", "cluster.startup_timeout_secs=60",
       "--set", "cluster.reconnect_timeout_secs=60"]

STEP = r"towers: step \d+/"


@pytest.mark.e2e
def test_a_worker_whose_ps_left_before_its_report_still_ends_with_0(tmp_path):
    cluster = Cluster(tmp_path, JOB, workers=2)
    try:
        ps = cluster.start("ps", "ps", 0)
        chief = cluster.start("chief", "worker", 0)
        worker1 = cluster.start("worker1", "worker", 1)
        chief.wait_for(STEP)
        worker1.wait_for(STEP)
        os.kill(chief.proc.pid, signal.SIGSTOP)  # held up: no final step comes
        worker1.proc.terminate()
        stopping = worker1.wait_for(r"received SIGTERM").end()
        worker1.wait_for(STEP, start=stopping)  # its session has ended
        ps.proc.terminate()
        ps.wait_for(r"did not finish within 15 s", timeout=60)
        left = time.monotonic()
        assert ps.wait(timeout=30) == 0
        assert worker1.wait(timeout=60) == 0, worker1.stderr[-3000:]
        after = time.monotonic() - left
    finally:
        os.kill(chief.proc.pid, signal.SIGCONT)
        cluster.stop()
    print(f"worker 1 ended {after:.1f} s after the ps left")
    assert after < 20  # it stops waiting for a ps that has gone
    result = last_json(worker1.stdout)
    assert result["stopped_by"] == "signal" and result["task"] == 1
    assert "the chief's final step did not come" in worker1.stderr
    assert "could not report finished to every ps task" in worker1.stderr
    assert last_json(ps.stdout)["workers_reported"] == 0
