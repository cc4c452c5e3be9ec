"""Data-parallel tower training: split a batch across devices, share variables, one update.

    ops = towers.build_train_op(model_fn, features, labels, optimizer, ["/gpu:0", "/gpu:1"])

Pure graph construction: no sessions, files, flags or servers in this package.
This module is the package's whole public surface; callers import nothing deeper.
"""

from towers.averages import AVERAGE_NAME, average_names
from towers.batch_stats import BATCH_NORMS, CrossTowerSums
from towers.batch_stats import moments as batch_moments
from towers.collectives import CollectiveGroup, broadcast_variables, weighted_all_reduce
from towers.context import Features, ModelFn, TowerContext, TowerOutputs, as_tower_outputs
from towers.custom_gradient import custom_gradient
from towers.example_random import example_seed, example_uniform
from towers.gradients import ALL_REDUCE, all_reduce_method
from towers.loss_scale import DynamicLossScale
from towers.nonfinite import NONFINITE_GRADIENT, NONFINITE_LOSS, NONFINITE_POLICIES
from towers.packing import pack_groups, packed
from towers.phases import PHASES as STEP_PHASES
from towers.phases import step_phase
from towers.placement import DeviceFn, GreedyByteBalancer, device_type, least_loaded
from towers.precision import FLOAT64, GRADIENT_DTYPES, PRECISIONS, Precision
from towers.replica_copies import REPLICA_COPIES
from towers.split import batch_shortfall, shard_sizes, split_batch
from towers.train_op import EvalOps, TrainOps, build_eval_ops, build_train_op
from towers.variable_update import (
    VARIABLE_UPDATES,
    CrossProcess,
    GradientsFn,
    ParameterServer,
    Replicated,
    VariableUpdate,
    resolve_variable_update,
)

__all__ = [
    "ALL_REDUCE",
    "AVERAGE_NAME",
    "BATCH_NORMS",
    "FLOAT64",
    "GRADIENT_DTYPES",
    "NONFINITE_GRADIENT",
    "NONFINITE_LOSS",
    "NONFINITE_POLICIES",
    "PRECISIONS",
    "REPLICA_COPIES",
    "STEP_PHASES",
    "VARIABLE_UPDATES",
    "CollectiveGroup",
    "CrossProcess",
    "CrossTowerSums",
    "DeviceFn",
    "DynamicLossScale",
    "EvalOps",
    "Features",
    "GradientsFn",
    "GreedyByteBalancer",
    "ModelFn",
    "ParameterServer",
    "Precision",
    "Replicated",
    "TowerContext",
    "TowerOutputs",
    "TrainOps",
    "VariableUpdate",
    "all_reduce_method",
    "as_tower_outputs",
    "average_names",
    "batch_moments",
    "batch_shortfall",
    "broadcast_variables",
    "build_eval_ops",
    "build_train_op",
    "custom_gradient",
    "device_type",
    "example_seed",
    "example_uniform",
    "least_loaded",
    "pack_groups",
    "packed",
    "resolve_variable_update",
    "shard_sizes",
    "split_batch",
    "weighted_all_reduce",
    "step_phase",
]
