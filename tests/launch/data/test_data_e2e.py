"""Users' data end to end, through the real commands: a folder of JPEGs converted,
trained on and evaluated; a bad record met mid-run, named; ps/worker workers checking and
reading only their own TFRecord files. (MNIST, CIFAR-10 and text are converted,
trained and evaluated in-process in test_converters.)"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from helpers.commands import ok, run_towers
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
