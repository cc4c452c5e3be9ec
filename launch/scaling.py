"""Examples/sec of N towers against one device at the same global batch.

    python -m launch.scaling --models mlp,resnet20 --towers 1,2,4 --rounds 7
    python -m launch.scaling --cluster --models convnet --rounds 3

With --cluster: 2 in-process towers against 1 ps + 2 workers (one tower each),
async and sync, on loopback, each a whole `towers` run in a subprocess, runs
interleaved; examples/sec is the sum of the workers' last reported rates.

Synthetic inputs held in the graph (no input pipeline cost, as tf_cnn_benchmarks
does), warm-up steps discarded, and timing blocks interleaved across cases
(A B C A B C ...) so drift on a shared machine hits every case alike. Reports
the median with min and max, and each median's ratio to the 1-device median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

BATCH = {"mlp": 256, "convnet": 128, "resnet20": 64, "resnet56": 64, "lstm_lm": 64}


@dataclass
class Case:
    model: str
    towers: int
    mode: str
    session: object
    train_op: object
    batch: int
    rates: list[float]


def build_case(model_name: str, num_towers: int, mode: str, batch: int) -> Case:
    import tensorflow as tf

    import models
    import towers

    model = models.build(model_name)
    spec = model.input_spec
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        if spec.feature_dtype.is_integer:
            x = rng.integers(0, spec.num_classes, (batch, *spec.feature_shape))
        else:
            x = rng.normal(size=(batch, *spec.feature_shape))
        y = rng.integers(0, spec.num_classes, (batch, *spec.label_shape))
        features = tf.constant(x, spec.feature_dtype)
        labels = tf.constant(y, spec.label_dtype)
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9)
        devices = [f"/cpu:{i}" for i in range(num_towers)]
        ops = towers.build_train_op(
            model.model_fn, features, labels, optimizer, devices, variable_update=mode
        )
        init = tf.compat.v1.global_variables_initializer()
        graph.finalize()
    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_towers})
    session = tf.compat.v1.Session(graph=graph, config=config)
    session.run(init)
    session.run(ops.sync_op)
    return Case(model_name, num_towers, mode, session, ops.train_op, batch, [])


def time_block(case: Case, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        case.session.run(case.train_op)
    return steps * case.batch / (time.perf_counter() - start)


def measure(cases: list[Case], rounds: int, steps: int, warmup: int) -> None:
    for case in cases:
        time_block(case, warmup)
    for _ in range(rounds):
        for case in cases:
            case.rates.append(time_block(case, steps))


def report(cases: list[Case]) -> str:
    base = {c.model: statistics.median(c.rates) for c in cases if c.towers == 1}
    lines = [
        "| model | global batch | towers | mode | examples/sec median | min | max | ratio to 1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cases:
        median = statistics.median(c.rates)
        lines.append(
            f"| {c.model} | {c.batch} | {c.towers} | {c.mode} | {median:.0f} | "
            f"{min(c.rates):.0f} | {max(c.rates):.0f} | {median / base[c.model]:.3f} |"
        )
    return "\n".join(lines)


def _run_rate(args: list[str]) -> float:
    """Examples/sec of one `towers` run: the sum of the last JSON line of each worker."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "launch", *args],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    if args[0] == "train":
        return json.loads(done.stdout.strip().splitlines()[-1])["examples_per_sec"]
    rates = [
        json.loads(line.split("] ", 1)[1])["examples_per_sec"]
        for line in done.stderr.splitlines()
        if line.startswith("[worker") and line.split("] ", 1)[1].startswith("{")
    ]
    return sum(rates)


def compare_cluster(model: str, batch: int, steps: int, rounds: int) -> str:
    """2 in-process towers vs 1 ps + 2 workers, async and sync; a markdown table."""
    import tempfile

    common = [
        "--set",
        f"model.name={model}",
        "--set",
        "data.source=synthetic",
        "--set",
        f"train.batch_size={batch}",
        "--set",
        f"train.steps={steps}",
        "--set",
        f"train.log_every_steps={steps // 4}",
        "--set",
        "train.checkpoint_every_steps=1000000",
    ]
    cases = {
        "in-process, 2 towers": ["train", "--set", "towers.devices=2"],
        "1 ps + 2 workers, async": ["local-cluster", "--set", "towers.devices=1"],
        "1 ps + 2 workers, sync": [
            "local-cluster",
            "--set",
            "towers.devices=1",
            "--set",
            "train.sync=true",
        ],
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, args in cases.items():
            with tempfile.TemporaryDirectory() as ckpt:
                rates[name].append(
                    _run_rate([*args, *common, "--set", f"train.checkpoint_dir={ckpt}"])
                )
    base = statistics.median(rates["in-process, 2 towers"])
    lines = [
        "| setup | examples/sec median | min | max | ratio to in-process |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, values in rates.items():
        median = statistics.median(values)
        lines.append(
            f"| {name} | {median:.0f} | {min(values):.0f} | {max(values):.0f} | "
            f"{median / base:.3f} |"
        )
    return f"model {model}, global batch {batch}, {steps} steps per run\n\n" + "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,resnet20")
    parser.add_argument("--towers", default="1,2,4")
    parser.add_argument("--modes", default="parameter_server")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--batch", type=int, help="global batch for every model (default: per model)"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="compare in-process towers with ps/worker jobs (see above)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.cluster:
        for name in args.models.split(","):
            print(compare_cluster(name, args.batch or BATCH[name], args.steps, args.rounds))
        return
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    cases = []
    for name in args.models.split(","):
        for n in [int(t) for t in args.towers.split(",")]:
            for mode in args.modes.split(",") if n > 1 else ["parameter_server"]:
                cases.append(build_case(name, n, mode, args.batch or BATCH[name]))
    measure(cases, args.rounds, args.steps, args.warmup)
    print(report(cases))


if __name__ == "__main__":
    main()
