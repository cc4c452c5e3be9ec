"""The Horovod backend: real `horovodrun` with Gloo on localhost, against one process."""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers.checkpoints import checkpoint_variables
from helpers.commands import ROOT, environment, last_json, ok, run_in_process
from helpers.horovod import needs_horovod
from helpers.scraper import Scraper, unclaimable_ports

from launch.config import ConfigError, from_dict
from launch.distributed.arrangements.horovod import Rank, rank_job

HOROVODRUN = shutil.which("horovodrun")


MLP = ["--set", "model.name=mlp", "--set", "model.hidden_units=[32]",
       "--set", "optimizer.name=momentum", "--set", "optimizer.learning_rate=0.05",
       "--set", "train.batch_size=64", "--set", "data.num_examples=512",
       "--set", "data.shuffle_buffer=0", "--set", "train.log_every_steps=1"]


def start_horovodrun(np_: int, *args: str, output=subprocess.PIPE,
                     wrapper: tuple[str, ...] = ()) -> subprocess.Popen:
    """`towers` under horovodrun in a process group of its own, so all of it can be killed.
    wrapper: a command each rank runs `towers` through (it gets the command as arguments)."""
    command = [HOROVODRUN, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
               *wrapper, sys.executable, "-m", "launch", *args]
    return subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=output, stderr=output,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True)


def horovodrun(np_: int, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `towers` under horovodrun; the whole process group goes if it overstays."""
    proc = start_horovodrun(np_, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def rank_results(stdout: str) -> dict[int, dict]:
    """Each rank's JSON result, from horovodrun's `[rank]<stdout>:` prefixed lines."""
    found = re.findall(r"^\[(\d+)\]<stdout>:(\{.*\})$", stdout, re.MULTILINE)
    return {int(rank): last_json(line) for rank, line in found}


@pytest.mark.e2e
@needs_horovod
def test_two_ranks_resume_and_match_one_process_on_the_combined_batch(tmp_path):
    """Each rank also runs its share as 2 micro-batches on 2 towers: accumulation inside
    the ranks must leave the update what one process makes of the whole batch. Each
    rank serves its metrics on its own port (metrics.port + rank), scraped as it runs.
    The one-process runs are this process's (they need no process of their own)."""
    start = tmp_path / "start"
    ok(run_in_process("train", *MLP, "--set", f"train.checkpoint_dir={start}",
                      "--set", "train.steps=1", "--set", "towers.devices=1"))
    single, ranks = tmp_path / "single", tmp_path / "horovod"
    shutil.copytree(start, single)
    shutil.copytree(start, ranks)
    events_before = len(glob.glob(str(ranks / "events.out.tfevents.*")))

    # Both resume at step 1. Rank 1 has no checkpoint of its own: unless rank 0's
    # restored variables reach it by the broadcast, the two runs part ways.
    ok(run_in_process("train", *MLP, "--set", f"train.checkpoint_dir={single}",
                      "--set", "train.steps=4", "--set", "towers.devices=1"))
    port = unclaimable_ports(2)  # rank r serves on port + r
    scrapers = [Scraper(f"http://127.0.0.1:{port + rank}/metrics") for rank in (0, 1)]
    try:
        result = horovodrun(2, "train", *MLP, "--set", f"train.checkpoint_dir={ranks}",
                            "--set", "train.steps=4", "--set", "train.accumulate_steps=2",
                            "--set", "towers.devices=2", "--set", f"metrics.port={port}",
                            "--backend", "horovod")
    finally:
        for scraper in scrapers:
            scraper.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    for rank, scraper in enumerate(scrapers):
        assert_served_a_step(scraper.texts, rank)

    results = rank_results(result.stdout)
    assert sorted(results) == [0, 1], result.stdout[-2000:]
    assert [results[r]["global_step"] for r in (0, 1)] == [4, 4]
    assert (results[0]["size"], results[0]["accumulate_steps"]) == (2, 2)
    assert tf.train.latest_checkpoint(str(ranks)).endswith("model.ckpt-4")

    expected, got = checkpoint_variables(single, "mlp/"), checkpoint_variables(ranks, "mlp/")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=0, err_msg=name)
    initial = checkpoint_variables(start, "mlp/")
    assert any(not np.allclose(initial[n], expected[n]) for n in expected), "nothing trained"

    # Rank 0 alone writes: one new event file, and rank 1 logs nothing.
    assert len(glob.glob(str(ranks / "events.out.tfevents.*"))) == events_before + 1
    assert "[1]<stderr>:towers:" not in result.stderr
    assert "[0]<stderr>:towers: saved checkpoint at step 4" in result.stderr

    # Run again, finished: every rank starts at step 4 (rank 0's, broadcast before any
    # rank reads it) and takes no step; no checkpoint is written (a TensorBoard events
    # file is, as by any run).
    files = sorted(f for f in os.listdir(ranks) if "tfevents" not in f)
    again = horovodrun(2, "train", *MLP, "--set", f"train.checkpoint_dir={ranks}",
                       "--set", "train.steps=4", "--set", "train.accumulate_steps=2",
                       "--set", "towers.devices=2", "--backend", "horovod")
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = rank_results(again.stdout)
    assert [(rerun[r]["global_step"], rerun[r]["steps_run"]) for r in (0, 1)] == [(4, 0)] * 2
    assert "no step to take" in again.stderr
    assert sorted(f for f in os.listdir(ranks) if "tfevents" not in f) == files


