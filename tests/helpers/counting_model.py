"""A model that counts, in its own weights, how often each example's update was applied:
the built-in mlp and one more variable, ``mlp_counts/trained`` [rows], whose gradient is
-1 at each position of the tower's batch (positions modulo rows: an example's place in
its epoch's order) and 0 elsewhere. Under optimizer.name: sgd each applied update adds
the same amount at each of its examples' places, so a checkpoint's ``trained`` divided by
that amount is how many of the updates it holds took each one. With ``mean`` the count's
term is the tower's mean instead of its sum, as every loss of the towers' contract is:
then a synchronous job (one process, ps/worker, collective, Horovod) adds
learning_rate / train.batch_size at each place its update trains, whatever its number of
towers, workers or ranks (the one-device update). The loss it reports is the mlp's own.
Each step also sleeps ``delay_secs`` (no CPU), so a test can stop a job part way through
a small data set."""

import time

import tensorflow as tf

import models

V1 = tf.compat.v1


def build(*, rows: int, delay_secs: float = 0.0, mean: bool = False, **params):
    mlp = models.build("mlp", params).model_fn

    def model_fn(features, labels, ctx):
        if delay_secs:
            features = tf.ensure_shape(tf.numpy_function(
                lambda x: time.sleep(delay_secs) or x, [features], features.dtype,
                stateful=True), features.shape)
        with V1.variable_scope("mlp_counts"):
            trained = V1.get_variable("trained", [rows], initializer=V1.zeros_initializer())
        outputs = mlp(features, labels, ctx)
        places = tf.gather(trained, ctx.draws.positions % rows)
        # Times one, computed from the batch: the count's gradient is ready only once the
        # forward pass is, as any model's. Without it, the gradient is a constant ready at
        # the step's start, and 2 Horovod ranks (0.28.1, Gloo) hung in step 2, each waiting
        # in its own all-gather of that sparse gradient's parts.
        places = places * tf.stop_gradient(1.0 + 0.0 * outputs.loss)
        taken = -(tf.reduce_mean(places) if mean else tf.reduce_sum(places))
        return outputs._replace(loss=outputs.loss + taken - tf.stop_gradient(taken))

    return model_fn


build.input_spec = models.build("mlp", {"input_dim": 8, "num_classes": 2}).input_spec
