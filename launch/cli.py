"""The `towers` command: parse the arguments, load the job once, run the command's handler.

Commands: train, eval, validate, devices, ps, worker, evaluator, local-cluster,
export, bench, tune, verify, data convert. `towers bench`, `towers tune` and
`towers verify` are packages of their own, each defining its options and handler
(add_arguments and run); the other commands' options and handlers are here.

Exit status: 0 done; 1 an internal error (a bug: the traceback is shown);
2 bad input (job file, flags, data, devices, checkpoint directory, ports), one
line on stderr and nothing written; 3 diverged (a non-finite loss or gradient,
never applied; the latest checkpoint holds the last good weights); 4 a resource
failed mid-run (a checkpoint could not be written; the previous one is intact);
5 out of memory (one line: the device, the batch per tower, what to change);
6 `towers verify` failed: the towers differ from one device beyond a tolerance;
138 a peer task of a ps/worker job could not be reached in time (retryable:
restart the task).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from contextlib import nullcontext

from launch import bench, cli_arrangement, startup, tune, verify
from launch import cli_data as data_command
from launch import cli_timeline as timeline_command
from launch.cli_help import (
    EPILOG_BENCH,
    EPILOG_CONVERT,
    EPILOG_DEVICES,
    EPILOG_EVAL,
    EPILOG_EXPORT,
    EPILOG_LOCAL_CLUSTER,
    EPILOG_ROLES,
    EPILOG_TRAIN,
    EPILOG_TUNE,
    EPILOG_VALIDATE,
    EPILOG_VERIFY,
)
from launch.errors import EXIT_BAD_INPUT, EXIT_OK, BadInput, TowersError
from launch.log import log, quiet_tensorflow, use_graph_mode
from launch.runtime.before_start import StoppedBeforeStart, stops_before_start
from launch.runtime.signals import work_done


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ps-hosts", metavar="H:P,...", help="comma-separated ps addresses")
    parser.add_argument(
        "--worker-hosts",
        metavar="H:P,...",
        help="comma-separated worker addresses (worker 0 is chief)",
    )
    parser.add_argument(
        "--job-name",
        choices=["ps", "worker", "chief", "evaluator"],
        help="this task's job (default: the command's)",
    )
    parser.add_argument("--task-index", type=int, metavar="I", help="this task's index in its job")


def _job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", metavar="JOB.yaml", help="job file (default: the built-in default job)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a job key, e.g. train.steps=100 (repeatable; YAML values)",
    )


def _job_command(commands, name: str, text: str, epilog: str) -> argparse.ArgumentParser:
    """A subcommand that takes a job (-c, --set), with its examples shown as written."""
    parser = commands.add_parser(
        name, help=text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _job_args(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="towers",
        description="Data-parallel tower training for TensorFlow: one tower per device, "
        "shared variables, one update per global batch.",
        epilog="Run 'towers COMMAND --help' for each command's options and examples.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _train_parser(commands)
    _eval_parser(commands)
    _job_command(commands, "validate", "make train's start-up checks, print the resolved job",
                 EPILOG_VALIDATE)
    _job_command(commands, "devices", "list GPUs, CPU and the CUDA id mapping", EPILOG_DEVICES)
    for role, text in [
        ("ps", "serve variables for a ps/worker job until it ends"),
        ("worker", "train as one worker of a ps/worker job (or of one without ps tasks)"),
        ("evaluator", "evaluate a ps/worker job's checkpoints as they appear"),
    ]:
        _cluster_args(_job_command(commands, role, text, EPILOG_ROLES))
    _local_cluster_parser(commands)
    _export_parser(commands)
    bench.add_arguments(_job_command(commands, "bench",
                                     "compare throughput and memory across modes", EPILOG_BENCH))
    tune.add_arguments(_job_command(commands, "tune",
                                    "find the fastest settings for the job on this machine",
                                    EPILOG_TUNE))
    verify.add_arguments(_job_command(commands, "verify",
                                      "check that the job's towers train as one device",
                                      EPILOG_VERIFY))
    _data_parser(commands)
    timeline_command.add_parser(commands)
    return parser


def _train_parser(commands) -> None:
    train = _job_command(commands, "train", "train a job (default: the built-in job)", EPILOG_TRAIN)
    train.add_argument(
        "--backend",
        choices=["horovod"],
        help="horovod: run as one rank of a horovodrun job "
        "(the same as --set cluster.backend=horovod)",
    )


def _eval_parser(commands) -> None:
    evaluate = _job_command(
        commands, "eval", "evaluate a checkpoint, or watch for new ones", EPILOG_EVAL
    )
    which = evaluate.add_mutually_exclusive_group()
    which.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="checkpoint prefix or directory (default: train.checkpoint_dir)",
    )
    which.add_argument(
        "--watch",
        action="store_true",
        help="evaluate every new checkpoint until the one at train.steps",
    )
    evaluate.add_argument(
        "--predictions",
        metavar="FILE.npy",
        help="also write the model's predictions, one row per example scored in the "
        "data's order (one checkpoint)",
    )
    evaluate.add_argument(
        "--averages",
        action="store_true",
        help="score the weight averages a job with train.moving_average_decay keeps, "
        "instead of the weights",
    )
    evaluate.add_argument(
        "--timeout",
        type=float,
        metavar="SECS",
        help="with --watch: give up after SECS without a new checkpoint",
    )


def _local_cluster_parser(commands) -> None:
    local = _job_command(
        commands, "local-cluster", "run a whole ps/worker job on this host", EPILOG_LOCAL_CLUSTER
    )
    local.add_argument(
        "--ps", type=int, default=1, metavar="N",
        help="ps tasks (default 1; 0: the workers keep the variables and all-reduce "
        "their gradients with TensorFlow's collective ops)")
    local.add_argument(
        "--workers", type=int, default=2, metavar="N", help="worker tasks (default 2)"
    )
    local.add_argument("--evaluator", action="store_true", help="also run an evaluator")
    local.add_argument(
        "--metrics-targets",
        metavar="PATH",
        help="Prometheus file_sd JSON listing every task's metrics endpoint "
        "(default: <train.checkpoint_dir>/prometheus_targets.json)",
    )


def _export_parser(commands) -> None:
    export = _job_command(
        commands, "export", "write a SavedModel for serving from a checkpoint", EPILOG_EXPORT
    )
    export.add_argument("--out", required=True, metavar="DIR",
                        help="the SavedModel directory to write (must not exist)")
    export.add_argument("--checkpoint", metavar="PATH",
                        help="checkpoint prefix or directory (default: train.checkpoint_dir)")
    export.add_argument("--averages", action="store_true",
                        help="serve the weight averages a job with "
                        "train.moving_average_decay keeps, instead of the weights")


def _data_parser(commands) -> None:
    data = commands.add_parser("data", help="data tools").add_subparsers(
        dest="data_command", metavar="TOOL", required=True
    )
    convert = _job_command(
        data, "convert", "write images, MNIST, CIFAR-10, text or a job's npz/csv data as "
        "sharded TFRecords", EPILOG_CONVERT
    )
    data_command.add_arguments(convert)


# Commands whose own process needs no TensorFlow: local-cluster starts the job's tasks,
# each of which checks the model as it loads (an import of TensorFlow and the model
# here, 2-4 s, would only repeat that).
WITHOUT_TENSORFLOW = ("local-cluster",)


def _load(args):
    from launch.config import load_job

    needs = args.command not in WITHOUT_TENSORFLOW
    return load_job(args.config, args.overrides,
                    arrangement=lambda job: cli_arrangement.choose(args, job),
                    check_model=_check_model if needs else None)


def _check_model(model) -> None:
    """Resolve the model, the first step of loading a job that needs TensorFlow."""
    _start_tensorflow()
    from launch import modelref

    modelref.check(model)


def _start_tensorflow() -> None:
    """TensorFlow as every command takes it: imported quietly, in graph mode. Every
    command resolves the job's model, whose code is written for graph mode (it may build
    ops as it is imported), so each switches before resolving it, whether or not it
    goes on to build a graph itself."""
    startup.mark_once("modules")
    quiet_tensorflow()
    use_graph_mode()
    startup.mark_once("tensorflow")


def _print_json(result: dict) -> None:
    print(json.dumps(result, sort_keys=True), flush=True)


def _serving(job, job_name: str):
    """This process's metrics exporter, serving for a with block (None when off)."""
    from launch import metrics

    return metrics.serve(job.metrics, metrics.Identity(job_name, 0, job.run.name), log)


