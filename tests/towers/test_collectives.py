"""towers.collectives in one process: two CPU devices stand for two workers, each with
its own CollectiveGroup (same size, same key sequence), as two processes' graphs would."""

import numpy as np
import tensorflow as tf
from conftest import cpu_session_config

import towers

V1 = tf.compat.v1


def two_workers() -> list[towers.CollectiveGroup]:
    return [towers.CollectiveGroup(2, "/cpu:0"), towers.CollectiveGroup(2, "/cpu:1")]


def run(fetches):
    with V1.Session(config=cpu_session_config(2)) as sess:
        sess.run(V1.global_variables_initializer())
        return sess.run(fetches)


def test_gradients_are_weighted_by_each_workers_share_of_the_batch(graph):
    """22 and 42 of 64 examples: the sum weighted 22/64 and 42/64 is the mean gradient of
    the whole batch, the same on both workers."""
    shares = (22 / 64, 42 / 64)
    grads = ([tf.constant([1.0, 2.0]), None], [tf.constant([3.0, 5.0]), None])
    reduced = []
    for group, share, mine in zip(two_workers(), shares, grads, strict=True):
        with tf.device(group.device):
            reduced.append(towers.weighted_all_reduce(group, share)(list(mine)))
    assert reduced[0][1] is None and reduced[1][1] is None
    first, second = run([reduced[0][0], reduced[1][0]])
    expected = np.array([1.0, 2.0]) * shares[0] + np.array([3.0, 5.0]) * shares[1]
    np.testing.assert_allclose(first, expected, rtol=1e-6)
    np.testing.assert_array_equal(first, second)


def test_sparse_gradients_gather_every_workers_rows_and_no_padding(graph):
    """Worker 0 touched rows 1 and 4, worker 1 only row 4: three rows come back on both,
    weighted, and no padded row 0 appears (momentum would move it)."""
    slices = [
        tf.IndexedSlices(tf.constant([[1.0, 1.0], [2.0, 2.0]]), tf.constant([1, 4]),
                         tf.constant([6, 2])),
        tf.IndexedSlices(tf.constant([[4.0, 4.0]]), tf.constant([4]), tf.constant([6, 2])),
    ]
    reduced = []
    for group, mine in zip(two_workers(), slices, strict=True):
        with tf.device(group.device):
            reduced.append(towers.weighted_all_reduce(group, 0.5)([mine])[0])
    assert all(isinstance(r, tf.IndexedSlices) for r in reduced)
    got = run([(r.indices, r.values) for r in reduced])
    for indices, values in got:
        np.testing.assert_array_equal(indices, [1, 4, 4])
        np.testing.assert_allclose(values, [[0.5, 0.5], [1.0, 1.0], [2.0, 2.0]])


def test_broadcast_gives_every_worker_the_sources_variables(graph):
    variables = []
    for index in range(2):
        with tf.device(f"/cpu:{index}"):
            variables.append([
                V1.get_variable(f"w{index}", initializer=tf.fill([3], float(index + 1))),
                V1.get_variable(f"step{index}", initializer=tf.constant(7 * index, tf.int64)),
            ])
    ops = [towers.broadcast_variables(group, mine, is_source=index == 0)
           for index, (group, mine) in enumerate(zip(two_workers(), variables, strict=True))]
    with V1.Session(config=cpu_session_config(2)) as sess:
        sess.run(V1.global_variables_initializer())
        sess.run(ops)
        w0, s0, w1, s1 = sess.run([*variables[0], *variables[1]])
    np.testing.assert_array_equal(w1, w0)
    np.testing.assert_array_equal(w0, [1.0, 1.0, 1.0])
    assert s0 == s1 == 0


def test_a_group_on_gpus_asks_for_nccl_and_on_cpus_for_the_ring():
    assert towers.CollectiveGroup(2, "/job:worker/task:1/device:GPU:0").communication == "nccl"
    assert towers.CollectiveGroup(2, "/job:worker/task:1/cpu:0").communication == "ring"
    group = towers.CollectiveGroup(2, "/cpu:0")
    assert [group.instance_key() for _ in range(3)] == [1, 2, 3]


def test_packing_groups_by_type_up_to_the_limit_and_lets_sparse_and_big_ones_alone():
    values = [tf.zeros([10]), tf.zeros([20]), tf.zeros([5], tf.float16), None,
              tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0]), tf.constant([3, 2])),
              tf.zeros([100]), tf.zeros([3]), tf.zeros([4], tf.float16)]
    # float32 bytes: 40, 80, 400, 12 -> [40 + 80], [400 alone], [12]; float16: [10 + 8]
    assert towers.pack_groups(values, max_bytes=128) == [[0, 1], [2, 7], [5], [6]]


def test_packed_collectives_give_what_unpacked_ones_give():
    """Five gradients of three shapes and a sparse one, in buffers of at most 64 bytes."""
    rng = np.random.default_rng(0)
    shapes = [[3, 4], [4], [2, 2, 2], [1], [7]]
    inputs = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(2)]
    results = {}
    for limit in (0, 64):
        with tf.Graph().as_default():
            reduced = []
            for group, mine in zip(two_workers(), inputs, strict=True):
                grads = [tf.constant(x) for x in mine]
                grads.insert(2, tf.IndexedSlices(tf.ones([1, 4]), tf.constant([2]),
                                                 tf.constant([5, 4])))
                with tf.device(group.device):
                    reduced.append(
                        towers.packed(towers.weighted_all_reduce(group, 0.5), limit)(grads))
            assert all(isinstance(r[2], tf.IndexedSlices) for r in reduced)
            results[limit] = run([[g for i, g in enumerate(r) if i != 2] for r in reduced])
    for plain, packed_ in zip(results[0], results[64], strict=True):
        for a, b in zip(plain, packed_, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-6)