def assert_served_a_step(texts: list[str], rank: int) -> None:
    """Some scrape of the rank's port shows a step taken, labelled with its rank and task."""
    stepped = [t for t in texts
               if re.search(rf'^towers_global_step{{[^}}]*rank="{rank}"[^}}]*}} [1-9]', t,
                            re.MULTILINE)]
    assert stepped, f"rank {rank}: no scrape showed a step; last: {(texts or [''])[-1][:2000]}"
    assert f'task="{rank}"' in stepped[-1]


def test_without_horovod_it_says_how_to_install_and_exits_2(tmp_path, monkeypatch):
    # No horovod to import, as when it is not installed (None in sys.modules stops the
    # import). What a process of its own prints besides is checked in test_bad_input.
    monkeypatch.setitem(sys.modules, "horovod", None)
    result = run_in_process("train", "--backend", "horovod",
                            "--set", f"train.checkpoint_dir={tmp_path / 'c'}")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "make horovod" in lines[0], result.stderr
    assert not (tmp_path / "c").exists()


def job(**towers):
    return from_dict({"towers": towers, "metrics": {"port": 9100}})


def test_each_local_rank_pins_its_own_gpus_and_metrics_port():
    assert rank_job(job(), Rank(3, 4, 1), num_host_gpus=2).session.visible_devices == "1"
    two = rank_job(job(devices=2), Rank(1, 2, 1), num_host_gpus=4)
    assert (two.session.visible_devices, two.towers.devices) == ("2,3", 2)
    assert rank_job(job(), Rank(3, 4, 1), num_host_gpus=2).metrics.port == 9103
    cpu = rank_job(job(), Rank(1, 2, 1), num_host_gpus=0)
    assert (cpu.session.visible_devices, cpu.towers.devices) == (None, 1)


def test_too_many_ranks_on_a_host_or_a_device_list_is_an_error():
    from launch.devices import DeviceError

    with pytest.raises(DeviceError, match="local rank 2 needs GPUs 2...2 but this host has 2"):
        rank_job(job(), Rank(2, 3, 2), num_host_gpus=2)
    with pytest.raises(ConfigError, match="a count of devices per rank"):
        from_dict({"towers": {"devices": ["/gpu:0"]}, "cluster": {"backend": "horovod"}})


@pytest.mark.e2e
@needs_horovod
def test_a_nan_on_one_rank_stops_every_rank_with_status_3_and_a_clean_checkpoint(tmp_path):
    from helpers.checkpoints import assert_nothing_lost
    from helpers.faults import job, poisoned_csv

    # Global batch 16, 8 a rank: one rank's part of step 25 holds its marked example,
    # whose gradient is NaN (helpers/diverging_model.py). The job-wide gradient norm is
    # then NaN on both ranks, so both stop.
    ckpt = tmp_path / "ckpt"
    result = horovodrun(2, "train", *job(ckpt, 40), *poisoned_csv(tmp_path / "d.csv", [25]),
                        "--backend", "horovod")
    assert result.returncode != 0
    for rank in (0, 1):
        assert re.search(rf"^\[{rank}\]<stderr>:towers: error: training diverged",
                         result.stderr, re.MULTILINE), result.stderr[-3000:]
    assert "Exit code: 3" in result.stderr, result.stderr[-3000:]
    assert assert_nothing_lost(ckpt, 20) == 20
