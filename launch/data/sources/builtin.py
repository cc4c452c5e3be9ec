"""``data.source: builtin``: a learnable data set generated in-process with numpy from
``data.seed`` (see :func:`builtin_arrays`); the evaluation data is its held-out split.
"""

from __future__ import annotations

import math

import numpy as np

from launch.data.errors import DataError
from launch.data.sources.base import InMemory, generated_batches
from models import InputSpec

__all__ = ["MAX_BUILTIN_BYTES", "Builtin", "builtin_arrays"]

MAX_BUILTIN_BYTES = 4 << 30  # builtin_arrays refuses data sets larger than this (bytes)

_STROKES = 3  # class-specific strokes per image
_DISTRACTORS = 256  # pool of random strokes, one added to every image
_NOISE = 0.5  # std of the Gaussian pixel noise
_SUCCESSOR_PROBS = (0.6, 0.25, 0.1, 0.05)  # 3 likely next tokens, then any token
_MIN_IMAGE_SIDE = 8


class Builtin(InMemory):
    """data.num_examples examples of the model's spec, training ones or held-out ones."""

    name = "builtin"
    generated = True

    def check(self, spec: InputSpec, *, training: bool = True) -> None:
        """What builtin_arrays would refuse, without generating anything."""
        check_request(spec, self.cfg.num_examples, self.cfg.seed)

    def examples(self, spec: InputSpec) -> int:
        return self.cfg.num_examples

    def arrays(self, spec: InputSpec, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
        return builtin_arrays(spec, self.cfg.num_examples, self.cfg.seed, training)

    def eval_batches(self, steps: int | None, batch_size: int) -> tuple[int, str]:
        batches, why = generated_batches(steps)
        held_out = self.cfg.num_examples
        return batches, (f"data.source builtin generates {held_out} held-out examples "
                         f"(data.num_examples): an evaluation scores the first "
                         f"{min(held_out, batches * batch_size)}, at most {batches} batches "
                         f"of {batch_size} ({why})")


def builtin_arrays(spec: InputSpec, num_examples: int = 20000, seed: int = 0,
                   training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The builtin data set: features [N, *feature_shape], labels [N, *label_shape].

    The task (class templates, Markov chain) comes from ``seed``; the examples from a
    train (``training=True``) or a held-out eval stream of the same seed:
    ``np.random.SeedSequence(seed).spawn(3)``. Kinds, chosen from the spec:

    * images (H, W, C), (H, W) or flat (H*W*C,) with C in {1, 3}: each class is 3 smooth
      oriented strokes (anisotropic Gaussians) at class-specific places; an example
      shifts them by up to 2 px (scaled to the image), scales each by U(0.5, 1.5), gives
      each a random colour (C = 3), adds one random distractor stroke and N(0, 0.5^2)
      pixel noise. A ridge linear classifier gets ~86% (28x28x1) and ~91% (32x32x3) on
      the eval split, the best single pixel ~20%, a small CNN ~98% in 1,500 steps.
    * other flat float vectors: two Gaussian clusters per class.
    * token ids (T,) with labels (T,): windows of a random Markov chain over
      num_classes tokens (3 likely successors per token) and the same windows shifted
      by one as labels.
    """
    norm = spec
    kind = check_request(norm, num_examples, seed)
    task, train, held_out = np.random.SeedSequence(seed).spawn(3)
    task_rng = np.random.default_rng(task)
    rng = np.random.default_rng(train if training else held_out)
    if kind == "tokens":
        features, labels = _markov_windows(task_rng, rng, num_examples, norm)
    elif kind == "vectors":
        features, labels = _cluster_vectors(task_rng, rng, num_examples, norm)
    else:
        features, labels = _stroke_images(task_rng, rng, num_examples, norm, _image_dims(norm))
    features = features.reshape(-1, *norm.feature_shape)
    labels = labels.reshape(-1, *norm.label_shape)
    return (features.astype(norm.feature_dtype.as_numpy_dtype, copy=False),
            labels.astype(norm.label_dtype.as_numpy_dtype, copy=False))


def check_request(spec: InputSpec, num_examples: int, seed: int) -> str:
    """The kind builtin_arrays would generate for these arguments (builtin_kind); a
    DataError for arguments it refuses, a data set over MAX_BUILTIN_BYTES among them."""
    kind = builtin_kind(spec)
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise DataError(f"builtin: num_examples must be a positive int, got {num_examples!r}")
    if not isinstance(seed, int) or seed < 0:
        raise DataError(f"builtin: seed must be a non-negative int, got {seed!r}")
    bytes_needed = num_examples * (spec.num_features + spec.num_labels) * 4
    if bytes_needed > MAX_BUILTIN_BYTES:
        raise DataError(f"builtin: {num_examples} examples of shape {spec.feature_shape} need "
                        f"{bytes_needed / 2**30:.1f} GiB; lower num_examples")
    return kind


def builtin_kind(spec: InputSpec) -> str:
    """'images', 'vectors' or 'tokens'; DataError for a spec builtin cannot serve."""
    if spec.int_features:
        if len(spec.feature_shape) == 1 and spec.label_shape == spec.feature_shape:
            return "tokens"
        raise DataError(f"builtin: integer features need shape (T,) and labels (T,) (a "
                        f"language model), got {spec.feature_shape} and {spec.label_shape}")
    if spec.label_shape != ():
        raise DataError(f"builtin: float features need scalar class labels, got label "
                        f"shape {spec.label_shape}")
    return "images" if _image_dims(spec) else "vectors"


def _image_dims(spec: InputSpec) -> tuple[int, int, int] | None:
    """(H, W, C) when the spec is an image or a flattened square image, else None."""
    shape = spec.feature_shape
    if len(shape) == 3 and min(shape[:2]) >= _MIN_IMAGE_SIDE:
        return shape
    if len(shape) == 2 and min(shape) >= _MIN_IMAGE_SIDE:
        return (*shape, 1)
    if len(shape) == 1:
        for channels in (1, 3):
            side = math.isqrt(shape[0] // channels)
            if side >= _MIN_IMAGE_SIDE and side * side * channels == shape[0]:
                return side, side, channels
    return None


def _strokes(rng: np.random.Generator, count: int, height: int, width: int,
             margin: float) -> tuple[np.ndarray, ...]:
    """Random stroke parameters, each [count]: centre y, x, angle, long and short std."""
    scale = min(height, width) / 28.0
    return (rng.uniform(margin, 28 - margin, count) * height / 28,
            rng.uniform(margin, 28 - margin, count) * width / 28,
            rng.uniform(0, np.pi, count),
            rng.uniform(2.5, 4.5, count) * scale,
            rng.uniform(0.9, 1.4, count) * scale)


def _render(height: int, width: int, cy: np.ndarray, cx: np.ndarray, angle: np.ndarray,
            long_std: np.ndarray, short_std: np.ndarray) -> np.ndarray:
    """Strokes [M] -> maps [M, H, W] float32 peaking at 1 (rotated Gaussians)."""
    yy, xx = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    dy, dx = yy - cy[:, None, None], xx - cx[:, None, None]
    cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    along, across = dx * cos + dy * sin, dy * cos - dx * sin
    return np.exp(-0.5 * ((along / long_std[:, None, None]) ** 2
                          + (across / short_std[:, None, None]) ** 2)).astype(np.float32)


def _colours(rng: np.random.Generator, shape: tuple[int, ...], channels: int) -> np.ndarray:
    """Random colours [*shape, C] with their brightest channel at 1."""
    colours = rng.uniform(0.2, 1.0, (*shape, channels))
    return (colours / colours.max(axis=-1, keepdims=True)).astype(np.float32)


def _class_banks(task_rng: np.random.Generator, num_classes: int, height: int, width: int,
                 shift: int) -> tuple[np.ndarray, np.ndarray]:
    """Pre-rendered strokes: class strokes at every integer shift [K, S, P, H, W]
    (P = (2 shift + 1)^2) and distractor strokes [D, H, W]."""
    offsets = np.arange(-shift, shift + 1)
    side = len(offsets)
    cy, cx, angle, long_std, short_std = _strokes(task_rng, num_classes * _STROKES,
                                                  height, width, margin=7)
    shifted_y = (cy[:, None] + np.repeat(offsets, side)[None]).ravel()
    shifted_x = (cx[:, None] + np.tile(offsets, side)[None]).ravel()
    each = side * side
    classes = _render(height, width, shifted_y, shifted_x, np.repeat(angle, each),
                      np.repeat(long_std, each), np.repeat(short_std, each))
    distractors = _render(height, width, *_strokes(task_rng, _DISTRACTORS, height, width, 4))
    return classes.reshape(num_classes, _STROKES, each, height, width), distractors


def _stroke_images(task_rng: np.random.Generator, rng: np.random.Generator, count: int,
                   spec: InputSpec, dims: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """images [N, H, W, C] float32 and labels [N]; vectorised: per-class strokes are
    rendered once at every shift and gathered, so generation is a few array passes.
    Stroke colours are random per example (all 1 for C = 1): shape carries the class."""
    height, width, channels = dims
    shift = max(1, round(2 * min(height, width) / 28))
    classes, distractors = _class_banks(task_rng, spec.num_classes, height, width, shift)
    labels = rng.integers(0, spec.num_classes, count)
    shifts = rng.integers(0, classes.shape[2], count)
    # per example, stroke and channel: the class strokes' and the distractor's intensity
    amplitudes = np.concatenate([rng.uniform(0.5, 1.5, (count, _STROKES)),
                                 rng.uniform(0.0, 1.0, (count, 1))], axis=1)
    weights = (amplitudes[..., None] * _colours(rng, (count, _STROKES + 1), channels))
    weights = weights.astype(np.float32)[:, :, None, None, :]  # [N, S + 1, 1, 1, C]
    images = rng.standard_normal((count, *dims), dtype=np.float32)
    images *= _NOISE
    for stroke in range(_STROKES):
        images += classes[labels, stroke, shifts][..., None] * weights[:, stroke]
    images += distractors[rng.integers(0, _DISTRACTORS, count)][..., None] * weights[:, -1]
    return images, labels


def _cluster_vectors(task_rng: np.random.Generator, rng: np.random.Generator, count: int,
                     spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """vectors [N, D] float32, two unit-variance Gaussian clusters per class, labels [N]."""
    means = task_rng.normal(0.0, 1.0, (spec.num_classes, 2, spec.num_features))
    labels = rng.integers(0, spec.num_classes, count)
    modes = rng.integers(0, 2, count)
    vectors = means[labels, modes] + rng.standard_normal((count, spec.num_features))
    return vectors.astype(np.float32), labels


def _markov_windows(task_rng: np.random.Generator, rng: np.random.Generator, count: int,
                    spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """Token windows [N, T] of a Markov chain and the next tokens [N, T].

    Each token has 3 likely successors (p = 0.6, 0.25, 0.1) and with p = 0.05 any token
    follows. The loop runs over the T steps only (each token depends on the previous
    one); every step is vectorised over the N independent chains.
    """
    vocab, steps = spec.num_classes, spec.feature_shape[0]
    likely = len(_SUCCESSOR_PROBS) - 1
    successors = task_rng.integers(0, vocab, (vocab, likely))
    choice = rng.choice(len(_SUCCESSOR_PROBS), size=(count, steps), p=_SUCCESSOR_PROBS)
    anything = rng.integers(0, vocab, (count, steps))
    tokens = np.empty((count, steps + 1), np.int64)
    tokens[:, 0] = rng.integers(0, vocab, count)
    for step in range(steps):
        following = successors[tokens[:, step], np.minimum(choice[:, step], likely - 1)]
        tokens[:, step + 1] = np.where(choice[:, step] == likely, anything[:, step], following)
    return tokens[:, :-1], tokens[:, 1:]
