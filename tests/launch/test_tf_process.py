"""What a towers process loads as TensorFlow starts (launch.tf_process)."""

import pytest
from helpers.commands import ok, run_python

from launch.tf_process import ONEDNN_SETTINGS

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


@pytest.mark.e2e
def test_a_process_names_the_kernels_its_environment_gives_it():
    """What figures and cached kernel timings are filed under (launch.tf_process
    .cpu_kernels): TF_ENABLE_ONEDNN_OPTS decides oneDNN on or off on any CPU, and
    oneDNN's own settings are named beside it."""
    code = ("import json\n"
            "from launch.log import quiet_tensorflow\n"
            "quiet_tensorflow()\n"
            "from launch.tf_process import cpu_kernels\n"
            "print(json.dumps(cpu_kernels()))\n")
    unset = dict.fromkeys(ONEDNN_SETTINGS, "")
    on = run_python(code, env={**unset, "TF_ENABLE_ONEDNN_OPTS": "1"})
    off = run_python(code, env={**unset, "TF_ENABLE_ONEDNN_OPTS": "0",
                                "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert ok(on) == "oneDNN on"
    assert ok(off) == "oneDNN off, ONEDNN_MAX_CPU_ISA=AVX2"
