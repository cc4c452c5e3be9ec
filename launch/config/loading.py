"""Reading a job: YAML text and ``--set`` overrides in, a checked ``JobConfig`` out.

``load_job`` reads a file, applies ``--set key=value`` overrides and returns a
``JobConfig``; ``from_dict`` does the same for data already parsed; ``to_dict`` and
``dump_yaml`` turn a job back into plain data / YAML that reads back to an equal job;
``raw_job`` is the file and overrides as written, before any check.

Every failure is one ``ConfigError`` line naming where the bad value came from (the
file, or ``--set`` when an override set the key or one it depends on), the dotted key,
what is wrong and what is accepted.

YAML is read with ``yaml.SafeLoader`` plus two changes: duplicate keys are an error
(merge keys ``<<`` are not duplicates), and ``1e-7`` (an exponent without a dot) is a
float as in YAML 1.2, not the string PyYAML makes of it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import yaml

from launch.config.arrangements import check_arrangement, respelled
from launch.config.checks import Invalid, build, describe, join
from launch.config.job import JobConfig
from launch.config.model_section import ModelConfig
from launch.errors import BadInput
from launch.log import log

__all__ = ["ConfigError", "dump_yaml", "from_dict", "load_job", "raw_job", "to_dict"]

BUILTIN_SOURCE = "<built-in>"
OVERRIDE_SOURCE = "--set"


class ConfigError(BadInput):
    """A bad job file or override, as one line: ``SOURCE: KEY: MESSAGE``.

    source: the job file's path, ``'<built-in>'`` or ``'--set'`` (an override).
    key: the dotted key, e.g. ``'optimizer.name'``; ``''`` when the problem is the file
        itself (unreadable, YAML syntax, top level not a mapping), and then omitted from
        ``str(e)``.
    message: what is wrong and what is accepted.
    """

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(source, key, _one_line(message))
        self.source = source
        self.key = key
        self.message = _one_line(message)

    def __str__(self) -> str:
        if self.key:
            return f"{self.source}: {self.key}: {self.message}"
        return f"{self.source}: {self.message}"


def _one_line(text: str) -> str:
    """Runs of whitespace (newlines too) as single spaces: a ConfigError is one line."""
    return " ".join(str(text).split())


# ---------------------------------------------------------------------------------------
# YAML: a SafeLoader that rejects duplicate keys and reads 1e-7 as a float.

_FLOAT_WITH_EXPONENT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping repeats a key; ``key`` is the dotted path of the repeated key."""

    def __init__(self, key: str, line: int, first_line: int, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"duplicate key {key!r} (first on line {first_line})", mark)
        self.key, self.line, self.first_line = key, line, first_line


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader, but a repeated key in a mapping is an error.

    Records the dotted path of every node it sees so the error can name the full key.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._paths: dict[int, str] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            prefix = self._paths.get(id(node), "")
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first_line = seen.get(key)
                except TypeError:  # unhashable key: the base class reports it
                    continue
                path = join(prefix, str(key))
                line = key_node.start_mark.line + 1
                if first_line is not None:
                    raise _DuplicateKeyError(path, line, first_line, key_node.start_mark)
                seen[key] = line
                self._paths[id(value_node)] = path
        return super().construct_mapping(node, deep=deep)

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> list:
        prefix = self._paths.get(id(node), "")
        for i, child in enumerate(getattr(node, "value", ())):
            self._paths[id(child)] = f"{prefix}[{i}]"
        return super().construct_sequence(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    """yaml.SafeDumper that writes lists of scalars inline ([64, 64]) and quotes strings
    _Loader would read as floats (e.g. '1e3')."""

    def represent_list(self, data: list) -> yaml.SequenceNode:
        inline = all(not isinstance(x, dict | list | set) for x in data)
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=inline)


_Dumper.add_representer(list, _Dumper.represent_list)

for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float", _FLOAT_WITH_EXPONENT, list("-+0123456789")
    )


