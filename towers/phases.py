"""Which phase of a training step an op of the graph belongs to, from its name and type.

The graph's name scopes are this package's (`tower_i`, `aggregate`, `all_reduce`, ...),
so the rule that reads them back lives beside the code that makes them. A step's wall
time splits into four phases:

    input     waiting for the next batch (the iterator's get-next, splitting the batch)
    compute   forward and backward on the towers
    exchange  moving gradients and variables: aggregation on the parameter device,
              all-reduce between towers, sends and receives (ps tasks), Horovod's
              all-reduce, the synchronous-replica accumulators and token queue
    apply     the optimizer's update, clipping, the finite check, the global step
"""

from __future__ import annotations

import re

PHASES = ("input", "compute", "exchange", "apply")

# Op types that move data between devices or processes, or wait for peers to do so.
_EXCHANGE_TYPES = re.compile(
    r"^_?(Recv|Send|HostRecv|HostSend|RecvTensor)$|Horovod|Nccl|Accumulator|QueueDequeue"
    r"|QueueEnqueue|CollectiveReduce|CollectiveGather"
)
_INPUT_TYPES = re.compile(r"Iterator|^MakeIterator$")
# First name components of scopes this package (and launch's input pipeline) makes.
_INPUT_SCOPES = {"input", "input_batch", "split_batch", "example_weights"}
_EXCHANGE_SCOPES = re.compile(
    r"^(aggregate|all_reduce|send|receive|horovod_all_reduce|job_wide_outputs|combine_towers"
    r"|sync_replicas|sync_token_q|token_queue)(_\d+)?$"
)
_TOWER = re.compile(r"^tower_\d+$")
# Optimizer-side plumbing TensorFlow adds outside any scope ("ConstantFolding/tower_0/..").
_GRAPPLER_PREFIXES = ("ConstantFolding/", "ArithmeticOptimizer/", "LayoutOptimizer/")
# XLA's compiled clusters, as a step runs them ("cluster_3_1/xla_run", their compile,
# merge and switch ops): names of TensorFlow's, not of any scope. Only towers' own
# XLA scope (builder.py, xla=True) makes them, around each tower's forward and backward.
_XLA_CLUSTER = re.compile(r"^cluster_\d+(_\d+)?$")
# Variable reads outside the towers: the towers' pull of the variables (from a ps task
# or the parameter device).
_READ_TYPES = {"Identity", "ReadVariableOp", "VarHandleOp", "VariableV2"}


def step_phase(node_name: str, op_type: str = "") -> str:
    """The phase (one of PHASES) of the op `node_name` of type `op_type` in a step.

    Names are the graph's, as TensorFlow's step statistics report them; an op this
    package did not scope (an optimizer's update, the global step) is `apply`.
    """
    if _EXCHANGE_TYPES.search(op_type):
        return "exchange"
    if _INPUT_TYPES.search(op_type):
        return "input"
    for prefix in _GRAPPLER_PREFIXES:
        if node_name.startswith(prefix):
            node_name = node_name[len(prefix):]
    parts = node_name.split("/")
    first = parts[0]
    if first in _INPUT_SCOPES:
        return "input"
    if _TOWER.match(first) or first.startswith("micro_batch_"):
        return "exchange" if any(_EXCHANGE_SCOPES.match(p) for p in parts[1:]) else "compute"
    if _XLA_CLUSTER.match(first):
        return "compute"
    if _EXCHANGE_SCOPES.match(first):
        return "exchange"
    if op_type in _READ_TYPES and len(parts) > 1:
        return "exchange"
    return "apply"
