"""An image classifier written as TensorFlow's classic CIFAR-10 multi-GPU tutorial wrote
its model (our own code, in that style): variables made on the CPU through small
helpers, weight decay added to the 'losses' collection beside the cross-entropy and
summed with add_n, local response normalization, an exponential moving average of
the weights kept by the model itself, and summaries inside the model.
"""

import tensorflow as tf

v1 = tf.compat.v1

NUM_CLASSES = 10
WEIGHT_DECAY = 0.004
MOVING_AVERAGE_DECAY = 0.9  # the tutorial's 0.9999, lowered so a few steps move it


def _activation_summary(x):
    """A histogram and the fraction of zeros of an activation, as the tutorial logs them."""
    v1.summary.histogram(x.op.name + "/activations", x)
    v1.summary.scalar(x.op.name + "/sparsity", tf.nn.zero_fraction(x))


def _variable_on_cpu(name, shape, initializer):
    with tf.device("/cpu:0"):
        return v1.get_variable(name, shape, initializer=initializer, dtype=tf.float32)


def _variable_with_weight_decay(name, shape, stddev, wd):
    """A truncated-normal variable whose L2 penalty, if wd, joins the 'losses' collection."""
    var = _variable_on_cpu(name, shape, v1.truncated_normal_initializer(stddev=stddev))
    if wd is not None:
        v1.add_to_collection("losses", tf.multiply(tf.nn.l2_loss(var), wd, name="weight_loss"))
    return var


def _conv(images, name, channels_in, channels_out):
    with v1.variable_scope(name) as scope:
        kernel = _variable_with_weight_decay("weights", [5, 5, channels_in, channels_out],
                                             stddev=5e-2, wd=None)
        biases = _variable_on_cpu("biases", [channels_out], v1.constant_initializer(0.1))
        conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding="SAME")
        out = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
    _activation_summary(out)
    return out


def _local(x, name, units_in, units_out, stddev, wd, relu=True):
    with v1.variable_scope(name) as scope:
        weights = _variable_with_weight_decay("weights", [units_in, units_out], stddev, wd)
        biases = _variable_on_cpu("biases", [units_out], v1.constant_initializer(0.1))
        out = tf.matmul(x, weights) + biases
        out = tf.nn.relu(out, name=scope.name) if relu else tf.identity(out, name=scope.name)
    _activation_summary(out)
    return out


def inference(images):
    """images [batch, 32, 32, 3] -> logits [batch, NUM_CLASSES]."""
    conv1 = _conv(images, "conv1", 3, 16)
    pool1 = tf.nn.max_pool2d(conv1, 3, 2, padding="SAME", name="pool1")
    norm1 = tf.nn.lrn(pool1, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name="norm1")
    conv2 = _conv(norm1, "conv2", 16, 16)
    norm2 = tf.nn.lrn(conv2, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name="norm2")
    pool2 = tf.nn.max_pool2d(norm2, 3, 2, padding="SAME", name="pool2")
    flat = tf.reshape(pool2, [-1, 8 * 8 * 16])
    local3 = _local(flat, "local3", 8 * 8 * 16, 64, stddev=0.04, wd=WEIGHT_DECAY)
    local4 = _local(local3, "local4", 64, 32, stddev=0.04, wd=WEIGHT_DECAY)
    return _local(local4, "softmax_linear", 32, NUM_CLASSES, stddev=1 / 32.0, wd=None,
                  relu=False)


def loss(logits, labels):
    """The mean cross-entropy, added to the 'losses' collection; the total of it."""
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits, name="cross_entropy_per_example")
    v1.add_to_collection("losses", tf.reduce_mean(cross_entropy, name="cross_entropy"))
    return tf.add_n(v1.get_collection("losses"), name="total_loss")


def model_fn(images, labels, ctx):
    logits = inference(images)
    total_loss = loss(logits, labels)
    averages = v1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY,
                                                 v1.train.get_global_step())
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, averages.apply(v1.trainable_variables()))
    v1.summary.scalar("total_loss", total_loss)
    return total_loss


model_fn.input_spec = {"feature_shape": (32, 32, 3), "num_classes": NUM_CLASSES}
