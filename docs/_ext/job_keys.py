"""The job-key reference, generated from the job file's own definitions.

``reference.md`` holds a marker line; as Sphinx reads that page this extension puts in
its place a table per section of every key ``towers validate`` prints, with the
default it prints. Both come from the same place: the resolved built-in job,
``launch.config.to_dict(load_job(None))``, written by ``launch.config.dump_yaml``
(which ``towers validate`` calls), so the reference cannot drift from the code. The
key's type is its dataclass field's annotation, a section's prose its dataclass's
docstring, and the pages that mention a key (as `` `section.key` ``) are linked beside
it. Sections that are ``null`` unless set (``data.schema``, ``train.warm_start``) list
their keys too, with the defaults they take when the section is given.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os
import types
import typing
from dataclasses import dataclass
from typing import Any

from launch.config import JobConfig, dump_yaml, load_job, to_dict

MARKER = "<!-- the job keys, generated -->"


@dataclass(frozen=True)
class Key:
    """One row of the reference: the dotted key, its default as YAML, its type."""

    key: str
    default: str
    type: str


def yaml_value(value: Any) -> str:
    """A value written as ``towers validate`` writes it (``null``, ``[5, 15]``, ``auto``)."""
    return dump_yaml({"k": value}).split(":", 1)[1].strip()


def _nested_class(cls: type, name: str) -> type | None:
    """The dataclass a field of ``cls`` holds (itself, or ``X | None``), if it holds one."""
    hint = typing.get_type_hints(cls).get(name)
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    found = [o for o in options if dataclasses.is_dataclass(o)]
    return found[0] if found else None


def _defaults(cls: type) -> dict[str, Any]:
    """The values a section given as ``{}`` takes (``required`` where it has none)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = "(required)"
    return {k: to_plain(v) for k, v in out.items()}


def to_plain(value: Any) -> Any:
    """Tuples as lists and mapping views as dicts, as the resolved job holds them."""
    if isinstance(value, tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, types.MappingProxyType | dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def _field_types(cls: type | None) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)} if cls else {}


def section_keys(values: dict[str, Any], cls: type | None, prefix: str) -> list[Key]:
    """Every key under ``prefix``: those of nested sections, and of sections null until set."""
    types_ = _field_types(cls)
    keys = []
    for name, value in values.items():
        key = f"{prefix}.{name}"
        nested = _nested_class(cls, name) if cls and name in types_ else None
        if isinstance(value, dict) and nested is not None:
            keys += section_keys(value, nested, key)
            continue
        keys.append(Key(key, yaml_value(value), types_.get(name, "")))
        if value is None and nested is not None:
            keys += section_keys(_defaults(nested), nested, key)
    return keys


def sections() -> list[tuple[str, type, list[Key]]]:
    """(section, its dataclass, its keys) for each section of the job, in file order."""
    resolved = to_dict(load_job(None))
    default = JobConfig()
    return [(name, type(getattr(default, name)),
             section_keys(values, type(getattr(default, name)), name))
            for name, values in resolved.items()]


def _mentions(srcdir: str) -> dict[str, str]:
    """Each page's text, by name, but this one's."""
    pages = {}
    for path in sorted(glob.glob(os.path.join(srcdir, "*.md"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name != "reference":
            with open(path) as f:
                pages[name] = f.read()
    return pages


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(srcdir: str) -> str:
    """The generated part of reference.md: a table per section."""
    pages = _mentions(srcdir)
    out = []
    for name, cls, keys in sections():
        out += [f"## `{name}`", "", "```text", inspect.cleandoc(cls.__doc__ or ""), "```", "",
                "| key | default | type | explained in |", "| --- | --- | --- | --- |"]
        for k in keys:
            where = ", ".join(f"[{page}]({page}.md)" for page, text in pages.items()
                              if f"`{k.key}`" in text or f"`{k.key}:" in text)
            out.append(f"| `{k.key}` | `{_cell(k.default)}` | {_cell(k.type)} | {where} |")
        out.append("")
    return "\n".join(out)


def _fill(app: Any, docname: str, source: list[str]) -> None:
    if docname == "reference":
        assert MARKER in source[0], f"reference.md lost its marker line {MARKER!r}"
        source[0] = source[0].replace(MARKER, markdown(app.srcdir))


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
