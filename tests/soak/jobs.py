"""The soak's jobs: one small job per arrangement, every setting the harness needs to
start its tasks, and what an uninterrupted run of it ends at.

Every arrangement trains the same model on the same rows: the counting model
(tests/helpers/counting_model.py: the mlp, plus a variable counting, in the weights, how
often each place of an epoch's order was trained), with SGD at a power-of-two rate so
the counts are exact, and a sleep in each step so that a schedule's faults land in a
job that is training, not one spending the CPU. Its deadlines are short (the soak's own
values of the documented knobs), so a fault that outlasts them ends its tasks in
seconds, as it would in minutes with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from helpers.commands import HELPERS

# 32 global batches an epoch; powers of 2, so that the counts are exact (within a
# float32 rounding where a process's part of the batch is not a power of 2).
ROWS, BATCH, RATE = 1024, 32, 0.125
EPOCHS = 2  # a job that ends with its data: 64 steps
STEPS = 50  # a job that ends at train.steps: part way through the second epoch
STEP_DELAY_SECS = 0.1
CHECKPOINT_EVERY = 10

# The soak's values of the documented deadlines (docs/faults.md, docs/ps-worker.md).
DEADLINES = {
    "cluster.startup_timeout_secs": 60,
    "cluster.reconnect_timeout_secs": 10,
    "cluster.operation_timeout_secs": 15,
    "cluster.shutdown_grace_secs": 5,
    "train.stop_timeout_secs": 10,
    "train.stall_warning_secs": 10,
}


@dataclass(frozen=True)
class Arrangement:
    """One way of running the job, and what a schedule may do to it.

    kind: "one" (one process, `size` towers), "ps" (1 ps task and `size` workers),
    "collective" (`size` workers, no ps), "horovod" (`size` ranks under horovodrun).
    resize: the other size a schedule may restart the job with.
    settings: what this arrangement adds to the job.
    exact: an uninterrupted run is repeatable and every place is trained exactly as
    often as the steps say (no parts dropped or trained twice): the checker compares
    the variables with the reference runs' and the counts with the steps'.
    """

    name: str
    kind: str
    size: int
    resize: int
    settings: dict = field(default_factory=dict)
    exact: bool = True

    @property
    def hosts(self) -> bool:
        """Its tasks run on test hosts of their own (links a schedule can cut)."""
        return self.kind in ("ps", "collective")


ARRANGEMENTS = {a.name: a for a in [
    Arrangement("one", "one", 2, 1),
    Arrangement("sync", "ps", 2, 3, {"train.sync": "true"}),
    Arrangement("sync_backup", "ps", 3, 2, {"train.sync": "true", "train.backup_workers": 1},
                exact=False),
    Arrangement("async", "ps", 2, 3, {"train.sync": "false"}, exact=False),
    Arrangement("collective", "collective", 2, 3),
    Arrangement("horovod", "horovod", 2, 1),
]}


def write_rows(path: str) -> str:
    rng = np.random.default_rng(0)
    np.savez(path, features=rng.normal(size=(ROWS, 8)).astype(np.float32),
             labels=rng.integers(0, 2, size=ROWS))
    return path


def job_settings(arrangement: Arrangement, rows: str, checkpoint_dir: str,
                 ends_with_data: bool) -> dict:
    """The job's keys (--set KEY=VALUE) for one run of the arrangement."""
    settings = {
        "model.name": "counting_model:build", "model.path": HELPERS, "model.rows": ROWS,
        "model.mean": arrangement.name != "async",
        "model.delay_secs": STEP_DELAY_SECS, "model.input_dim": 8, "model.num_classes": 2,
        "model.hidden_units": "[8]", "data.source": "npz", "data.path": rows,
        "train.batch_size": BATCH, "optimizer.name": "sgd", "optimizer.learning_rate": RATE,
        "train.checkpoint_every_steps": CHECKPOINT_EVERY, "train.log_every_steps": 5,
        "train.max_to_keep": 3, "train.checkpoint_dir": checkpoint_dir,
        "metrics.port": "null", "session.intra_op_threads": 1, "session.inter_op_threads": 2,
        **DEADLINES, **arrangement.settings,
    }
    if ends_with_data:
        settings.update({"data.epochs": EPOCHS, "train.steps": 100000})
    else:
        settings["train.steps"] = STEPS
    if arrangement.kind != "one":
        settings["towers.devices"] = 1
    return settings


def as_args(settings: dict) -> list[str]:
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def final_step(ends_with_data: bool) -> int:
    """Where an uninterrupted run ends."""
    return EPOCHS * (ROWS // BATCH) if ends_with_data else STEPS


def count_unit(arrangement: Arrangement) -> float:
    """What one training of a place adds to its count (counting_model.py): a synchronous
    job's mean, the sum of an asynchronous worker's single tower."""
    return RATE if arrangement.name == "async" else RATE / BATCH


def backup_unit(sizes: list[int], arrangement: Arrangement) -> float:
    """The most one training of a place adds to its count with backup workers, at any of
    the sizes a schedule ran: an update is the mean of the gradients it takes (workers
    minus backups), each its worker's mean over its part weighted by its part (part x
    workers / batch). A count above this much times the steps' is a place trained more
    often than they say."""
    backups = int(arrangement.settings.get("train.backup_workers", 0))
    return max(RATE * size / (BATCH * (size - backups)) for size in sizes)


def expected_counts(step: int) -> np.ndarray:
    """How often each place of an epoch's order is trained by global steps [0, step)."""
    trained = step * BATCH
    return np.array([len(range(place, trained, ROWS)) for place in range(ROWS)], np.float64)
