"""Value checks: each takes a raw YAML value and returns it normalised, or raises ``Invalid``.

A check is any ``Check = Callable[[Any], Any]``. The simple ones (``boolean``,
``string``, ``device_string`` ...) are checks themselves; the combinators (``number``,
``choice``, ``optional``, ``tuple_of``, ``unique``, ``auto_or``) build one from options
or from other checks. ``checked_field`` attaches one to a dataclass field, and
``build`` makes the dataclass from a mapping by running its fields' checks and the
section's ``cross_check``; the sections themselves are in ``launch.config.job`` and
the modules it imports.

``Invalid`` carries a key relative to the value checked; whoever holds the value adds
its own name on the way up (``Invalid.under``), so the loader can report the full dotted
key without any check knowing where it sits in the job.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field, fields
from types import MappingProxyType
from typing import Any

__all__ = [
    "AUTO",
    "Check",
    "CrossCheck",
    "DEVICE_RE",
    "Invalid",
    "MAX_SEED",
    "accepted",
    "auto_or",
    "boolean",
    "build",
    "checked_field",
    "choice",
    "describe",
    "device_list",
    "device_string",
    "device_count_or_list",
    "freeze",
    "gpu_ids",
    "host_port",
    "join",
    "named_or_device",
    "number",
    "optional",
    "positive_int",
    "prefix_map",
    "regex",
    "section_field",
    "string",
    "tuple_of",
    "unique",
]

AUTO = "auto"
MAX_SEED = 2**31 - 1  # seeds TensorFlow and NumPy both take
DEVICE_RE = re.compile(
    r"(/job:[\w-]+(/replica:\d+)?(/task:\d+)?)?/(device:)?(cpu|gpu|CPU|GPU|tpu|TPU):\d+"
)
_HOST_PORT_RE = re.compile(r"(\[[0-9a-fA-F:]+\]|[\w.\-]+):(\d{1,5})")

Check = Callable[[Any], Any]
# A section's cross-field check: gets the checked values (and may adjust them before the
# dataclass is made) and the raw mapping (to see what was given); raises Invalid.
CrossCheck = Callable[[dict[str, Any], Mapping[str, Any]], None]


class Invalid(Exception):
    """A failed check; ``key`` is relative to the value checked and grows on the way up.

    related: other relative keys the failure depends on, so an error caused by an
    override is reported against ``--set`` even if the key named came from the file.
    """

    def __init__(self, message: str, key: str = "", related: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.related = tuple(related)

    def under(self, prefix: str) -> Invalid:
        """The same failure seen from the mapping that holds ``prefix``."""
        return Invalid(
            self.message, join(prefix, self.key), [join(prefix, r) for r in self.related]
        )


# ---------------------------------------------------------------------------------------
# Small helpers for messages.


def join(prefix: str, key: str) -> str:
    """Dotted key ``prefix.key``; either part may be empty."""
    return f"{prefix}.{key}" if prefix and key else prefix or key


def describe(value: Any) -> str:
    """What was got, for 'expected X, got Y' messages: type name and a short repr."""
    if value is None:
        return "null"
    kind = {dict: "mapping", list: "list"}.get(type(value), type(value).__name__)
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}"


def accepted(got: str, options: Iterable[str], extra: str = "") -> str:
    """'accepted: a, b, c (did you mean 'b'?)' with the closest option, if any."""
    options = sorted(options)
    text = "accepted: " + ", ".join(options) + extra
    close = difflib.get_close_matches(got, options, n=1)
    if close:
        text += f" (did you mean {close[0]!r}?)"
    return text


def _bounds_text(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    """'> 0', '>= 0', 'in [0, 1)', 'in (0, 1]' ..."""
    low = f"({gt!r}" if gt is not None else f"[{ge!r}" if ge is not None else ""
    high = f"{lt!r})" if lt is not None else f"{le!r}]" if le is not None else ""
    if low and high:
        return f"in {low}, {high}"
    if low:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    return ("<= " if high[-1] == "]" else "< ") + high[:-1]


# ---------------------------------------------------------------------------------------
# Scalars and combinators.


def number(kind: type, *, gt: float | None = None, ge: float | None = None,
           lt: float | None = None, le: float | None = None) -> Check:
    """An int (``kind=int``) or a finite float (``kind=float``; ints accepted) in bounds."""
    expected = "an integer" if kind is int else "a number"
    accepted_types = (int,) if kind is int else (int, float)

    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, accepted_types):
            raise Invalid(f"expected {expected}, got {describe(value)}")
        try:
            value = kind(value)
        except OverflowError:  # an int too large for a float
            raise Invalid(f"expected a finite number, got {describe(value)}") from None
        if not math.isfinite(value):
            raise Invalid(f"expected a finite number, got {value}")
        if ((gt is not None and not value > gt) or (ge is not None and not value >= ge)
                or (lt is not None and not value < lt) or (le is not None and not value <= le)):
            raise Invalid(f"must be {_bounds_text(gt, ge, lt, le)}, got {value!r}")
        return value

    return check


def boolean(value: Any) -> bool:
    """true or false; YAML's yes/no/1/0 are not booleans here."""
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {describe(value)}")
    return value


