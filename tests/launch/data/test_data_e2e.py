"""Users' data end to end, through the real commands: a folder of JPEGs converted,
trained on and evaluated; a bad record met mid-run, named; ps/worker workers checking and
reading only their own TFRecord files. (MNIST, CIFAR-10 and text are converted,
trained and evaluated in-process in test_converters.)"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from helpers.commands import Cluster, last_json, ok, run_towers
from helpers.data_files import (
    class_images,
    encode,
    image_feature_map,
    write_examples,
    write_image_folder,
)

from launch.data.converters import convert_files

pytestmark = pytest.mark.e2e

SMALL_CONVNET = {"name": "convnet", "filters": [4], "kernel_size": 3, "dense_units": 8,
                 "image_size": 12, "channels": 3, "num_classes": 3}


def job_file(case_dir, model: dict, data: dict, steps: int = 3) -> str:
    job = {"model": model, "data": data, "towers": {"devices": 1},
           "train": {"steps": steps, "batch_size": 8, "log_every_steps": 1,
                     "checkpoint_dir": str(case_dir / "ckpt")},
           "eval": {"steps": 1, "batch_size": 8}}
    path = case_dir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def image_folder_job(case_dir) -> tuple[dict, str]:
    """A folder of JPEGs by class converted (as `towers data convert --from images`
    does), and a job reading what was written, with the data section the summary gives."""
    case_dir.mkdir()
    images, labels = class_images(24, size=12)
    write_image_folder(case_dir / "photos", images, labels)
    converted = convert_files("images", [str(case_dir / "photos")],
                              str(case_dir / "out" / "train"), 2).as_dict()
    return converted, job_file(case_dir, {**SMALL_CONVNET, **converted["model"]},
                               converted["data"])


def late_bad_record_job(case_dir) -> tuple[str, str]:
    """40 ImageNet-layout records; record 20 is a truncated JPEG (past the records
    checked up front)."""
    case_dir.mkdir()
    images, labels = class_images(40, size=12)
    maps = [image_feature_map(encode(image), int(label))
            for image, label in zip(images, labels, strict=True)]
    maps[20] = image_feature_map(encode(images[20])[:60], 0)
    path = write_examples(case_dir / "late.tfrecord", maps)
    data = {"source": "tfrecord", "path": path, "schema": "imagenet", "shuffle_buffer": 0}
    return path, job_file(case_dir, SMALL_CONVNET, data, steps=8)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Train and eval on the converted folder, and the run that meets a bad record,
    two processes at a time."""
    base = tmp_path_factory.mktemp("formats")
    converted, job = image_folder_job(base / "images")
    bad_path, bad_job = late_bad_record_job(base / "bad")
    with ThreadPoolExecutor(max_workers=2) as pool:
        train = pool.submit(run_towers, "train", "-c", job)
        bad = pool.submit(run_towers, "train", "-c", bad_job)
        trained = ok(train.result())
        evaluated = pool.submit(run_towers, "eval", "-c", job)
        return {"converted": converted, "train": trained, "eval": ok(evaluated.result()),
                "bad": bad.result(), "bad_path": bad_path}


def test_a_folder_of_jpegs_converts_trains_and_evaluates(runs):
    assert runs["converted"]["examples"] == 24 and len(runs["converted"]["files"]) == 2
    assert runs["train"]["global_step"] == 3 and math.isfinite(runs["train"]["loss"])
    assert runs["eval"]["global_step"] == 3 and math.isfinite(runs["eval"]["loss"])


def test_a_bad_record_mid_run_fails_the_job_in_one_line(runs):
    fail = runs["bad"]
    lines = [line for line in fail.stderr.splitlines() if line.startswith("towers: error")]
    assert fail.returncode == 2, fail.stderr[-3000:]
    assert "Traceback" not in fail.stderr and len(lines) == 1
    assert lines[0].endswith(f"{runs['bad_path']}: record 20: 'image/encoded' does not decode "
                             "as an image (data.on_bad_record: skip leaves such records out)")


def four_files_one_spoilt(tmp_path):
    """Four ImageNet-layout files of 8 records; file 3's first record is a truncated
    JPEG, which the up-front check of every file a worker reads finds. Files 1 and 3
    go to worker 1."""
    images, labels = class_images(32, size=12)
    files = []
    for index in range(4):
        maps = [image_feature_map(encode(image), int(label)) for image, label in
                zip(images[index::4], labels[index::4], strict=True)]
        if index == 3:
            maps[0] = image_feature_map(encode(images[0])[:60], 0)
        files.append(write_examples(tmp_path / f"part-{index}.tfrecord", maps))
    return files


def test_ps_workers_check_and_read_only_their_own_files(tmp_path):
    """Worker 0 never opens file 3, so it trains to the end; worker 1 checks it before
    training and stops on it. Neither outcome depends on how fast either runs."""
    files = four_files_one_spoilt(tmp_path)
    settings = {"model.name": "convnet", "model.image_size": 12, "model.channels": 3,
                "model.num_classes": 3, "model.filters": "[4]", "model.dense_units": 8,
                "data.source": "tfrecord", "data.path": str(tmp_path / "part-*.tfrecord"),
                "data.schema": "imagenet", "towers.devices": 1, "train.batch_size": 8,
                "train.steps": 6, "cluster.shutdown_grace_secs": 2}
    args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    cluster = Cluster(tmp_path, args, workers=2, ps=1)
    try:
        ps = cluster.start("ps", "ps", 0)
        chief, other = (cluster.start(f"worker{i}", "worker", i) for i in range(2))
        assert other.wait(timeout=240) == 2, other.stderr[-3000:]
        assert chief.wait(timeout=240) == 0, chief.stderr[-3000:]
        assert ps.wait(timeout=120) == 0, ps.stderr[-3000:]
        chief_log, other_log, result = chief.stderr, other.stderr, last_json(chief.stdout)
    finally:
        cluster.stop()
    assert f"input: 2 of 4 files (reader 1 of 2): {files[0]}, {files[2]}" in chief_log
    assert result["global_step"] >= 6
    errors = [line for line in other_log.splitlines() if line.startswith("towers: error")]
    assert len(errors) == 1 and f"{files[3]}: record 0" in errors[0], other_log[-3000:]
