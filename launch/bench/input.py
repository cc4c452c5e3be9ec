"""`towers bench --input`: training examples/sec fed by each kind of input, side by
side, and what the input pipeline alone costs per example.

Rows (one model, one global batch, the same towers), each fed through the
training job's own input path (``launch.runtime.plan`` -> ``launch.data``):

  synthetic       ``data.source: synthetic``: one batch made in the graph, repeated
  npz             the pixels as float32 arrays in one ``.npz``, held in memory
  csv             the pixels as a CSV's float columns, read whole and held in memory
  tfrecord float  pre-decoded pixels as float lists (the layout ``towers data convert
                  -c job.yaml`` writes from npz/csv)
  tfrecord raw    pre-decoded pixels as uint8 bytes (``schema: raw_image``, as
                  ``--from mnist / cifar10`` write), augmented (crop, flip) per batch
  jpeg            JPEG bytes (``schema: imagenet``) at twice the model's side,
                  decoded, cropped and resized per example

Then the pipeline alone, no model, on one thread (``num_parallel_calls: 1``,
``threads: 1``, ``prefetch: 1``), for ALONE_STEPS times the steps of a block: its
examples/sec, and the CPU time its process used per example (all its threads;
unlike wall time, not stretched by other processes on a shared host). The best
synthetic training rate times that CPU time is the host threads that input needs
to keep up.

The job's pipeline keys (``data.num_parallel_calls``, ``prefetch``, ``threads``,
``shuffle_buffer``, from ``-c`` / ``--set``) apply to every training row, so two
settings can be compared by two runs. The bench writes the data (from random smooth
images, ``images``) into a temporary directory, builds each row once in its own process
(``input_case``) and interleaves timed blocks across rows, as the other rows of
`towers bench` do.
"""

from __future__ import annotations

import datetime
import shutil
import statistics
import tempfile
from collections.abc import Callable

import numpy as np

from launch.bench.case_process import CaseProcess
from launch.bench.images import encode_jpegs, smooth_images
from launch.bench.jpeg import decode_costs, decode_report
from launch.bench.report import describe_run, heading
from launch.bench.settings import Row, Settings

INPUTS = ("synthetic", "npz", "csv", "tfrecord float", "tfrecord raw", "jpeg")
EXAMPLES = 2048  # written once per kind; the pipelines repeat them
SHARDS = 8
JPEG_SCALE = 2  # stored JPEG side / model side, like ImageNet's ~400 px for 224
# An input alone runs this many times the steps per block, with a prefetch buffer of
# one batch: what its buffers held from before the block is then a small part of it.
ALONE_STEPS = 10
ALONE = " (input alone, 1 thread)"
PHOTO_SIDE = 448  # the decode table's second size: about an ImageNet photograph's


def input_spec_of(settings: Settings):
    """The input the bench's model declares (bench.check_model made sure it does)."""
    from launch import modelref
    from launch.config import ModelConfig

    return modelref.resolve(ModelConfig(settings.model, settings.params, settings.model_path,
                                        settings.job_dir)).input_spec


def write_inputs(spec, directory: str, count: int = EXAMPLES, seed: int = 0) -> dict[str, dict]:
    """Write ``count`` examples of every kind of file input for images of ``spec``;
    returns each row's data section (a job file's ``data:``)."""
    from launch.data.converters.writer import (
        ShardedWriter,
        encoded_image_example,
        example,
        float_feature,
        int64_feature,
        raw_image_example,
    )

    height, width, channels = spec.feature_shape
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, spec.num_classes, count)
    images = smooth_images(rng, count, height, width, channels)
    large = smooth_images(rng, count, JPEG_SCALE * height, JPEG_SCALE * width, channels)
    encoded = encode_jpegs(large)
    kinds = {
        "tfrecord float": lambda i: example({
            "features": float_feature((images[i] / 255.0).ravel().tolist()),
            "label": int64_feature([labels[i]])}),
        "tfrecord raw": lambda i: raw_image_example(images[i], int(labels[i])),
        "jpeg": lambda i: encoded_image_example(encoded[i], large[i].shape, int(labels[i]),
                                                "JPEG", ""),
    }
    sections = {"synthetic": {"source": "synthetic"},
                **write_arrays(images / np.float32(255), labels, directory)}
    for name, make in kinds.items():
        prefix = f"{directory}/{name.replace(' ', '_')}"
        with ShardedWriter(prefix, SHARDS, count) as writer:
            for i in range(count):
                writer.write(make(i))
        sections[name] = {"source": "tfrecord", "path": f"{prefix}-*.tfrecord"}
    schema = {"shape": list(spec.feature_shape), "num_classes": spec.num_classes}
    sections["tfrecord raw"]["schema"] = {"preset": "raw_image", **schema}
    sections["jpeg"]["schema"] = {"preset": "imagenet", **schema}
    return sections


def write_arrays(images: np.ndarray, labels: np.ndarray, directory: str) -> dict[str, dict]:
    """images float32 [N, ...] in [0, 1] and labels [N] as an npz and as a CSV (a column
    per pixel, then the label); each one's data section."""
    npz, csv = f"{directory}/arrays.npz", f"{directory}/arrays.csv"
    np.savez(npz, features=images.astype(np.float32), labels=labels)
    flat = images.reshape(len(images), -1)
    header = ",".join([f"p{i}" for i in range(flat.shape[1])] + ["label"])
    table = np.concatenate([flat, labels[:, None].astype(np.float32)], axis=1)
    np.savetxt(csv, table, delimiter=",", header=header, comments="", fmt="%.6g")
    return {"npz": {"source": "npz", "path": npz}, "csv": {"source": "csv", "path": csv}}


