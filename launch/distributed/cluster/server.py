"""The gRPC server every ps and worker task runs (how a job ends is in ending.py)."""

from __future__ import annotations

import errno
import socket

import tensorflow as tf

from launch.distributed.cluster import ClusterError, Task

V1 = tf.compat.v1


def start_server(task: Task, config: V1.ConfigProto, write) -> tf.distribute.Server:
    port = task.address.rpartition(":")[2]
    try:
        server = tf.distribute.Server(
            task.cluster_spec(), task.job_name, task.task_index, config=config, start=True
        )
    except tf.errors.UnknownError as err:  # TensorFlow says only "Could not start gRPC server"
        raise ClusterError(
            f"cluster.{task.job_name}: cannot serve {task.job_name} {task.task_index} at "
            f"{task.address}: {port_problem(int(port)) or err.message}"
        ) from None
    # TensorFlow's gRPC server listens on 0.0.0.0:<port> whatever host the cluster
    # gives (grpc_server_lib.cc); say so, since we cannot narrow it.
    write(
        f"{task.job_name} {task.task_index} serving {task.address}"
        f"{' (chief)' if task.is_chief else ''}; note: TensorFlow listens on port "
        f"{port} of every interface, so firewall it to the cluster"
    )
    return server


def port_problem(port: int) -> str | None:
    """Why this process cannot listen on `port` of every interface (as TensorFlow does)."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return f"port {port} is already in use by another process"
            return f"port {port}: {err.strerror}"
    return None
