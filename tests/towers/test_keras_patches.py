"""The private Keras functions towers replaces while it builds a tower are still there,
with the shape it replaces them with, and still called where it replaces them (by name
from their module, at call time). A Keras release that changes one fails here, naming
the installed Keras and the supported range, instead of training silently otherwise
(towers/keras_random.py, towers/keras_sync.py)."""

import importlib
import inspect

import keras
import pytest

SUPPORTED = ">=3.12,<3.16"  # setup.cfg's

# module, function, its parameters, a function of the module that must call it by name,
# and what towers does with it.
PATCHED = {
    "draw_seed": ("keras.src.backend.tensorflow.random", ["seed"], "dropout",
                  "towers/keras_random.py offsets its seeds so each tower draws its own "
                  "random stream"),
    "_compute_moments_sync": ("keras.src.backend.tensorflow.nn", ["x", "axes", "keepdims"],
                              "moments", "towers/keras_sync.py sums BatchNormalization("
                              "synchronized=True)'s statistics across the towers"),
}


@pytest.mark.parametrize("name", PATCHED)
def test_each_replaced_keras_function_is_there_in_its_shape(name):
    module_name, parameters, caller, why = PATCHED[name]
    where = f"{module_name}.{name}"
    problem = (f"Keras {keras.__version__}: {{}}; {why}: towers supports Keras {SUPPORTED} "
               f"(setup.cfg)")
    module = importlib.import_module(module_name)
    function = getattr(module, name, None)
    assert callable(function), problem.format(f"{where} is gone")
    found = list(inspect.signature(function).parameters)
    assert found == parameters, problem.format(
        f"{where} takes ({', '.join(found)}), not ({', '.join(parameters)})")
    calls = getattr(getattr(module, caller, None), "__code__", None)
    assert calls is not None and name in calls.co_names, problem.format(
        f"{module_name}.{caller} no longer calls {name} by name, so replacing it changes "
        f"nothing")
