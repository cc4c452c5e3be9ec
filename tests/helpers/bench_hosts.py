"""Synchronous 2-worker jobs across test hosts (network namespaces, net_hosts.py here):
1 ps + 2 workers against 2 workers without ps tasks (collective all-reduce), each with
gradients packed and unpacked, in interleaved rounds. Needs root.

    sudo python tests/helpers/bench_hosts.py --model resnet20 --rounds 3

Every task runs on a host of its own and reaches the others through a veth pair and a
bridge, as separate machines do (on this machine's cores: the network path differs
from 127.0.0.1, the compute does not). A run takes `--steps` steps after as many
warm-up steps; its rate is the job's examples/sec over the last `--steps` (worker 0's
for the collective job, whose workers step together; the sum of the workers' for
ps/worker). Prints one line per run and the medians (min-max) as a Markdown table.
Every process is stopped by pid and every namespace, veth and bridge removed at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# The repository first (tests/launch would shadow the package), then tests/ for its helpers.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:1] = [os.path.dirname(TESTS), TESTS]

from helpers.net_hosts import HostJob, TestNetwork, why_unavailable  # noqa: E402

MODES = {"ps_worker": 1, "collective": 0}  # mode: ps tasks


def job_args(model: str, batch: int, steps: int, pack_bytes: int, ckpt: Path) -> list[str]:
    values = {"model.name": model, "data.source": "synthetic", "train.batch_size": batch,
              "train.steps": 2 * steps, "train.log_every_steps": steps,
              "train.summary_every_steps": 10**9, "train.checkpoint_every_steps": 10**9,
              "train.checkpoint_dir": str(ckpt), "towers.devices": 1, "train.sync": True,
              "towers.pack_gradients_bytes": pack_bytes, "optimizer.name": "momentum",
              "optimizer.momentum": 0.9, "optimizer.learning_rate": 0.01}
    return [a for key, value in values.items() for a in ("--set", f"{key}={json.dumps(value)}")]


def rate(job: HostJob) -> float:
    """The job's examples/sec, as the chief's JSON result reports it."""
    return json.loads(job.tasks["worker0"].stdout.strip().splitlines()[-1])[
        "job_examples_per_sec"]


def run_once(network: TestNetwork, tmp: Path, label: str, mode: str, args: list[str]) -> float:
    job = HostJob(network, tmp, label, args, workers=2, ps=MODES[mode])
    try:
        job.start_all()
        codes = job.codes(timeout=600)
        if set(codes.values()) != {0}:
            failed = next(name for name, code in codes.items() if code)
            raise RuntimeError(f"{label}: {codes}\n{job.tasks[failed].stderr[-2000:]}")
        return rate(job)
    finally:
        job.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pack-bytes", default="0,4194304")
    args = parser.parse_args()
    reason = why_unavailable()
    if reason:
        print(f"bench_hosts: {reason}", file=sys.stderr)
        return 2
    packs = [int(b) for b in args.pack_bytes.split(",")]
    rows = list(itertools.product(MODES, packs))
    rates: dict[tuple[str, int], list[float]] = {row: [] for row in rows}
    network = TestNetwork.create()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
            for round_, (mode, pack) in itertools.product(range(args.rounds), rows):
                label = f"r{round_}-{mode}-{pack}"
                ckpt = Path(tmp) / label
                value = run_once(network, Path(tmp), label, mode,
                                 job_args(args.model, args.batch, args.steps, pack, ckpt))
                rates[(mode, pack)].append(value)
                print(f"{label}: {value:.1f} examples/sec "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        network.close()
    print(f"\n| {args.model} | " + " | ".join(f"{m}, pack {p}" for m, p in rows) + " |")
    print("| --- " * (len(rows) + 1) + "|")
    print("| examples/sec | " + " | ".join(
        f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for v in rates.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
