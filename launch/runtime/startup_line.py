"""The start-up line of `towers train`: the model, its towers, where its variables live and
what its step computes."""

from __future__ import annotations

from launch.config import JobConfig
from launch.runtime.optim import batch_scale
from launch.runtime.plan import Plan


def startup_line(job: JobConfig, plan: Plan, synchronized: int) -> str:
    """'model resnet20 on 2 tower(s) /cpu:0, /cpu:1; variables on /cpu:0 (shared); float32':
    the first line of a training process. synchronized: how many batch norms the build
    synchronized across the towers."""
    where = "the ps tasks" if plan.variables_on_ps else plan.param_device
    return (
        f"model {plan.model.name} on {len(plan.devices)} tower(s) {', '.join(plan.devices)}; "
        f"variables on {where} ({plan.sharing}); {compute_text(job, plan, synchronized)}"
    )


def compute_text(job: JobConfig, plan: Plan, synchronized: int) -> str:
    """'mixed_float16 (loss scale from 32768), gradients sent as float16, XLA, 4
    micro-batches of 64 examples per update, learning rate 0.2 (0.05 x 1024 / 256)': what
    the step computes and how."""
    parts = [job.towers.precision]
    if job.towers.precision == "mixed_float16":
        parts[0] += f" (loss scale from {job.towers.loss_scale.initial:g})"
    if job.towers.gradient_dtype != "float32":
        parts.append(f"gradients sent as {job.towers.gradient_dtype}")
    if job.towers.xla:
        parts.append("XLA")
    if job.towers.batch_norm == "sync" and synchronized:
        # Said only of what was built: nothing synchronized is a warning line already.
        parts.append(f"{synchronized} batch norm(s) synchronized over the global batch")
    if job.train.moving_average_decay is not None:
        parts.append(f"weight averages (decay {job.train.moving_average_decay:g})")
    steps = job.train.accumulate_steps
    if steps > 1:
        parts.append(f"{steps} micro-batches of {plan.process_batch_size // steps} examples "
                     "per update")
    cfg = job.optimizer
    if cfg.reference_batch_size:
        scaled = cfg.learning_rate * batch_scale(cfg, job.train.batch_size)
        parts.append(f"learning rate {scaled:g} ({cfg.learning_rate:g} x "
                     f"{job.train.batch_size} / {cfg.reference_batch_size})")
    return ", ".join(parts)
