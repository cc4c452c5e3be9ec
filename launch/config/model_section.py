"""The model section: which model, where its code is, and every other key a parameter.

``model.name`` is a built-in name, a name installed packages register, or
``module.path:attribute`` of the user's own code; the keys beside it are the model's
parameters, checked when the name is resolved (``load_job(check_model=...)``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from launch.config.checks import Invalid, describe, freeze, string

DEFAULT_MODEL = "convnet"


@dataclass(frozen=True)
class ModelConfig:
    """model: which model, where its code is, and every other key as a parameter.

    name: a built-in name, a name installed packages register (entry-point group
    ``towers.models``), or ``module.path:attribute`` of the user's own code.
    path: None or a directory searched for that code (after sys.path), relative to
    the working directory. params: a read-only ``types.MappingProxyType``; its lists
    are tuples and its mappings are mapping proxies. Resolving the name validates them
    (``load_job(check_model=...)``).
    job_dir: the job file's directory, also searched (set by ``load_job``; not a key).
    """

    name: str = DEFAULT_MODEL
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    path: str | None = None
    job_dir: str | None = field(default=None, compare=False)


def model_name(value: Any) -> str:
    """model.name: a built-in or installed name, or `module.path:attribute`."""
    name = string(value)
    if ":" not in name:
        if not _DOTTED.fullmatch(name.replace("-", "_")):
            raise Invalid(f"expected a model name or module:attribute, got {name!r}")
        return name
    module, _, attribute = name.partition(":")
    if not (_DOTTED.fullmatch(module) and _DOTTED.fullmatch(attribute)):
        raise Invalid(
            f"expected module:attribute with a dotted module path and attribute, such as "
            f"my_models.net:build, got {name!r}"
        )
    return name


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_MODEL_KEYS = {"name": model_name, "path": string}  # the keys that are not parameters


def model_section(value: Any) -> ModelConfig:
    """model: a name (and a code path) plus any model parameters as sibling keys."""
    if value is None:
        return ModelConfig()
    if not isinstance(value, dict):
        raise Invalid(f"expected a mapping with a name and model parameters, got "
                      f"{describe(value)}")
    params = {}
    for key, param in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise Invalid(
                f"model parameter names must be identifiers, got {describe(key)}",
                key if isinstance(key, str) else "",
            )
        if key not in _MODEL_KEYS:
            params[key] = param
    checked = {}
    for key, check in _MODEL_KEYS.items():
        given = value.get(key, DEFAULT_MODEL if key == "name" else None)
        try:
            checked[key] = None if given is None else check(given)
        except Invalid as e:
            raise e.under(key) from None
    return ModelConfig(name=checked["name"], params=freeze(params), path=checked["path"])
