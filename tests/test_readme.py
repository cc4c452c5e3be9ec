"""The README's Python snippets run as written: each compiles; the library example
trains a step on two CPU devices; the Keras builder builds; the snippet loading an
exported Keras model's weights is the one tests/launch/modelref/test_user_models_e2e.py
runs against a real export."""

import os
import re

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_snippets() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def snippet(containing: str) -> str:
    found = [s for s in python_snippets() if containing in s]
    assert len(found) == 1, f"{len(found)} snippets hold {containing!r}"
    return found[0]


def test_every_snippet_compiles():
    snippets = python_snippets()
    assert len(snippets) >= 3
    for code in snippets:
        compile(code, "README.md", "exec")


def test_the_library_example_trains_a_step():
    with tf.Graph().as_default():
        names: dict = {}
        exec(snippet("towers.build_train_op"), names)  # it runs its step itself
        assert names["ops"].train_op is not None


def test_the_keras_builder_builds_a_compiled_model():
    names: dict = {}
    exec(snippet("def build(filters=16, hidden=64)"), names)
    model = names["build"]()
    assert model.compiled_loss is not None or model.loss is not None
