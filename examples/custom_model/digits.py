"""Write scikit-learn's handwritten digits (shipped with it, no download) as npz files.

    python examples/custom_model/digits.py runs/digits

gives runs/digits/train.npz (1,497 examples) and runs/digits/eval.npz (300): features
float32 [N, 8, 8, 1] scaled to [0, 1], labels int64 [N] in 0..9. The split is fixed
(seed 0), so every run trains and scores on the same examples.
"""

import os
import sys

import numpy as np

EVAL_EXAMPLES = 300


def main(out: str) -> None:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("digits.py reads scikit-learn's digits: pip install scikit-learn")

    digits = load_digits()
    write(digits.images, digits.target, out)


def write(images: np.ndarray, target: np.ndarray, out: str) -> None:
    """images [1797, 8, 8] of 0..16, target [1797]: the fixed split, as npz files."""
    order = np.random.default_rng(0).permutation(len(target))
    features = (images[order] / 16.0).astype(np.float32)[..., None]
    labels = target[order].astype(np.int64)
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, "train.npz"), features=features[EVAL_EXAMPLES:],
             labels=labels[EVAL_EXAMPLES:])
    np.savez(os.path.join(out, "eval.npz"), features=features[:EVAL_EXAMPLES],
             labels=labels[:EVAL_EXAMPLES])
    print(f"wrote {out}/train.npz ({len(labels) - EVAL_EXAMPLES} examples) and "
          f"{out}/eval.npz ({EVAL_EXAMPLES})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/digits")
