"""Finding a model's code: `module:attribute`, or a name an installed package registers.

Modules are looked for on sys.path, then in `model.path` and the job file's
directory: those two are appended to sys.path, so the user's files never shadow an
installed package, and stay there for the rest of the process, so the user's code
can import its sibling modules when it is called, not only when it is imported.
Installed packages register names in the entry-point group `towers.models`:

    [options.entry_points]            # the package's setup.cfg
    towers.models =
        mynet = their_models.net:build

Every process of a job (ps, workers, evaluator, Horovod ranks, bench runs) reads
the same job file from the same working directory and so finds the same code.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import models
from launch.config import ModelConfig
from launch.modelref.errors import ModelRefError, code_error

ENTRY_POINT_GROUP = "towers.models"


@dataclass(frozen=True)
class Found:
    """The attribute a model name resolved to.

    reference: module:attribute. source: how it was found (a file; for an entry point,
    also the distribution). roots: directories of the user's code (for tracebacks).
    """

    reference: str
    value: Any
    source: str
    roots: tuple[str, ...]


def search_dirs(model: ModelConfig) -> list[str]:
    """The directories searched after sys.path: model.path, then the job file's."""
    dirs = []
    if model.path is not None:
        path = os.path.abspath(model.path)
        if not os.path.isdir(path):
            raise ModelRefError(f"model.path: {model.path} is not a directory", "path")
        dirs.append(path)
    if model.job_dir is not None:
        dirs.append(model.job_dir)
    return dirs


def find(name: str, dirs: Sequence[str], ours: Sequence[str]) -> Found:
    """The attribute `name` (module:attribute, or an entry point's name) refers to."""
    if ":" in name:
        return import_attribute(name, dirs, ours)
    point = entry_point(name)
    if point is None:
        installed = sorted(entry_point_names())
        return _unknown(name, installed)
    dist = f"{point.dist.name} {point.dist.version}" if point.dist else "an installed package"
    if ":" not in point.value:
        raise ModelRefError(f"entry point {name} of {dist} names {point.value!r}; a "
                            f"{ENTRY_POINT_GROUP} entry point names module:attribute")
    found = import_attribute(point.value, dirs, ours)
    return Found(found.reference, found.value,
                 f"entry point {name} of {dist}: {found.source}", found.roots)


def _unknown(name: str, installed: list[str]) -> Found:
    builtin = models.names()
    close = difflib.get_close_matches(name, [*builtin, *installed], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ModelRefError(
        f"unknown model {name!r}{hint}; accepted: a built-in ({', '.join(builtin)}), "
        f"a name installed packages register ({', '.join(installed) or 'none installed'}), "
        f"or module:attribute of your own code"
    )


def entry_point_names() -> list[str]:
    return [p.name for p in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]


def entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    """The entry point registering `name`; ModelRefError if two packages disagree."""
    points = [p for p in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
              if p.name == name]
    targets = {p.value for p in points}
    if len(targets) > 1:
        raise ModelRefError(
            f"model {name!r} is registered by more than one installed package: "
            + ", ".join(f"{p.value} ({p.dist.name if p.dist else '?'})" for p in points)
        )
    return points[0] if points else None


def import_attribute(reference: str, dirs: Sequence[str], ours: Sequence[str]) -> Found:
    """Import module:attribute (the attribute may be dotted) with `dirs` on sys.path."""
    module_name, _, attribute = reference.partition(":")
    _extend_path(dirs)
    module = _import(module_name, reference, dirs, ours)
    value: Any = module
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(value, part):
            owner = module_name if depth == 0 else f"{module_name}:" + ".".join(
                attribute.split(".")[:depth])
            raise ModelRefError(_missing(owner, value, part, module))
        value = getattr(value, part)
    if not callable(value):
        raise ModelRefError(
            f"{reference} is {_a(type(value).__name__)}, not callable; name a model "
            f"function (features, labels, ctx) or a builder returning one or a Keras model"
        )
    source = getattr(module, "__file__", None) or module_name
    return Found(reference, value, source, tuple(_roots(module_name, module)))


def _extend_path(dirs: Sequence[str]) -> None:
    """Append those of `dirs` not on sys.path yet, for the rest of the process.

    For good, not only while the model's module is imported: the user's code may
    import its sibling modules when it is called (a builder runs in every tower of
    every graph: training, evaluation, export), as a script run with `python` may
    import those beside it at any time. Appended, so the user's files never shadow
    an installed package. A process resolves one job's model, so what it adds is
    that job's model.path and job file directory.
    """
    added = False
    for directory in dirs:
        if directory not in sys.path:
            sys.path.append(directory)
            added = True
    if added:
        importlib.invalidate_caches()


def _import(module_name: str, reference: str, dirs: Sequence[str], ours: Sequence[str]):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (module_name == err.name
                                     or module_name.startswith(err.name + ".")):
            where = ", ".join(dirs) if dirs else "no other directory"
            raise ModelRefError(
                f"model {reference}: no module named {err.name!r} on sys.path or in "
                f"{where} (model.path and the job file's directory are searched too)"
            ) from None
        raise _import_failed(err, reference, module_name, dirs, ours) from err
    except Exception as err:
        raise _import_failed(err, reference, module_name, dirs, ours) from err


def _import_failed(err, reference, module_name, dirs, ours):
    """The user's module raised while being imported: their frames, their bug."""
    top = module_name.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    roots = list(dirs)
    if spec is not None and spec.submodule_search_locations:
        roots += [os.path.abspath(p) for p in spec.submodule_search_locations]
    elif spec is not None and spec.origin:
        roots.append(os.path.dirname(os.path.abspath(spec.origin)))
    return code_error(err, reference, f"while importing {module_name}", roots, ours)


def _missing(owner: str, value: Any, part: str, module) -> str:
    available = sorted(n for n, v in vars(value).items()
                       if not n.startswith("_") and callable(v)
                       and getattr(v, "__module__", module.__name__) == module.__name__)
    close = difflib.get_close_matches(part, available, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"{owner} has no attribute {part!r}{hint}; it defines: "
            f"{', '.join(available) or 'no functions or classes'}")


def _roots(module_name: str, module) -> list[str]:
    """The directory of the module's top-level package (or of the module itself)."""
    top = sys.modules.get(module_name.split(".")[0], module)
    files = [getattr(top, "__file__", None), *getattr(top, "__path__", [])]
    return [os.path.dirname(os.path.abspath(files[0]))] if files[0] else [
        os.path.abspath(p) for p in files[1:]]


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def signature(value: Any) -> inspect.Signature | None:
    """The call signature, or None where Python cannot tell (some builtins)."""
    try:
        return inspect.signature(value)
    except (TypeError, ValueError):
        return None