def _eval(args, job) -> int:
    from launch.runtime.evaluate import evaluate

    if args.predictions and args.watch:
        raise BadInput("--predictions: scores one checkpoint; leave out --watch")
    with _serving(job, "eval") as exporter:
        _print_json(evaluate(job, args.checkpoint, args.watch, args.timeout, exporter=exporter,
                             predictions=args.predictions, averages=args.averages))
    return EXIT_OK


def _evaluator(args, job) -> int:
    """It only reads the chief's checkpoints, so it needs no cluster; it watches until
    the checkpoint at train.steps appears, however long training takes."""
    from launch.runtime.evaluate import evaluate

    with _serving(job, "eval") as exporter:
        _print_json(evaluate(job, watch=True, exporter=exporter))
    return EXIT_OK


def _run_arranged(args, job) -> int:
    """This process's part of the job, as its arrangement runs it: one process or one
    Horovod rank (`train`), a ps or worker task (`ps`, `worker`, or `train` under a
    launcher)."""
    from launch.distributed.arrangements import arrangement

    _print_json(arrangement(args.arrangement).run(job, args.task))
    return EXIT_OK


def _validate(args, job) -> int:
    """Every start-up check `train` makes (so exit 0 means `train` starts), then the
    resolved job as YAML after comment lines saying what the model resolved to."""
    from launch import modelref
    from launch.config import derived_comments, dump_yaml
    from launch.runtime.preflight import check_startup

    plan = check_startup(job)
    model = modelref.resolve(job.model)  # as the job names it: its own spec, if it declares one
    sys.stdout.write(modelref.describe(model, plan.model.input_spec) + dump_yaml(job)
                     + derived_comments(job))
    return EXIT_OK


