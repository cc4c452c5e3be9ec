"""Sessions for tests that run small graphs a few steps each."""

import tensorflow as tf
from conftest import cpu_session_config


def without_rewriting(config: tf.compat.v1.ConfigProto) -> tf.compat.v1.ConfigProto:
    """config, with Grappler's graph rewriting off: its passes cost more than the few
    small steps a test runs (a tf.data pipeline's own rewrites still run; the product's
    sessions keep them)."""
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def quick_session_config(num_cpus: int = 1) -> tf.compat.v1.ConfigProto:
    """cpu_session_config without graph rewriting."""
    return without_rewriting(cpu_session_config(num_cpus))


def quick_session(graph: tf.Graph | None = None) -> tf.compat.v1.Session:
    """A session on `graph` (the default graph if None) with quick_session_config."""
    return tf.compat.v1.Session(graph=graph, config=quick_session_config())
