"""What a towers process loads as TensorFlow starts (launch.tf_process)."""

import sys

import pytest
from helpers.commands import ok, run_python

from launch.tf_process import ONEDNN_SETTINGS, RefusedToKeras

# Imported by `import tensorflow` unless towers skips them; none is used by a built-in model.
SKIPPED = ["h5py", "keras", "matplotlib", "scipy.sparse"]
# Imported by `import keras` where installed unless towers refuses them to it (matplotlib
# is: the test extras install it).
KERAS_OPTIONAL = ["matplotlib", "IPython"]


@pytest.mark.e2e
def test_tensorflow_starts_without_the_modules_it_tries_and_a_model_still_gets_them():
    """As every towers process starts TensorFlow: what it only tries to import is not
    loaded, and a model that imports one of them afterwards gets it whole; the Keras it
    imports goes without its optional imports, which the model itself still gets."""
    code = (
        "import json, sys\n"
        "from launch.log import quiet_tensorflow\n"
        "quiet_tensorflow()\n"
        f"loaded = [name for name in {SKIPPED!r} if name in sys.modules]\n"
        "import h5py, keras\n"
        "dense = keras.layers.Dense(2)\n"
        f"for_keras = [name for name in {KERAS_OPTIONAL!r} if name in sys.modules]\n"
        "import matplotlib.pyplot\n"
        "print(json.dumps({'loaded': loaded, 'later': [h5py.__name__, type(dense).__name__],\n"
        "                  'sgd': keras.optimizers.SGD.__name__, 'for_keras': for_keras,\n"
        "                  'own': matplotlib.pyplot.__name__}))\n")
    assert ok(run_python(code)) == {"loaded": [], "later": ["h5py", "Dense"], "sgd": "SGD",
                                    "for_keras": [], "own": "matplotlib.pyplot"}


def test_only_keras_own_imports_of_a_refused_module_fail(tmp_path, monkeypatch):
    (tmp_path / "optional_extra.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [RefusedToKeras(("optional_extra",)), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "optional_extra", raising=False)
    for keras_module in ("keras", "keras.src.visualization.plot_image_gallery"):
        with pytest.raises(ModuleNotFoundError, match="not imported for Keras"):
            exec("import optional_extra", {"__name__": keras_module})
    assert "optional_extra" not in sys.modules
    for other in ("their_model", "keras_model", "tf_keras.src.x"):
        namespace = {"__name__": other}
        exec("from optional_extra import VALUE", namespace)
        assert namespace["VALUE"] == 1
        del sys.modules["optional_extra"]


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
