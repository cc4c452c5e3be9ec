"""Where variables and compute go: one set of variables, parameter devices, balancing."""

import tensorflow as tf
from helpers.tower_training import SMALL, canonical, cpus, get_variable, momentum

import models
import towers


def variable_names_of(graph_fn):
    graph = tf.Graph()
    with graph.as_default():
        graph_fn()
        return sorted(v.op.name for v in tf.compat.v1.global_variables())


def build_convnet(devices, **kwargs):
    model = models.build("convnet", SMALL["convnet"])
    x = tf.zeros([8, *model.input_spec.feature_shape])
    y = tf.zeros([8], tf.int32)
    return towers.build_train_op(model.model_fn, x, y, momentum(), devices, **kwargs)


def test_exactly_one_set_of_variables():
    single = variable_names_of(lambda: build_convnet(["/cpu:0"]))
    assert variable_names_of(lambda: build_convnet(cpus(4))) == single
    replicated = variable_names_of(lambda: build_convnet(cpus(4), variable_update="replicated"))
    assert replicated == single


def test_variables_live_on_the_parameter_device_and_compute_on_each_tower(graph):
    build_convnet(cpus(4), param_device="/cpu:3")
    variables = tf.compat.v1.global_variables()
    assert variables and {canonical(v.device) for v in variables} == {canonical("/cpu:3")}
    for i in range(4):
        tower_ops = [op for op in graph.get_operations() if op.name.startswith(f"tower_{i}/")]
        assert len(tower_ops) > 20
        # Variable reads carry no device: TensorFlow runs them beside their variable.
        computed = [op for op in tower_ops if op.type not in ("Const", "NoOp", "ReadVariableOp")]
        assert {canonical(op.device) for op in computed} == {canonical(f"/cpu:{i}")}, i


def test_least_loaded_spreads_variables_by_bytes(graph):
    build_convnet(cpus(2), param_device="least_loaded")
    loads = {}
    for v in tf.compat.v1.trainable_variables():
        loads[v.device] = loads.get(v.device, 0) + v.shape.num_elements()
    assert set(loads) == {"/cpu:0", "/cpu:1"}
    biggest = max(v.shape.num_elements() for v in tf.compat.v1.trainable_variables())
    assert abs(loads["/cpu:0"] - loads["/cpu:1"]) <= biggest


def test_greedy_balancer_keeps_large_variables_apart(graph):
    sizes = [1000, 1000, 10, 10, 10]
    ops = [get_variable(f"v{i}", [n]).op for i, n in enumerate(sizes)]
    balancer = towers.GreedyByteBalancer(2)
    assert [balancer(op) for op in ops] == [0, 1, 0, 1, 0]


def tutorial_placed_model(features, labels, ctx):
    """Places its variables itself, as TensorFlow's CIFAR-10 tutorial does."""
    with tf.device("/cpu:0"):
        w = get_variable("w", [4, 3])
    logits = tf.matmul(features, w, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))


def test_a_models_own_placement_is_overruled_and_warned_once(graph, recwarn):
    towers.build_train_op(tutorial_placed_model, tf.zeros([8, 4]), tf.zeros([8], tf.int32),
                          momentum(), ["/cpu:1", "/cpu:2"], variable_update="replicated",
                          accumulate_steps=2)
    warned = [str(w.message) for w in recwarn if "places ops itself" in str(w.message)]
    assert len(warned) == 1, warned
    assert f"tf.device('/cpu:0') at {__file__}:" in warned[0]
    # Each tower's copy and compute are on its own device all the same.
    ops = {op.name: tf.DeviceSpec.from_string(op.device) for op in graph.get_operations()}
    for tower in (0, 1):
        assert ops[f"tower_{tower}/logits"].device_index == tower + 1
    assert ops["tower_1/w"].device_index == 2


def test_a_model_that_places_nothing_is_not_warned(graph, recwarn):
    build_convnet(cpus(2))
    assert not [w for w in recwarn if "places ops itself" in str(w.message)]
