"""The GPU graph, checked without a GPU: built with `/gpu:i` devices, never run.

What the documentation promises for GPU hosts, asserted on the graph every update mode,
precision and accumulation setting builds: each tower's compute on its GPU, the
variables and their updates where the mode keeps them, NCCL between GPUs in
replicated mode, the casts at the tower edges, and 16-bit heavy ops where 16 bits
were asked for.
"""

import functools
import re

import pytest
import tensorflow as tf
from helpers.tower_training import SMALL, momentum

import models
import towers

GPUS = ["/gpu:0", "/gpu:1"]
WORKER = "/job:worker/task:0"
HEAVY = {"MatMul", "BatchMatMulV2", "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}
TOWER_SCOPE = re.compile(r"^(micro_batch_\d+/)?tower_(\d+)/")


def canonical(device: str) -> str:
    return tf.DeviceSpec.from_string(device).to_string()


def ps_worker():
    """A worker of a ps/worker job with two GPUs: variables on the ps task by its
    replica_device_setter, tower gradients summed on the worker's CPU."""
    cluster = tf.train.ClusterSpec({"ps": ["ps0:2222"], "worker": ["worker0:2222"]})
    setter = tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device=WORKER, ps_strategy=towers.GreedyByteBalancer(1))
    mode = towers.ParameterServer(setter, aggregation_device=f"{WORKER}/cpu:0")
    return mode, [f"{WORKER}{gpu}" for gpu in GPUS]


MODES = {
    "parameter_server": lambda: (towers.ParameterServer("/cpu:0"), GPUS),
    "replicated": lambda: (towers.Replicated(all_reduce="nccl"), GPUS),
    # A Horovod rank with two GPUs; the stand-in reduce is what one rank alone would do.
    "cross_process": lambda: (towers.CrossProcess(lambda values: values), GPUS),
    "ps_worker": ps_worker,
}
# Where each mode keeps tower 0's variables (the ones checkpoints hold).
VARIABLE_HOME = {"parameter_server": "/cpu:0", "replicated": "/gpu:0",
                 "cross_process": "/cpu:0", "ps_worker": "/job:ps/task:0"}
COMPUTE = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}


@functools.cache
def build(mode_name, precision, accumulate_steps=2, model_name="convnet", params=()):
    """The training graph of `model_name` (params: its parameters as items) on two GPUs;
    returns (graph, devices). Built once per argument list; tests only read it.

    Two micro-batches: micro-batch 0 is what a step without accumulation builds."""
    mode, devices = MODES[mode_name]()
    graph = tf.Graph()
    with graph.as_default():
        model = models.build(model_name, dict(params) or SMALL[model_name])
        spec = model.input_spec
        x = tf.zeros([8, *spec.feature_shape], spec.feature_dtype)
        y = tf.zeros([8, *spec.label_shape], spec.label_dtype)
        # The global step beside the variables, as the launcher makes it.
        with tf.compat.v1.device(mode.variable_device(devices[0])):
            step = tf.compat.v1.train.get_or_create_global_step()
        towers.build_train_op(model.model_fn, x, y, momentum(), devices, variable_update=mode,
                              precision=precision, accumulate_steps=accumulate_steps,
                              global_step=step)
    return graph, devices


def tower_ops(graph):
    """(tower index, op) for every op built inside a tower (any micro-batch)."""
    for op in graph.get_operations():
        match = TOWER_SCOPE.match(op.name)
        if match:
            yield int(match.group(2)), op


@pytest.mark.parametrize("precision", towers.PRECISIONS)
@pytest.mark.parametrize("mode", MODES)
def test_each_towers_compute_runs_on_its_gpu(mode, precision):
    graph, devices = build(mode, precision)
    placed = {}
    for i, op in tower_ops(graph):
        # Variable reads carry no device (TensorFlow runs them beside the variable), nor do
        # the initialisers of replicated copies (colocated with theirs); the replicated
        # towers' sync check reads a flag on the CPU.
        colocated = op.colocation_groups() != [f"loc:@{op.name}".encode()]
        if (op.device == "" and colocated) or op.type == "ReadVariableOp" or (
                "/check_replicas_synced/" in op.name):
            continue
        placed.setdefault(i, set()).add(canonical(op.device))
    assert placed == {i: {canonical(d)} for i, d in enumerate(devices)}


@pytest.mark.parametrize("mode", MODES)
def test_variables_and_their_updates_live_where_the_mode_keeps_them(mode):
    graph, devices = build(mode, "mixed_bfloat16")
    with graph.as_default():
        saved = tf.compat.v1.global_variables()
        copies = tf.compat.v1.get_collection(towers.REPLICA_COPIES)
    assert {canonical(v.device) for v in saved} == {canonical(VARIABLE_HOME[mode])}
    if mode == "replicated":
        assert copies and {canonical(v.device) for v in copies} == {canonical(devices[1])}
    else:
        assert copies == []
    updates = [op for op in graph.get_operations() if op.type.startswith("ResourceApply")]
    assert len(updates) == len([v for v in saved + copies if v.trainable])
    for op in updates:
        assert canonical(op.device) == canonical(op.inputs[0].op.device), op.name


@pytest.mark.parametrize("gradient_dtype", ["float32", "float16"])
def test_replicated_towers_all_reduce_with_nccl_between_gpus(gradient_dtype):
    precision = towers.Precision("mixed_float16", gradient_dtype=gradient_dtype)
    graph, devices = build("replicated", precision, 1)
    with graph.as_default():
        trainable = tf.compat.v1.trainable_variables()
    nccl = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
    assert len(nccl) == len(devices) * len(trainable)
    assert sorted(canonical(op.device) for op in nccl) == sorted(
        canonical(d) for d in devices * len(trainable))
    assert {op.get_attr("T") for op in nccl} == {tf.as_dtype(gradient_dtype)}


