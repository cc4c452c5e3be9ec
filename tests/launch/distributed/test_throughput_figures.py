"""The job's examples/sec, recomputed from what the run records: every worker's own steps
in its timed span (its JSON result's `timed`) times its share of the global batch (its
start-up line), over the span from the first worker's start to the last one's end. The
chief reports the job's rate from the global step instead; the two agree within 5%, for
a 2-worker ps/worker job (asynchronous: each worker's step moves the global step by one)
and for a collective one (every worker in every step). The chief's own rate is about
half of it: what towers reported as the job's before (1b32783). Both workers' results
name the step the job ended at."""

import json
import re

import pytest
from helpers.commands import FAST, run_towers

JOB = [*FAST, "--set", "towers.devices=1", "--set", "train.batch_size=64",
       "--set", "train.steps=300", "--set", "train.log_every_steps=100"]


def worker_records(stderr: str) -> dict[str, tuple[dict, int]]:
    """Each worker's JSON result and its examples per step, as local-cluster relays them."""
    results = {m.group(1): json.loads(m.group(2))
               for m in re.finditer(r"^\[(worker\d+)\] (\{.*\})$", stderr, re.M)}
    shares = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\[(worker\d+)\] towers: worker rank \d+ of ranks \S+: (\d+) examples of every",
        stderr, re.M)}
    assert set(results) == set(shares) == {"worker0", "worker1"}, stderr[-3000:]
    return {name: (results[name], shares[name]) for name in results}


@pytest.mark.e2e
@pytest.mark.parametrize("ps", [1, 0], ids=["ps_worker", "collective"])
def test_the_jobs_examples_per_sec_is_what_its_workers_records_add_up_to(tmp_path, ps):
    run = run_towers("local-cluster", "--ps", str(ps), "--workers", "2", *JOB,
                     "--set", f"train.checkpoint_dir={tmp_path}", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    records = worker_records(run.stderr)
    examples = sum(result["timed"]["steps"] * share for result, share in records.values())
    start = min(result["timed"]["from"] for result, _ in records.values())
    end = max(result["timed"]["to"] for result, _ in records.values())
    recomputed = examples / (end - start)
    reported = json.loads(run.stdout.strip().splitlines()[-1])  # local-cluster's: the chief's
    print(f"recomputed {recomputed:.1f}, reported {reported['job_examples_per_sec']:.1f}, "
          f"the chief's own {reported['process_examples_per_sec']:.1f}")
    assert reported["job_examples_per_sec"] == pytest.approx(recomputed, rel=0.05)
    assert reported["process_examples_per_sec"] < 0.75 * recomputed  # one worker's of two
    # Every worker's result names the step the job ended at: the chief's final checkpoint's
    # (an asynchronous worker still stepping as the job stopped once said one less).
    steps = {name: result["global_step"] for name, (result, _) in records.items()}
    assert steps["worker1"] == steps["worker0"] == int(reported["checkpoint"].rsplit("-", 1)[1])
