"""The job's examples/sec, recomputed from what the run records (tests/helpers/
job_rates.py says how), agrees within 5% with what the chief reports from the global
step, for a collective 2-worker job (every worker in every step); the chief's own rate
is about half of it. The same check on a 2-worker ps/worker job (asynchronous: each
worker's step moves the global step by one) runs on the Keras example's `local-cluster
--ps 1 --workers 2` job of tests/launch/modelref/test_user_models_e2e.py, a cluster
that test starts anyway."""

import pytest
from helpers.commands import FAST, run_towers
from helpers.job_rates import check_job_rate

# 150 steps: a timed span of about 2 s, on which the lockstep workers' starts and ends
# (a few ms apart) move the recomputed rate well under 5% (0.05-0.2% measured).
JOB = [*FAST, "--set", "towers.devices=1", "--set", "train.batch_size=64",
       "--set", "train.steps=150", "--set", "train.log_every_steps=50"]


@pytest.mark.e2e
def test_the_jobs_examples_per_sec_is_what_its_workers_records_add_up_to(tmp_path):
    check_job_rate(run_towers("local-cluster", "--ps", "0", "--workers", "2", *JOB,
                              "--set", f"train.checkpoint_dir={tmp_path}", timeout=300))
