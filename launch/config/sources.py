"""What the data section may say for each data source: the job-file side of a source.

One line per ``data.source``: whether it reads files (``data.path`` required,
``data.eval_path`` allowed) and which of the keys only some sources use are its own.
What a source reads, checks and makes is its module of the same name in
``launch/data/sources/``; this side needs no TensorFlow, so a job file's mistakes are
found before it is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from launch.config.checks import Invalid


@dataclass(frozen=True)
class SourceKeys:
    """The data keys one source uses.

    files: it reads files: data.path is required and data.eval_path may be set.
    keys: the data keys that only some sources use, this one among them.
    hints: key -> where this source takes what that key would say (for messages).
    """

    files: bool = False
    keys: tuple[str, ...] = ()
    hints: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


# Every data.source, in the order messages list them.
SOURCE_KEYS: Mapping[str, SourceKeys] = MappingProxyType({
    "synthetic": SourceKeys(),
    "builtin": SourceKeys(),
    "npz": SourceKeys(files=True, keys=("num_classes",)),
    "csv": SourceKeys(files=True, keys=("feature_columns", "num_classes")),
    "tfrecord": SourceKeys(files=True, keys=("schema",), hints=MappingProxyType(
        {"num_classes": "a TFRecord source states it in data.schema.num_classes"})),
})


def check_source_keys(values: dict[str, Any]) -> None:
    """The data section's checked values against its source: what the source requires,
    and keys set (not None) that only other sources use, the first in the section's
    order named."""
    source = values["source"]
    keys = SOURCE_KEYS[source]
    file_sources = [name for name, other in SOURCE_KEYS.items() if other.files]
    if keys.files and values["path"] is None:
        raise Invalid(f"required when data.source is {source!r}", "path", ["source"])
    for key in () if keys.files else ("path", "eval_path"):
        if values[key] is not None:
            raise Invalid(f"only used when data.source is one of {', '.join(file_sources)}, "
                          f"but it is {source!r} (set data.source or remove {key})", key,
                          ["source"])
    for key in values:
        users = [repr(name) for name, other in SOURCE_KEYS.items() if key in other.keys]
        if users and key not in keys.keys and values[key] is not None:
            hint = f" ({keys.hints[key]})" if key in keys.hints else ""
            raise Invalid(f"only used when data.source is {' or '.join(users)}, but it is "
                          f"{source!r}{hint}", key, ["source"])

