"""The evaluation series: each `towers eval` result's numbers as towers_eval_* gauges."""

from helpers.scrapes import families

from launch import metrics
from launch.config import MetricsConfig, SessionConfig


def eval_series(url: str) -> dict:
    """name -> (help, value) of every towers_eval_* sample."""
    return {s.name: (family.documentation, s.value) for family in families(url)
            for s in family.samples if s.name.startswith("towers_eval_")}


def test_an_eval_result_says_how_many_examples_it_scored():
    result = {"global_step": 7, "loss": 0.5, "accuracy": 0.9, "examples": 10,
              "examples_per_sec": 100.0, "checkpoint": "runs/x/model.ckpt-7",
              "note": "data.source synthetic repeats one generated batch"}
    identity = metrics.Identity("eval", 0, "r")
    with metrics.serve(MetricsConfig(port=0), identity, lambda line: None) as exporter:
        metrics.record_eval(exporter, result, 1, SessionConfig())
        found = eval_series(exporter.url)
    assert found["towers_eval_examples"] == ("Examples the last evaluation scored", 10.0)
    assert found["towers_eval_global_step"][1] == 7.0
    assert found["towers_eval_accuracy"][1] == 0.9
    assert not [name for name in found if "note" in name or "checkpoint" in name]