def run_input(settings: Settings, write: Callable[[str], None]) -> tuple[list[Row], list[Row]]:
    """Measure every input row (training) and every file input alone; returns both."""
    spec = input_spec_of(settings)
    if len(spec.feature_shape) != 3:
        raise ValueError(f"--input: model {settings.model} does not take images")
    directory = tempfile.mkdtemp(prefix="towers-bench-input-")
    cases = []
    try:
        write(f"writing {EXAMPLES} examples of each input to {directory}")
        cases = _start_rows(settings, write_inputs(spec, directory))
        write(f"building {len(cases)} rows (one process each)")
        for _, case in cases:
            case.ready()
        _time_rows(settings, cases, write)
        for row, case in cases:
            row.peak_rss_bytes = case.peak_rss()
    finally:
        for _, case in cases:
            case.close()
        shutil.rmtree(directory, ignore_errors=True)
    rows = [row for row, _ in cases]
    return [r for r in rows if not _alone(r)], [r for r in rows if _alone(r)]


def _alone(row: Row) -> bool:
    return row.mode.endswith(ALONE)


def _start_rows(settings: Settings, sections: dict[str, dict]) -> list:
    """(row, its process) for each input at each device count, then each file input
    alone."""
    cases = []
    for pipeline_only in (False, True):
        for name in INPUTS[1:] if pipeline_only else INPUTS:
            for devices in (1,) if pipeline_only else settings.towers:
                row = Row(name + (ALONE if pipeline_only else ""), devices)
                cases.append((row, CaseProcess({
                    "input": True, "model": settings.model, "params": settings.params,
                    "batch": settings.batch, "devices": devices, "data": sections[name],
                    "pipeline_only": pipeline_only, "warmup": settings.warmup,
                    "mode": row.mode, "data_options": settings.data_options,
                    "model_path": settings.model_path, "job_dir": settings.job_dir})))
    return cases


def _time_rows(settings: Settings, cases: list, write: Callable[[str], None]) -> None:
    """Interleaved blocks, every other round in reverse order (A B C, C B A, ...) so no
    row always follows the same one; each row's examples/sec and CPU ms per example
    (all the row's process's threads: model and input), medians over the blocks."""
    cpu_ms: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    order = list(enumerate(cases))
    for repeat in range(settings.repeats):
        write(f"round {repeat + 1}/{settings.repeats}")
        for i, (row, case) in order if repeat % 2 == 0 else reversed(order):
            steps = settings.steps * (ALONE_STEPS if _alone(row) else 1)
            examples = steps * settings.batch
            cpu = case.cpu_seconds()
            row.rates.append(examples / case.time_block(steps))
            cpu_ms[i].append(1000 * (case.cpu_seconds() - cpu) / examples)
    for i, (row, _) in enumerate(cases):
        row.cpu_ms_per_example = statistics.median(cpu_ms[i])


def input_report(training: list[Row], alone: list[Row]) -> str:
    """The two markdown tables: training fed by each input; each input alone.

    cores busy: examples/sec times CPU seconds per example, the CPU the row's process
    got while timed. On a shared host a process with more runnable threads (input
    threads beside the model's) gets a larger share, so wall rates compare rows only
    where that column is alike; CPU per example compares them anywhere.
    """
    lines = ["| input | devices | examples/sec median | min | max | ratio to synthetic | "
             "CPU ms per example | CPU ratio to synthetic | cores busy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    synthetic = {r.devices: r for r in training if r.mode == "synthetic"}
    for row in training:
        base = synthetic[row.devices]
        lines.append(f"| {row.mode} | {row.devices} | {row.median:.0f} | {min(row.rates):.0f} | "
                     f"{max(row.rates):.0f} | {row.median / base.median:.3f} | "
                     f"{row.cpu_ms_per_example:.3f} | "
                     f"{row.cpu_ms_per_example / base.cpu_ms_per_example:.3f} | "
                     f"{row.median * row.cpu_ms_per_example / 1000:.2f} |")
    best = max(row.median for row in synthetic.values())
    lines += ["", "| input alone, 1 thread | examples/sec median | min | max | "
              "CPU ms per example | threads to feed the synthetic rate |",
              "| --- | --- | --- | --- | --- | --- |"]
    for row in alone:
        cpu_ms = row.cpu_ms_per_example
        lines.append(f"| {row.mode[:-len(ALONE)]} | {row.median:.0f} | {min(row.rates):.0f} | "
                     f"{max(row.rates):.0f} | {cpu_ms:.4f} | {best * cpu_ms / 1000:.2f} |")
    return "\n".join(lines)


def input_bench(settings: Settings, write: Callable[[str], None]) -> str:
    """The whole --input report under the run's heading: the rows, then JPEG decoding's
    cost per image at the rows' JPEG size and at a photograph's (448 px), decoded then
    cropped and fused."""
    started = datetime.datetime.now(datetime.UTC)
    training, alone = run_input(settings, write)
    height, _, channels = input_spec_of(settings).feature_shape
    write("timing JPEG decoding alone, one image at a time")
    decode = decode_costs((JPEG_SCALE * height, PHOTO_SIDE), channels)
    report = input_report(training, alone) + "\n\n" + decode_report(decode)
    return heading(describe_run(settings, {}, started)) + "\n\n" + report