def _export(args, job) -> int:
    from launch.runtime.export import export

    _print_json(export(job, args.out, args.checkpoint, averages=args.averages))
    return EXIT_OK


def _devices(args, job) -> int:
    from launch.devices import describe

    print(describe(job.session))
    return EXIT_OK


def _local_cluster(args, job) -> int:
    from launch.distributed.local_cluster import run_local_cluster

    return run_local_cluster(
        job, args.config, args.overrides, args.ps, args.workers, args.evaluator,
        args.metrics_targets,
    )


# Each command's handler: (parsed args, the loaded job) -> exit status.
HANDLERS = {
    "train": _run_arranged,
    "eval": _eval,
    "devices": _devices,
    "ps": _run_arranged,
    "worker": _run_arranged,
    "evaluator": _evaluator,
    "local-cluster": _local_cluster,
    "bench": bench.run,
    "tune": tune.run,
    "verify": verify.run,
    "data": data_command.run,
    "export": _export,
    "validate": _validate,
    "timeline": timeline_command.run,
}


def _run(args) -> int:
    if getattr(args, "backend", None) == "horovod":
        args.overrides.append("cluster.backend=horovod")
    # A job file's mistakes are found before TensorFlow is imported (seconds of a
    # process's start-up), so they are reported at once.
    job = _load(args)
    if args.command not in WITHOUT_TENSORFLOW:
        _start_tensorflow()
    return HANDLERS[args.command](args, job)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "shards", 1) < 1:
        print("towers: error: --shards must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    source = args.config or "<built-in job>"
    work_done(False)
    # local-cluster forwards signals itself.
    stop = stops_before_start() if args.command != "local-cluster" else nullcontext()
    try:
        with stop:
            return _run(args)
    except StoppedBeforeStart as stopped:
        print(f"towers: received {stopped} before training started; stopping", file=sys.stderr)
        return EXIT_OK
    except BadInput as err:
        if getattr(err, "details", None):  # the user's model code raised: their frames
            sys.stderr.write(err.details)
        message = str(err)
        if not message.startswith(source) and not message.startswith("--set"):
            message = f"{source}: {message}"
        print(f"towers: error: {message}", file=sys.stderr)
        return err.exit_status
    except TowersError as err:  # diverged, a resource failed, a peer unavailable
        print(f"towers: error: {err}", file=sys.stderr)
        return err.exit_status

if __name__ == "__main__":
    sys.exit(main())
