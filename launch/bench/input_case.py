"""One row of `towers bench --input`, built in its case process: the training job's own
graph fed by one kind of input, or that input alone on one thread."""

from __future__ import annotations

import dataclasses

from launch.bench.cases import BuiltCase
from launch.bench.job_case import training_step
from launch.config import JobConfig, from_dict


def _job(spec: dict, pipeline_only: bool) -> JobConfig:
    """The job of the row `spec` describes: its model, input, devices and global batch."""
    data = {**spec.get("data_options", {}), **spec["data"]}
    if pipeline_only:
        data.update(num_parallel_calls=1, threads=1, prefetch=1)
    job = from_dict({"model": {"name": spec["model"], **spec["params"]}, "data": data,
                     "towers": {"devices": spec["devices"]},
                     "train": {"batch_size": spec["batch"]}})
    # Where the model's code is found, as the job that ran the bench found it.
    model = dataclasses.replace(job.model, path=spec.get("model_path"),
                                job_dir=spec.get("job_dir"))
    return dataclasses.replace(job, model=model)


def build_input_case(spec: dict) -> BuiltCase:
    """One row in this (graph-mode) process: the job's training graph fed by its input
    (``spec['data']``), or with ``spec['pipeline_only']`` the input alone on one thread."""
    job = _job(spec, spec["pipeline_only"])
    if not spec["pipeline_only"]:
        return training_step(job)
    import tensorflow as tf

    from launch.runtime.inputs import training_input
    from launch.runtime.plan import make_plan

    plan = make_plan(job)
    graph = tf.Graph()
    with graph.as_default():
        feed = training_input(plan, job.train.batch_size)
        batch = feed.features
    session = tf.compat.v1.Session(graph=graph, config=plan.session)
    session.run(feed.initializer)

    def run(steps: int) -> None:
        for _ in range(steps):
            session.run(batch)

    return BuiltCase(run, {}, dict, lambda values: None)
