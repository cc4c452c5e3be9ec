"""A synchronous job of 1 ps and 2 workers, stopped while its chief is held up (here
frozen by SIGSTOP, as a chief stuck in a long step or a slow save would be): worker 1,
stopped by SIGTERM, does not wait for the chief (the job may go on without it): it
reports to the ps and ends with 0 within seconds, its result the step it saw. The ps,
stopped next, serves the frozen chief for its grace (15 s) and leaves with 0. Before,
worker 1 waited for the chief's final step (cluster.shutdown_grace_secs), its report then
found the ps gone and, inside TensorFlow, waited for it without end until its ps watch
ended it with 138 (now bounded: test_job_end.py): the hang seen once when a whole job
was stopped at once on a loaded machine."""

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
def test_a_worker_stopped_while_its_chief_is_held_up_ends_with_0_at_once(tmp_path):
    cluster = Cluster(tmp_path, JOB, workers=2)
    try:
        ps = cluster.start("ps", "ps", 0)
        chief = cluster.start("chief", "worker", 0)
        worker1 = cluster.start("worker1", "worker", 1)
        chief.wait_for(STEP)
        worker1.wait_for(STEP)
        os.kill(chief.proc.pid, signal.SIGSTOP)  # held up: no final step comes
        worker1.proc.terminate()
        sent = time.monotonic()
        assert worker1.wait(timeout=60) == 0, worker1.stderr[-3000:]
        took = time.monotonic() - sent
        ps.proc.terminate()
        ps.wait_for(r"did not finish within 15 s", timeout=60)
        assert ps.wait(timeout=30) == 0
    finally:
        os.kill(chief.proc.pid, signal.SIGCONT)
        cluster.stop()
    print(f"worker 1 ended {took:.1f} s after its SIGTERM")
    assert took < 20  # train.stop_timeout_secs: it waits for nothing of the chief's
    result = last_json(worker1.stdout)
    assert result["stopped_by"] == "signal" and result["task"] == 1
    assert "the chief's final step did not come" not in worker1.stderr
    assert last_json(ps.stdout)["workers_reported"] == 1
