"""`towers verify` on small models, through the command's own main() in this process.

A model that trains on towers as on one device passes, every variable within its
tolerance, in every way a job splits its step (replicated copies, micro-batches,
synchronized batch norm on an uneven batch); one made wrong on purpose (its weight
decay counted once per tower) fails with exit 6 and the verdict naming the variable
the mistake reaches; Keras' Dropout runs at rate 0 and says so; a random draw verify
cannot set to rate 0 stops it, named, and so does a float32 value the model makes
itself (float64 features meet it). The tolerance rule and the measure of rounding's
growth are checked on given values.
"""

import os
import re

import numpy as np
import pytest
from helpers.commands import run_in_process

MODELS = os.path.join(os.path.dirname(__file__), "models")


def verify(model: str, *settings: str):
    """`towers verify` of model `small:<model>` on 2 CPU towers, its batches generated."""
    args = ["verify", "--set", f"model.name=small:{model}", "--set", f"model.path={MODELS}",
            "--set", "data.source=builtin", "--set", "data.num_examples=64",
            "--set", "towers.devices=2", "--set", "train.batch_size=11"]
    for setting in settings:
        args += ["--set", setting] if "=" in setting else [setting]
    return run_in_process(*args)


def table(stdout: str) -> dict[str, list[float]]:
    """The printed rows: variable -> [max|w|, moved, difference, noise floor, tolerance]."""
    rows = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 6 and re.fullmatch(r"-?\d\.\d\de[+-]\d\d", fields[1]):
            rows[fields[0]] = [float(f) for f in fields[1:6]]
    return rows


def test_a_model_that_trains_as_one_device_passes_in_every_way_a_job_splits_its_step():
    result = verify("model_fn", "towers.variable_update=replicated",
                    "train.accumulate_steps=2", "towers.batch_norm=sync")
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("pass: 2 towers against one device after 5 steps"), verdict
    rows = table(result.stdout)
    trained = ["dense1/kernel", "dense2/kernel", "bn/gamma", "bn/beta", "bn/moving_mean"]
    slots = [f"{name}/Momentum" for name in trained if "moving" not in name]
    assert sorted(rows) == sorted([*trained, *slots, "global_step"])
    for name, (scale, moved, difference, floor, tolerance) in rows.items():
        assert moved > 0, f"{name} never changed: its agreement would show nothing"
        # The floor is rounding's, not another step's (reordered within micro-batches).
        assert floor <= 1e-12 * scale, name
        assert tolerance == pytest.approx(max(1e-9 * scale, 10 * floor), rel=0.01), name
        assert difference <= tolerance, name
    assert "unchanged by the steps" not in result.stdout
    assert any(floor > 0 for *_, floor, _ in rows.values()), "no reordering changed a thing"


def test_a_tower_dependent_term_fails_naming_the_variable_it_reaches():
    result = verify("tower_dependent", "towers.batch_norm=sync")
    assert result.returncode == 6, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[-1]
    assert re.match(r"fail: 2 towers against one device after 5 steps: dense2/kernel\S* "
                    r"differs by \S+, beyond its tolerance", verdict), verdict
    rows = table(result.stdout)
    # What the wrong decay reaches differs far beyond rounding; what comes before it
    # in the model does too, through the loss, but less.
    assert rows["dense2/kernel"][2] > 1e6 * rows["dense2/kernel"][4]


def test_keras_dropout_runs_at_rate_zero_and_a_job_of_processes_is_checked_as_one():
    result = verify("keras_with_dropout", "cluster.backend=horovod",
                    "towers.precision=mixed_bfloat16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# at rate 0 while verifying: keras Dropout (1)" in result.stdout
    assert "a job of several processes (cluster.backend: horovod) is checked as one " \
           "process's towers" in result.stderr
    assert "towers.precision is mixed_bfloat16; verify computes in float64" in result.stderr


def test_a_random_draw_it_cannot_set_to_rate_zero_stops_it_named():
    result = verify("stochastic_depth")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "random draws verify cannot set to rate 0 (tower_0/random_uniform/RandomUniform)" \
        in result.stderr
    assert result.stdout == ""


def test_a_float32_value_of_the_models_own_is_named_as_what_float64_cannot_run():
    result = verify("float32_constant")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "towers verify computes in float64: a value the model makes float32 itself" \
        in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("option, message", [
    (["--steps", "0"], "--steps: at least 1, got 0"),
    (["--rtol", "-1"], "--rtol: 0 or more, got -1.0"),
])
def test_bad_options_are_one_line(option, message):
    result = run_in_process("verify", *option)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"towers: error: <built-in job>: {message}"]


def test_the_tolerance_is_the_larger_of_the_relative_term_and_the_floors():
    from launch.verify import compare

    start = {"a": np.zeros(2), "b": np.zeros(2), "c": np.zeros(2)}
    one = {"a": np.array([1.0, -2.0]), "b": np.array([1e-3, 0.0]), "c": np.array([0.5, 0.5])}
    floor = {"a": one["a"] + 1e-9, "b": one["b"] + 1e-17, "c": one["c"] + 1e-3}
    towers = {"a": one["a"] + 5e-9, "b": one["b"] + 5e-12, "c": one["c"] + 5e-3}
    rows = {r.name: r for r in compare.rows(start, one, towers, {}, floor)}
    assert rows["a"].tolerance == pytest.approx(1e-8) and rows["a"].ok  # 10 floors
    assert rows["b"].tolerance == pytest.approx(1e-12) and not rows["b"].ok  # 1e-9 x 1e-3
    assert rows["c"].tolerance == pytest.approx(1e-2) and rows["c"].ok
    passed, line = compare.verdict(list(rows.values()), "2 towers against one device")
    assert not passed and line.startswith("fail: 2 towers against one device: b differs by ")
    # The median of floor / max|w|: 5e-10 (a), 1e-14 (b), 2e-3 (c).
    assert compare.rounding_growth(list(rows.values())) == pytest.approx(5e-10)
