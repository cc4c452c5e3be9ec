"""A user's model function or builder as a `models.Model`.

What the job names is one of:

  a model function  (features, labels, ctx) -> towers.TowerOutputs or a scalar loss:
                    three required positional parameters, and the job gives none;
  a builder         anything else: called with the model section's other keys as
                    keyword arguments, it returns a model function or a Keras model
                    compiled with a loss (models.keras_model).

A builder is called inside every tower as it is built, so each tower (and each
graph) builds its own Keras layers: towers then shares them in parameter_server
mode or keeps per-tower copies in replicated mode (towers.sharing). Either may
declare its input as an `input_spec` attribute (a models.InputSpec, or a mapping
of its fields); without one the data must tell.
"""

from __future__ import annotations

import copy
import difflib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

import models
import towers
from launch.modelref.errors import ModelCodeError, ModelRefError, code_error
from launch.modelref.finding import Found, signature
from models import keras_model

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def adapt(name: str, found: Found, params: Mapping[str, Any], ours: Sequence[str]) -> models.Model:
    """The Model for `found` with the job's parameters; ModelRefError when they do not fit."""
    if keras_model.is_keras_object(found.value):
        raise ModelRefError(
            f"{found.reference} is a Keras model object; name a function that builds it "
            f"(def build(): ... return model), which towers calls in every tower and graph"
        )
    sig = signature(found.value)
    params = thaw(params)
    if params and is_model_function(sig):
        first = next(iter(params))
        raise ModelRefError(
            f"{found.reference} is a model function (features, labels, ctx), which takes "
            f"no parameters; got {', '.join(params)}. To take parameters, make it a builder "
            f"returning the model function", first)
    kind = "function" if is_model_function(sig) else "builder"
    resolved = bind(found.reference, sig, params) if kind == "builder" else {}
    model_fn = UserModelFn(found, kind, resolved, ours)
    return models.Model(name, resolved, model_fn, declared_spec(found), found.source)


