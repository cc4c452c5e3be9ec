"""`towers timeline merge`: its options and what it runs (launch/runtime/timeline.py
writes and merges the files; this module keeps TensorFlow out of the CLI's start-up)."""

from __future__ import annotations

import argparse
import json
import sys

from launch.errors import EXIT_BAD_INPUT, EXIT_OK
from launch.log import log


def add_parser(commands) -> None:
    """`towers timeline merge`, on the CLI's command parsers."""
    tools = commands.add_parser("timeline", help="train.timeline files").add_subparsers(
        dest="timeline_command", metavar="TOOL", required=True)
    merge = tools.add_parser(
        "merge", help="join the timelines of a job's tasks into one file",
        description="Join the Chrome trace-event files that train.timeline wrote in each\n"
        "task of a ps/worker or Horovod job (tl.worker0.json, tl.rank1.json, ...) into\n"
        "one, a process row each, on their shared wall clock. Open it in\n"
        "https://ui.perfetto.dev or chrome://tracing. local-cluster merges its own.",
        epilog="example:\n  towers timeline merge runs/tl.*.json --out runs/job-timeline.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    merge.add_argument("inputs", nargs="+", metavar="FILE", help="the tasks' timeline files")
    merge.add_argument("--out", required=True, metavar="FILE", help="the merged file")
    merge.set_defaults(config=None, overrides=[])


def run(args, job) -> int:
    """Merge the files `args` name (the job is not used)."""
    from launch.runtime.timeline import merge

    for path in args.inputs:
        try:
            with open(path) as f:
                json.load(f)["traceEvents"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            # One line of its own: the job (which this command does not use) is no part of it.
            print(f"towers: error: {path} is not a timeline file ({err}); give the files "
                  "train.timeline wrote", file=sys.stderr)
            return EXIT_BAD_INPUT
    events = merge(args.inputs, args.out)
    log(f"{len(args.inputs)} timeline(s), {events} events, merged into {args.out}")
    return EXIT_OK