def _parse_yaml(text: str, source: str, key: str = "") -> Any:
    """YAML text to plain data; syntax errors and duplicate keys become ConfigError."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except _DuplicateKeyError as e:
        raise ConfigError(
            source, join(key, e.key), f"duplicate key on line {e.line} (first on line "
            f"{e.first_line}); each key may appear once per mapping"
        ) from None
    except yaml.MarkedYAMLError as e:
        where = ""
        if e.problem_mark is not None:
            where = f" at line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1}"
        context = f" ({e.context})" if e.context else ""
        raise ConfigError(source, key, f"invalid YAML{where}: {e.problem}{context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(source, key, f"invalid YAML: {e}") from None
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------
# Files and overrides to raw data.


def _read_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(path, "", "cannot read job file: no such file") from None
    except IsADirectoryError:
        raise ConfigError(path, "", "cannot read job file: it is a directory") from None
    except PermissionError:
        raise ConfigError(path, "", "cannot read job file: permission denied") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, "", f"cannot read job file: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise ConfigError(path, "", f"cannot read job file: {e.strerror or e}") from None
    return _parse_yaml(text, path)


def _apply_override(raw: dict[str, Any], override: str) -> str:
    """Set one 'a.b=c' override into raw (in place); returns the dotted key."""
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or not all(p.strip() for p in parts):
        raise ConfigError(
            OVERRIDE_SOURCE, key, f"malformed override {override!r}; expected KEY=VALUE "
            "with a dotted key, e.g. train.steps=100"
        )
    parts = [p.strip() for p in parts]
    value = _parse_yaml(text, OVERRIDE_SOURCE, key)
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                OVERRIDE_SOURCE, key, f"cannot set a key inside {where}, which is "
                f"{describe(child)}, not a mapping"
            )
        node = child
    node[parts[-1]] = value
    return ".".join(parts)


# ---------------------------------------------------------------------------------------
# Raw data to a JobConfig, each failure attributed to the file or to --set.


def _source_of(error: Invalid, base: str, overridden: Iterable[str]) -> str:
    """'--set' if the failing key (or one it depends on) was set by an override."""
    for key in (error.key, *error.related):
        for done in overridden:
            if key == done or key.startswith(done + ".") or done.startswith(key + "."):
                return OVERRIDE_SOURCE
    return base


def _model_error_key(error: Exception, params: Mapping[str, Any]) -> str:
    """'model.<param>' when the callback's error names exactly one given parameter."""
    explicit = getattr(error, "key", None) or getattr(error, "param", None)
    if isinstance(explicit, str) and explicit:
        return explicit if explicit.startswith("model") else f"model.{explicit}"
    if isinstance(error, LookupError):
        return "model.name"
    named = [p for p in params if re.search(rf"\b{re.escape(p)}\b", str(error))]
    return f"model.{named[0]}" if len(named) == 1 else "model"


def _error_text(error: Exception) -> str:
    if isinstance(error, ConfigError):
        return error.message
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error) or type(error).__name__


def _check_top_level(raw: Any, source: str) -> None:
    if raw is not None and not isinstance(raw, dict):
        sections = ", ".join(f.name for f in fields(JobConfig))
        raise ConfigError(
            source, "", f"the top level must be a mapping of sections ({sections}), "
            f"got {describe(raw)}"
        )


def _make_job(
    raw: Any,
    source: str,
    overridden: Sequence[str],
    check_model: Callable[[ModelConfig], None] | None,
    job_dir: str | None = None,
    arrangement: Callable[[JobConfig], str] | None = None,
) -> JobConfig:
    _check_top_level(raw, source)
    try:
        raw, overridden = _respell(raw, source, overridden)
        job = build(JobConfig, raw)
        check_arrangement(job, arrangement(job) if arrangement else job.cluster.backend)
    except Invalid as e:
        raise ConfigError(_source_of(e, source, overridden), e.key, e.message) from None
    if job_dir is not None:
        job = dataclasses.replace(job, model=dataclasses.replace(job.model, job_dir=job_dir))
    if check_model is not None:
        try:
            check_model(job.model)
        except BadInput as e:
            if getattr(e, "details", None):
                raise  # the user's own code failed: its traceback is the message
            _raise_model_error(e, job, source, overridden)
        except (ValueError, LookupError) as e:
            _raise_model_error(e, job, source, overridden)
    return job


def _respell(raw: Any, source: str, overridden: Sequence[str]) -> tuple[Any, Sequence[str]]:
    """The job with an old spelling read as its new one (launch.config.arrangements), said
    once in a note; a key the old spelling set by --set counts as set by --set."""
    raw, note = respelled(raw or {})
    if note is None:
        return raw, overridden
    log(f"note: {note}")
    if _source_of(Invalid("", "towers.variable_update"), source, overridden) == OVERRIDE_SOURCE:
        overridden = [*overridden, "cluster.backend"]
    return raw, overridden


