"""The order of the examples in each epoch: a function of data.seed and the epoch alone.

Held in memory (builtin, npz, csv): epoch e is a full permutation of the N examples,
numpy's generator seeded by (seed, e); ``shuffle_buffer: 0`` keeps the stored order.
The permutation is made when a batch first needs it (a fraction of a second for
millions of examples) and the last two are kept, so a batch that spans two epochs
needs no second one. TFRecord files: ``launch.data.record_order``.
"""

from __future__ import annotations

import functools

import numpy as np

KEPT_EPOCHS = 2


class EpochOrder:
    """Which example sits at each position of the epochs laid end to end.

    num_examples: N, the examples of an epoch. seed: data.seed. shuffle: False keeps
    every epoch in the stored order. Thread-safe: tf.data maps call it in parallel.
    """

    def __init__(self, num_examples: int, seed: int, shuffle: bool = True):
        self.num_examples = num_examples
        self.seed = seed
        self.shuffle = shuffle
        # The epochs under way (a batch may straddle two) kept; functools' cache is
        # thread-safe, and two threads drawing the same epoch at once draw it alike.
        self.permutation = functools.lru_cache(maxsize=KEPT_EPOCHS)(self._permutation)

    def examples(self, positions: np.ndarray) -> np.ndarray:
        """positions: int64 [n] -> the index in the stored data of each, int64 [n]."""
        epochs, offsets = np.divmod(positions, self.num_examples)
        if not self.shuffle:
            return offsets
        found = np.empty_like(offsets)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            found[here] = self.permutation(int(epoch))[offsets[here]]
        return found

    def _permutation(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s order: int64 [N], the stored index at each of its places."""
        return permutation(self.seed, epoch, self.num_examples)


def permutation(seed: int, epoch: int, size: int, *salt: int) -> np.ndarray:
    """A permutation of range(size), int64, drawn from (seed, epoch, *salt) alone."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, *salt]))
    return rng.permutation(size).astype(np.int64)
