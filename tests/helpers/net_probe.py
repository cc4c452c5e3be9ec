"""What a host that is not in a ps/worker job can do to it: run on an outsider test host.

    python net_probe.py GO_FILE PS_ADDRESS NAME=HOST:PORT ...

Imports TensorFlow, then waits (at most two minutes) for GO_FILE, which the test
writes once every target has said it serves, then prints one JSON object: for each
NAME, whether HOST:PORT "accepts", is "refused" or "unreachable"; and what the ps
gave a session the outsider opened on it, with no credentials, to read the job's
global step ("global_step": the value, or null with "errors": what TensorFlow said
while the variable was not yet initialised).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time


def reach(address: str) -> str:
    host, _, port = address.rpartition(":")
    with socket.socket() as sock:
        sock.settimeout(2.0)
        code = sock.connect_ex((host, int(port)))
    if code == 0:
        return "accepts"
    return "refused" if code == errno.ECONNREFUSED else "unreachable"


def read_global_step(ps: str, deadline: float) -> tuple[int | None, list[str]]:
    """The ps task's `global_step`, through a session of our own on its gRPC server."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    errors: list[str] = []
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            handle = tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[], shared_name="global_step")
            value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int64)
        options = tf.compat.v1.RunOptions(timeout_in_ms=5000)
        while time.monotonic() < deadline:
            try:
                with tf.compat.v1.Session(f"grpc://{ps}") as sess:
                    return int(sess.run(value, options=options)), errors
            except tf.errors.OpError as err:
                errors.append(type(err).__name__)
                time.sleep(0.2)
    return None, errors


def main(argv: list[str]) -> int:
    import tensorflow  # noqa: F401  (first, so the probe is ready when the job starts)

    go, ps, targets = argv[0], argv[1], dict(t.split("=", 1) for t in argv[2:])
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.2)
    found = {name: reach(address) for name, address in targets.items()}
    step, errors = read_global_step(ps, deadline)
    print(json.dumps({"reach": found, "global_step": step, "errors": sorted(set(errors))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