def string(value: Any) -> str:
    """A non-empty string; numbers and booleans must be quoted in YAML to be strings."""
    if not isinstance(value, str):
        hint = " (quote it to make it a string)" if isinstance(value, int | float) else ""
        raise Invalid(f"expected a string, got {describe(value)}{hint}")
    if not value.strip():
        raise Invalid("must not be empty")
    return value


def optional(check: Check) -> Check:
    """null, or whatever ``check`` accepts."""
    return lambda value: None if value is None else check(value)


def choice(*options: str) -> Check:
    """One of a fixed set of strings."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Invalid(f"expected one of {', '.join(sorted(options))}, got {describe(value)}")
        if value not in options:
            raise Invalid(f"unknown value {value!r}; {accepted(value, options)}")
        return value

    return check


def auto_or(check: Check, expected: str) -> Check:
    """The string 'auto', or whatever ``check`` accepts (described by ``expected``)."""

    def check_auto_or(value: Any) -> Any:
        if isinstance(value, str) and value == AUTO:
            return AUTO
        try:
            return check(value)
        except Invalid:
            raise Invalid(f"expected 'auto' or {expected}, got {describe(value)}") from None

    return check_auto_or


def tuple_of(item: Check, *, allow_single: bool = False, non_empty: bool = False) -> Check:
    """A list whose items each pass ``item``, as a tuple; a bare item if ``allow_single``."""

    def check(value: Any) -> tuple[Any, ...]:
        if allow_single and not isinstance(value, list):
            return (item(value),)
        if not isinstance(value, list):
            raise Invalid(f"expected a list, got {describe(value)}")
        if non_empty and not value:
            raise Invalid("must not be an empty list")
        result = []
        for i, element in enumerate(value):
            try:
                result.append(item(element))
            except Invalid as e:
                raise Invalid(f"item {i}: {e.message}") from None
        return tuple(result)

    return check


def unique(check: Check) -> Check:
    """``check``, then reject repeated items."""

    def check_unique(value: Any) -> Any:
        result = check(value)
        if isinstance(result, tuple):
            repeated = sorted({str(x) for x in result if result.count(x) > 1})
            if repeated:
                raise Invalid(f"repeated: {', '.join(repeated)}")
        return result

    return check_unique


# ---------------------------------------------------------------------------------------
# Formats: devices, addresses, regexes, mappings.


def device_string(value: Any) -> str:
    """A TensorFlow device such as '/gpu:0' or '/job:worker/task:0/device:GPU:0'."""
    if not isinstance(value, str) or not DEVICE_RE.fullmatch(value):
        raise Invalid(
            f"expected a device string such as '/gpu:0', '/cpu:1' or "
            f"'/job:worker/task:0/device:GPU:0', got {describe(value)}"
        )
    return value


positive_int = number(int, gt=0)
device_list = unique(tuple_of(device_string, allow_single=True, non_empty=True))


def device_count_or_list(value: Any) -> str | int | tuple[str, ...]:
    """'auto', a positive device count, or a list of device strings (one bare string too)."""
    if isinstance(value, str) and value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool):
        return positive_int(value)
    if isinstance(value, str | list):
        return device_list(value)
    raise Invalid(
        "expected 'auto', a positive device count or a list of device strings such as "
        f"['/gpu:0', '/gpu:1'], got {describe(value)}"
    )


def named_or_device(*names: str) -> Check:
    """One of ``names`` (e.g. cpu, gpu, least_loaded) or an explicit device string."""

    def check(value: Any) -> str:
        if isinstance(value, str) and (value in names or DEVICE_RE.fullmatch(value)):
            return value
        if not isinstance(value, str):
            raise Invalid(f"expected a string, got {describe(value)}")
        extra = " or a device string such as '/gpu:1'"
        raise Invalid(f"unknown value {value!r}; {accepted(value, names, extra)}")

    return check


def host_port(value: Any) -> str:
    """'host:port' with a port in 1..65535 ('[::1]:port' for IPv6)."""
    match = _HOST_PORT_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise Invalid(f"expected 'host:port' such as '10.0.0.5:2222', got {describe(value)}")
    return value


def gpu_ids(value: Any) -> str:
    """GPU ids as '0,1', [0, 1] or 0, normalised to '0,1'."""
    if isinstance(value, int) and not isinstance(value, bool):
        ids = [value]
    elif isinstance(value, list) and value:
        ids = list(value)
    elif isinstance(value, str) and all(p.strip().isdigit() for p in value.split(",")):
        ids = [int(p) for p in value.split(",")]
    else:
        raise Invalid(
            "expected a comma-separated string of GPU ids such as '0,1' or a list of ints, "
            f"got {describe(value)}"
        )
    ids = unique(tuple_of(number(int, ge=0)))(ids)
    return ",".join(str(i) for i in ids)


def regex(value: Any) -> str:
    """A string that compiles as a Python regular expression."""
    value = string(value)
    try:
        re.compile(value)
    except re.error as e:
        raise Invalid(f"invalid regular expression {value!r}: {e}") from None
    return value


def prefix_map(value: Any) -> Mapping[str, str]:
    """{old_prefix: new_prefix}, as a read-only mapping."""
    if not isinstance(value, dict):
        raise Invalid(f"expected a mapping of old_prefix: new_prefix, got {describe(value)}")
    for old, new in value.items():
        if not isinstance(old, str) or not old:
            raise Invalid(f"prefixes must be non-empty strings, got key {describe(old)}")
        if not isinstance(new, str):
            raise Invalid(f"{old}: expected a string, got {describe(new)}")
    return MappingProxyType(dict(value))


def freeze(value: Any) -> Any:
    """Deep read-only copy of plain YAML data: lists -> tuples, dicts -> mapping proxies."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(value)
    return value