def is_model_function(sig: inspect.Signature | None) -> bool:
    """Exactly three required parameters, all positional: (features, labels, ctx)."""
    if sig is None:
        return False
    required = [p for p in sig.parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return len(required) == 3 and all(p.kind in _POSITIONAL for p in required)


def bind(reference: str, sig: inspect.Signature | None, params: dict) -> dict:
    """The keyword arguments a builder is called with: the job's, then its defaults."""
    if sig is None:
        return params
    accepted = [n for n, p in sig.parameters.items() if p.kind in _NAMED]
    takes_any = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [key for key in params if key not in accepted]
    if unknown and not takes_any:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelRefError(
            f"{reference} takes no parameter {unknown[0]!r}{hint}; it takes: "
            f"{', '.join(accepted) or 'no parameters'}", unknown[0])
    missing = [n for n, p in sig.parameters.items()
               if p.default is p.empty and p.kind in _NAMED and n not in params]
    positional_only = [n for n, p in sig.parameters.items()
                       if p.default is p.empty and p.kind == p.POSITIONAL_ONLY]
    if missing or positional_only:
        raise ModelRefError(
            f"{reference} needs parameter(s) {', '.join(missing or positional_only)}: give "
            f"them as keys of the model section (it takes: {', '.join(accepted)})")
    defaults = {n: p.default for n, p in sig.parameters.items()
                if p.kind in _NAMED and p.default is not p.empty}
    return {**defaults, **params}


def declared_spec(found: Found) -> models.InputSpec | None:
    declared = getattr(found.value, "input_spec", None)
    if declared is None:
        return None
    try:
        return models.as_input_spec(declared)
    except (TypeError, ValueError) as err:
        raise ModelRefError(f"{found.reference}.input_spec: {err}") from None


def thaw(value: Any) -> Any:
    """Config values as plain Python: mappings to dicts, tuples to lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


class UserModelFn:
    """The model function towers calls in each tower.

    Calls the user's model function, or their builder and then what it returned; a
    compiled Keras model becomes tower outputs through models.keras_model (towers
    runs its layers' state updates). An exception from the user's code becomes a
    ModelCodeError naming the model and the tower, with their frames only.
    keras_model: tower 0's Keras model in the graph built last (None if not Keras);
    export writes its weights.
    """

    def __init__(self, found: Found, kind: str, params: dict, ours: Sequence[str]):
        self.found, self.kind, self.params, self.ours = found, kind, params, ours
        self.keras_model = None

    def __call__(self, features, labels, ctx: towers.TowerContext):
        reference = self.found.reference
        try:
            if ctx.index == 0:
                keras_model.reset_names()  # every graph names its Keras variables alike
            outputs = self._build(features, labels, ctx)
        except (ModelRefError, ModelCodeError):
            raise
        except keras_model.KerasModelError as err:
            raise ModelRefError(f"{reference}: {err}") from None
        except Exception as err:
            during = f"while building tower {ctx.index} ({ctx.device})"
            raise code_error(err, reference, during, self.found.roots, self.ours,
                             _mixed_types_hint(err, ctx)) from err
        return outputs

    def _build(self, features, labels, ctx):
        if self.kind == "function":
            return _checked(self.found.value(features, labels, ctx),
                            f"{self.found.reference} returned")
        made = self.found.value(**copy.deepcopy(self.params))
        if keras_model.is_keras_model(made):
            if ctx.index == 0:
                self.keras_model = made
            return keras_model.tower_outputs(made, features, labels, ctx)
        what = f"the model function {self.found.reference} built returned"
        if keras_model.is_keras_object(made) or not callable(made):
            raise ModelRefError(
                f"{self.found.reference} returned {type(made).__name__}; a builder returns "
                f"a model function (features, labels, ctx) or a keras.Model compiled with a loss"
            )
        return _checked(made(features, labels, ctx), what)


def _mixed_types_hint(err: Exception, ctx: towers.TowerContext) -> str:
    """What to do when values of two float types met in the model: a 16-bit one and a
    float32 one (a loss plus get_variable's float32 regularization penalties, say), a
    float64 variable the model made and the float32 features, or towers verify's
    float64 and a float32 value the model made (or an op without float64); "" for any
    other error."""
    text = str(err)
    if not isinstance(err, TypeError | ValueError) or "float32" not in text:
        return ""
    compute = ctx.compute_dtype.name
    if compute == "float32":
        return _FLOAT32_FEATURES if "float64" in text else ""
    if compute not in text:
        return ""
    if compute == "float64":
        return _NO_FLOAT64_KERNEL if "not in list of allowed values" in text else \
            _FLOAT32_IN_FLOAT64
    return (f" (the towers compute in {compute}: compute the loss in float32, casting the "
            f"logits, as regularization penalties and the built-in layers' losses are)")


_FLOAT32_FEATURES = (" (towers feeds float features as float32, towers.precision's type, "
                     "whatever the data holds: make the model's variables float32, or give "
                     "them no dtype)")
_FLOAT32_IN_FLOAT64 = (" (towers verify computes in float64: a value the model makes float32 "
                       "itself, such as tf.constant(..., tf.float32), meets float64 ones; "
                       "make it in ctx.compute_dtype)")
_NO_FLOAT64_KERNEL = (" (towers verify computes in float64, and this op has no float64 "
                      "kernel: verify cannot run the model as it is)")


def _checked(result: Any, what: str):
    if isinstance(result, towers.TowerOutputs | tf.Tensor):
        return result
    hint = ""
    if callable(result):
        hint = (" (is it a builder? It was taken for a model function: three required "
                "positional parameters and no model parameters in the job)")
    raise ModelRefError(
        f"{what} {type(result).__name__}; a model function returns towers.TowerOutputs "
        f"or a scalar loss tensor{hint}"
    )

