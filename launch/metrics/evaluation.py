"""Evaluation series: each `towers eval` result as gauges, towers_eval_<key>.

`record_eval(exporter, result, ...)` publishes one result; with no exporter (not
serving) it does nothing. Gauges are made on first sight of a key, so a model's
own metrics (towers_eval_accuracy, ...) need no list kept here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import Gauge

from launch.config import SessionConfig
from launch.metrics.exporter import Exporter, metric_name, set_towers
from launch.metrics.gpu import GpuCollector, process_gpus

__all__ = ["EvalMetrics", "record_eval"]


class EvalMetrics:
    """The evaluator's results as gauges: towers_eval_loss, towers_eval_<metric>, ..."""

    _FIXED = {
        "global_step": "Global step of the checkpoint last evaluated",
        "examples_per_sec": "Examples/sec of the last evaluation",
        "examples": "Examples the last evaluation scored",
    }

    def __init__(self, exporter: Exporter, num_towers: int, gpus: GpuCollector | None = None):
        self._exporter = exporter
        self._gauges: dict[str, Gauge] = {}
        self._gpus = gpus
        set_towers(exporter, num_towers)
        self._finished = exporter.gauge(
            "towers_eval_last_timestamp_seconds", "Unix time the last evaluation finished")

    def record(self, result: Mapping[str, object]) -> None:
        """Gauges from one `towers eval` result: global_step, loss, metrics, examples scored
        and examples/sec."""
        for key, value in result.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            self._gauge(key).set(float(value))
        self._finished.set(time.time())
        if self._gpus is not None:
            self._gpus.enable()  # a session has run: the GPUs have their allocators

    def _gauge(self, key: str) -> Gauge:
        if key not in self._gauges:
            name = "towers_eval_examples_per_second" if key == "examples_per_sec" else (
                metric_name("towers_eval_", key))
            help_text = self._FIXED.get(key, f"Evaluation {key} of the last checkpoint")
            self._gauges[key] = self._exporter.gauge(name, help_text)
        return self._gauges[key]


def record_eval(
    exporter: Exporter | None, result: Mapping[str, object], num_towers: int,
    session: SessionConfig,
) -> None:
    """Publish one evaluation result; does nothing when not serving (exporter None)."""
    if exporter is None:
        return
    gpus = process_gpus(exporter, session)
    exporter.part("eval", lambda: EvalMetrics(exporter, num_towers, gpus)).record(result)
