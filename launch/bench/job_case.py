"""A job's own training step, built in a case process as `towers train` builds it: its
model, input pipeline, devices, precision and every other setting (`towers tune` times
one per candidate setting, `towers bench --input` one per kind of input)."""

from __future__ import annotations

from launch.bench.cases import BuiltCase
from launch.config import JobConfig


def training_step(job: JobConfig) -> BuiltCase:
    """The job's training graph (launch.runtime.training_graph, its input included) in a
    session of the job's options, initialised; run(steps) trains. facts["kernels"]: the
    step's convolutions and matrix products (launch.kernels); facts["examples_per_step"]:
    the examples one step trains on; facts["devices"]: its towers' devices."""
    import tensorflow as tf

    from launch.kernels import kernels_of, ops_run_by
    from launch.runtime.plan import make_plan
    from launch.runtime.training_graph import build_training_graph

    plan = make_plan(job)
    graph = tf.Graph()
    with graph.as_default():
        built = build_training_graph(job, plan)
        ops = built.ops
        init = tf.group(tf.compat.v1.global_variables_initializer(),
                        tf.compat.v1.local_variables_initializer(), built.input.initializer)
        micro = plan.process_batch_size // job.train.accumulate_steps
        facts = {"kernels": kernels_of(ops_run_by(ops.train_op), -(-micro // len(plan.devices))),
                 "examples_per_step": plan.job_examples_per_step, "devices": plan.devices}
    session = tf.compat.v1.Session(graph=graph, config=plan.session)
    session.run(init)
    session.run(ops.sync_op)

    def run(steps: int) -> None:
        for _ in range(steps):
            session.run(ops.train_op)

    return BuiltCase(run, facts, dict, lambda values: None)


def build_job_case(spec: dict) -> BuiltCase:
    """The step of the job file spec["config"] (None: the built-in job) with the --set
    overrides spec["overrides"]."""
    from launch.config import load_job

    return training_step(load_job(spec["config"], spec["overrides"]))