# ---------------------------------------------------------------------------------------
# Sections: a frozen dataclass whose fields carry their checks, built from a mapping.


def checked_field(default: Any = dataclasses.MISSING, check: Check | None = None,
                  **kwargs: Any) -> Any:
    """A dataclass field carrying the check ``build`` applies to a value from YAML."""
    return field(default=default, metadata={"check": check}, **kwargs)


def build(cls: type, raw: Any) -> Any:
    """Make section dataclass ``cls`` from its raw mapping (None means all defaults).

    Unknown keys are rejected, each given key is checked by its field's check, missing
    ones take the field default, and then the section's own ``cross_check`` (a static
    method, where it has one) sees the whole section. ``cls.members``, where set, is
    how the mapping's keys are named in messages ("key" otherwise; a job's are sections).
    """
    cross_check: CrossCheck | None = getattr(cls, "cross_check", None)
    what = getattr(cls, "members", "key")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise Invalid(f"expected a mapping of {what}s, got {describe(raw)}")
    specs = {f.name: f for f in fields(cls)}
    for name in raw:
        if not isinstance(name, str):
            raise Invalid(f"{what} names must be strings, got {describe(name)}")
        if name not in specs:
            raise Invalid(f"unknown {what}; {accepted(name, specs)}", name)
    values = {}
    for name, spec in specs.items():
        if name in raw:
            try:
                values[name] = spec.metadata["check"](raw[name])
            except Invalid as e:
                raise e.under(name) from None
        elif spec.default is not dataclasses.MISSING:
            values[name] = spec.default
        elif spec.default_factory is not dataclasses.MISSING:
            values[name] = spec.default_factory()
        else:
            raise Invalid("required", name, [""])  # blame whoever created the section
    if cross_check is not None:
        cross_check(values, raw)
    return cls(**values)


def section_field(cls: type) -> Any:
    """A field holding a whole nested section, built from a mapping (null means defaults)."""
    return field(default_factory=cls, metadata={"check": lambda value: build(cls, value)})