def test_bfloat16_gradients_are_summed_on_one_gpu_and_sent_back_in_16_bits():
    """NCCL has no bfloat16 sum: each gradient is summed in float32 on one GPU (each
    variable's turn on the next) and its sum sent to every tower in bfloat16."""
    precision = towers.Precision("mixed_bfloat16", gradient_dtype="bfloat16")
    graph, devices = build("replicated", precision, 1)
    assert not [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
    sums = [op for op in graph.get_operations() if op.name.startswith("all_reduce")
            and op.type in ("AddN", "AddV2")]
    assert sums and {op.outputs[0].dtype for op in sums} == {tf.float32}
    assert {canonical(op.device) for op in sums} == {canonical(d) for d in devices}
    back = [op for op in graph.get_operations() if op.name.startswith("all_reduce")
            and op.type == "Cast" and op.outputs[0].dtype == tf.bfloat16]
    assert len(back) == len(sums)


def test_nccl_is_chosen_exactly_where_it_can_run():
    """NCCL's kernels exist only in a CUDA build of TensorFlow, and join GPUs only."""
    assert towers.all_reduce_method(GPUS, built_with_cuda=True) == "nccl"
    assert towers.all_reduce_method(GPUS, built_with_cuda=False) == "copy"
    assert towers.all_reduce_method(["/gpu:0", "/cpu:0"], built_with_cuda=True) == "copy"
    here = "nccl" if tf.test.is_built_with_cuda() else "copy"
    assert towers.all_reduce_method(GPUS) == here


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("mode", MODES)
def test_inputs_and_variables_are_cast_at_each_towers_edge(mode, precision):
    graph, devices = build(mode, precision)
    compute = COMPUTE[precision]
    with graph.as_default():
        trainable = len(tf.compat.v1.trainable_variables())
    for m, scope in enumerate(["", "micro_batch_1/"]):
        for i, device in enumerate(devices):
            prefix = f"{scope}tower_{i}/"
            casts = [op for op in graph.get_operations() if op.name.startswith(prefix)
                     and op.type == "Cast" and "/gradients/" not in op.name]
            features = [op for op in casts if op.name.endswith("cast_features")]
            assert len(features) == 1, (m, i)
            reads = [op for op in casts if op.inputs[0].op.type == "ReadVariableOp"]
            assert len(reads) == trainable, (m, i)  # convnet: every variable is cast
            for op in features + reads:
                assert op.inputs[0].dtype == tf.float32 and op.outputs[0].dtype == compute
                assert canonical(op.device) == canonical(device), op.name


def test_float32_builds_no_casts_at_the_edges():
    graph, _ = build("replicated", "float32")
    assert not [op for op in graph.get_operations()
                if op.name.endswith(("cast_features", "_cast"))]


MODELS = [
    ("convnet", ()),
    ("resnet20", (("image_size", 8), ("base_filters", 4))),
    ("lstm_lm", (("vocab_size", 50), ("num_steps", 4), ("hidden_size", 8))),
    ("mlp", ()),
]


# Every model in bfloat16; float16 and float32 differ only in the type asked for.
@pytest.mark.parametrize("model_name, params, precision", [
    *[(name, params, "mixed_bfloat16") for name, params in MODELS],
    ("convnet", (), "mixed_float16"),
    ("convnet", (), "float32"),
])
def test_heavy_ops_compute_in_the_type_asked_for(model_name, params, precision):
    # Micro-batch 1 adds nothing to check; one is enough for the larger models.
    graph, _ = build("replicated", precision, 2 if model_name == "convnet" else 1,
                     model_name, params)
    compute = COMPUTE[precision]
    heavy = [op for _, op in tower_ops(graph) if op.type in HEAVY]
    assert heavy and {op.get_attr("T") for op in heavy} == {compute}
    wide = [op.name for _, op in tower_ops(graph)
            for t in op.outputs if t.dtype == tf.float64]
    assert wide == []
    norms = [op for _, op in tower_ops(graph) if op.type.startswith("FusedBatchNorm")]
    assert (model_name == "resnet20") == bool(norms)
    for op in norms:  # 16-bit in and out, statistics and scale in float32
        assert (op.get_attr("T"), op.get_attr("U")) == (compute, tf.float32), op.name


@pytest.mark.parametrize("gradient_dtype", ["bfloat16", "float16"])
def test_a_workers_gradients_reach_the_ps_in_16_bits(gradient_dtype):
    graph, devices = build("ps_worker", towers.Precision(gradient_dtype=gradient_dtype), 1)
    wire = tf.as_dtype(gradient_dtype)
    with graph.as_default():
        variables = {v.op.name: v for v in tf.compat.v1.trainable_variables()}
    sent = [op for op in graph.get_operations() if op.type == "Cast"
            and op.outputs[0].dtype == wire]
    received = [op for op in graph.get_operations() if op.type == "Cast"
                and op.inputs[0].dtype == wire and op.outputs[0].dtype == tf.float32]
    # Each tower's gradients leave its GPU in 16 bits; the worker's sums leave its CPU so.
    on = {canonical(op.device) for op in sent}
    assert on == {canonical(d) for d in devices} | {canonical(f"{WORKER}/cpu:0")}
    def task(device):
        spec = tf.DeviceSpec.from_string(device)
        return spec.job, spec.task

    assert {task(v.device) for v in variables.values()} == {("ps", 0)}
    assert {task(op.device) for op in received} == {("ps", 0), ("worker", 0)}
    landed = [op for op in received if task(op.device) == ("ps", 0)]
    assert len(landed) == len(variables)  # one summed gradient per variable
