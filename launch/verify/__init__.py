"""`towers verify`: does this job's model train on its towers as on one device?

    towers verify -c job.yaml [--steps 5] [--rtol 1e-9] [--floor-factor 10]

It trains the job's model, as `towers train` builds its step, for --steps steps on the
job's first batches three times, each from the same initial values (made once, then
copied), all in float64 so that rounding cannot hide a difference:

  one device   the plan's first device alone, with the job's micro-batches
               (train.accumulate_steps), as the job would run there;
  noise floor  the same one device on the same batches, each batch's examples in
               another order: how far rounding alone moves each variable;
  towers       the job's towers (towers.devices), towers.variable_update,
               train.accumulate_steps and towers.batch_norm, in this process.

It prints every saved variable's largest difference between the towers (each replica
too) and one device beside its noise floor and tolerance (launch.verify.compare), then
one line, pass or fail, naming the worst variable. Noise the model draws runs at rate
0 (launch.verify.noise); a draw it cannot silence is named and stops it.

Float64 is a mode of this command only (towers.FLOAT64): towers.precision, and what
it promises, are unchanged, and a job in 16 bits is checked in float64 all the same.
A job of several processes is checked as one of its processes' towers.

    modules: noise (rate 0, other draws found), runs (the three runs), compare (the
    table and the verdict)
"""

from __future__ import annotations

import argparse

from launch.config import JobConfig
from launch.errors import EXIT_NOT_EQUIVALENT, EXIT_OK, BadInput
from launch.log import log

DEFAULT_STEPS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `towers verify`, beside the job's own (-c, --set)."""
    from launch.verify.compare import FLOOR_FACTOR, RTOL

    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="K",
                        help=f"training steps each run takes (default {DEFAULT_STEPS})")
    parser.add_argument("--rtol", type=float, default=RTOL, metavar="R",
                        help=f"a variable passes within R x its largest |value| ... "
                        f"(default {RTOL:g})")
    parser.add_argument("--floor-factor", type=float, default=FLOOR_FACTOR, metavar="F",
                        help=f"... or within F x its noise floor, whichever is larger "
                        f"(default {FLOOR_FACTOR:g})")


def run(args: argparse.Namespace, job: JobConfig) -> int:
    """`towers verify`, as the CLI calls it: the table and the verdict on stdout; exit 0
    for pass, EXIT_NOT_EQUIVALENT for fail."""
    _check_options(args)
    from launch.verify.check import verify

    passed, lines = verify(job, args.steps, args.rtol, args.floor_factor, log)
    print("\n".join(lines), flush=True)
    return EXIT_OK if passed else EXIT_NOT_EQUIVALENT


def _check_options(args: argparse.Namespace) -> None:
    if args.steps < 1:
        raise BadInput(f"--steps: at least 1, got {args.steps}")
    if not args.rtol >= 0:
        raise BadInput(f"--rtol: 0 or more, got {args.rtol}")
    if not args.floor_factor >= 0:
        raise BadInput(f"--floor-factor: 0 or more, got {args.floor_factor}")
