"""What a towers process loads as TensorFlow starts (launch.tf_process)."""

import pytest
from helpers.commands import ok, run_python

# Imported by `import tensorflow` unless towers skips them; none is used by a built-in model.
SKIPPED = ["h5py", "keras", "matplotlib", "scipy.sparse"]


@pytest.mark.e2e
def test_tensorflow_starts_without_the_modules_it_tries_and_a_model_still_gets_them():
    """As every towers process starts TensorFlow: what it only tries to import is not
    loaded, and a model that imports one of them afterwards gets it whole."""
    code = (
        "import json, sys\n"
        "from launch.log import quiet_tensorflow\n"
        "quiet_tensorflow()\n"
        f"loaded = [name for name in {SKIPPED!r} if name in sys.modules]\n"
        "import h5py, keras\n"
        "dense = keras.layers.Dense(2)\n"
        "print(json.dumps({'loaded': loaded, 'later': [h5py.__name__, type(dense).__name__],\n"
        "                  'sgd': keras.optimizers.SGD.__name__}))\n")
    assert ok(run_python(code)) == {"loaded": [], "later": ["h5py", "Dense"], "sgd": "SGD"}