def _raise_model_error(error: Exception, job: JobConfig, source: str,
                       overridden: Sequence[str]) -> None:
    key = _model_error_key(error, job.model.params)
    where = _source_of(Invalid("", key), source, overridden)
    raise ConfigError(where, key, _error_text(error)) from error


def _thaw(value: Any) -> Any:
    """Plain, YAML-serialisable copy: dataclasses and mappings -> dicts, tuples -> lists."""
    if isinstance(value, ModelConfig):
        return {"name": value.name, "path": value.path, **_thaw(value.params)}
    if dataclasses.is_dataclass(value):
        return {f.name: _thaw(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, frozenset):
        return set(value)
    return value


# ---------------------------------------------------------------------------------------
# Public API.


def load_job(
    path: str | None,
    overrides: Sequence[str] = (),
    *,
    arrangement: Callable[[JobConfig], str] | None = None,
    check_model: Callable[[ModelConfig], None] | None = None,
) -> JobConfig:
    """Read, override and validate a job file; ``path=None`` starts from the built-in job.

    overrides: ``"a.b=c"`` strings applied in order; each value is YAML (``100``,
        ``null``, ``[/cpu:0,/cpu:1]``) and missing mappings on the way are created.
    The job's ``model.job_dir`` is the file's directory (absolute), where the model's
    code is also looked for. ``towers.variable_update: horovod`` is read as
    ``cluster.backend: horovod``, with a note saying so.
    arrangement: the name of the arrangement the job runs under, from the checked job
        (launch.config.arrangements.choose: for cluster.backend auto, the command's
        choice from the cluster); the job is checked against it (what it refuses is a
        ConfigError like any other) before check_model. None: the arrangement
        cluster.backend names, if it names one.
    check_model: called once, last, as ``check_model(job.model)``; a ValueError or
        LookupError (KeyError: unknown model) it raises becomes a ConfigError keyed
        ``model.<param>`` when the message names exactly one given parameter (or the
        exception has a ``param`` or ``key`` attribute), ``model.name`` for a LookupError,
        else ``model``. A BadInput with ``details`` (a traceback of the user's own code)
        passes through unchanged.

    Raises ConfigError for an unreadable file, bad YAML, or any invalid key or value.
    """
    raw = raw_job(path)
    overridden = [_apply_override(raw, o) for o in overrides]
    job_dir = None if path is None else os.path.dirname(os.path.abspath(str(path)))
    source = BUILTIN_SOURCE if path is None else str(path)
    return _make_job(raw, source, overridden, check_model, job_dir, arrangement)


def raw_job(path: str | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The job file's mapping (``path=None``: the built-in job's, empty) with the
    overrides applied, as written: no defaults, values unchecked (`towers tune`)."""
    raw = {} if path is None else _read_file(str(path))
    raw = {} if raw is None else raw  # an empty file is the default job
    _check_top_level(raw, BUILTIN_SOURCE if path is None else str(path))
    for override in overrides:
        _apply_override(raw, override)
    return raw


def from_dict(
    data: Mapping[str, Any],
    *,
    source: str = "<dict>",
    arrangement: Callable[[JobConfig], str] | None = None,
    check_model: Callable[[ModelConfig], None] | None = None,
) -> JobConfig:
    """Validate an already-parsed job (e.g. ``to_dict`` output) as load_job would a file."""
    raw = _thaw(data) if isinstance(data, Mapping) else data
    return _make_job(raw, source, (), check_model, arrangement=arrangement)


def to_dict(job: JobConfig) -> dict[str, Any]:
    """The resolved job as plain dicts, lists and scalars, in schema order.

    ``load_job`` of its YAML gives back an equal JobConfig.
    """
    return _thaw(job)


def dump_yaml(job: JobConfig | Mapping[str, Any]) -> str:
    """The job (or raw_job's mapping) as YAML that load_job reads back to an equal job."""
    return yaml.dump(
        to_dict(job) if isinstance(job, JobConfig) else job, Dumper=_Dumper,
        sort_keys=False, default_flow_style=False, allow_unicode=True,
    )
