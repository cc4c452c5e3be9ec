"""`towers data convert`: its options and what it runs.

A module of the command line rather than of launch/data: the CLI builds every
command's parser before the job file is read, and launch/data imports TensorFlow,
which would cost every command (a broken job file included) its seconds of import.
"""

from __future__ import annotations

import argparse
import json

from launch.errors import EXIT_OK
from launch.log import log


def add_arguments(convert: argparse.ArgumentParser) -> None:
    """`towers data convert`'s own options, on the parser the CLI made for it."""
    convert.add_argument("inputs", nargs="*", metavar="INPUT",
                         help="files or a folder to read (every --from but job)")
    convert.add_argument("--from", dest="source_format", default="job", metavar="FORMAT",
                         choices=["job", "images", "mnist", "cifar10", "text"],
                         help="job (the job's npz/csv data, the default), images, mnist, "
                         "cifar10 or text")
    convert.add_argument("--out", required=True, metavar="PREFIX", help="output path prefix")
    convert.add_argument(
        "--shards", type=int, default=4, metavar="N", help="number of files (default 4)"
    )
    convert.add_argument("--labels", metavar="FILE",
                         help="images: class names of an earlier conversion (PREFIX.labels)")
    convert.add_argument("--seed", type=int, default=0, metavar="N",
                         help="images: seed of the shuffled file order (default 0)")
    convert.add_argument("--vocab", metavar="FILE",
                         help="text: the vocabulary of an earlier conversion (PREFIX.vocab)")
    convert.add_argument("--min-count", type=int, default=1, metavar="N",
                         help="text: words seen fewer times become <unk> (default 1)")
    convert.add_argument("--max-vocab", type=int, metavar="N",
                         help="text: at most N words, <unk> and <eos> included")
    convert.add_argument("--num-steps", type=int, default=20, metavar="N",
                         help="text: tokens per example (default 20, lstm_lm's num_steps)")


def run(args, job) -> int:
    """Convert what `args` name (or the job's npz/csv data) and print the summary."""
    from launch.data import converters

    if args.source_format == "job":
        from launch.runtime.plan import resolve_model

        if args.inputs:
            raise converters.DataError(
                "data convert: inputs are read with --from images/mnist/cifar10/text; "
                "--from job converts the job's data.path")
        summary = converters.convert_arrays(
            job.data.source, resolve_model(job).input_spec, job.data.path, args.out, args.shards,
            label_column=job.data.label_column,
        )
    else:
        options = converters.ConvertOptions(args.labels, args.seed, args.vocab, args.min_count,
                                            args.max_vocab, args.num_steps)
        summary = converters.convert_files(args.source_format, args.inputs, args.out,
                                           args.shards, options)
    for line in summary.lines():
        log(line)
    print(json.dumps(summary.as_dict(), sort_keys=True), flush=True)
    return EXIT_OK
