"""TFRecord files checked whole against a schema, remembered across runs: a start reads
and checks every record of its files (9.4-9.8 s a GiB measured), and a restart on the
same files found nothing new. So each file checked clean (no bad record) is kept in
launch.cache's directory, keyed by its path, its state (size, modification time and
last record's frame, as its kept record index has it: launch.data.index_file) and the
schema; a later check skips it while all of those hold, and takes its count of records.

A file without a kept index (a remote one, or in a directory towers cannot write) is
checked at every start, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping

from launch import cache
from launch.data import index_file

FILE = "checked-records.json"
KEPT = 10_000  # files remembered at most (the latest)


def _path() -> str:
    return os.path.join(cache.cache_dir(), FILE)


def _key(name: str, schema: object) -> str | None:
    """The file's key now, None without a kept index that matches it."""
    stored = index_file.load(name)
    if stored is None:
        return None
    state = stored.state
    what = [os.path.realpath(name) if index_file.is_local(name) else name, state.size,
            state.mtime_ns, state.last_frame.hex(), repr(schema)]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def recalled(files: Iterable[str], schema: object) -> dict[str, int]:
    """Of `files`, those checked clean against `schema` before and unchanged since:
    {file: its records}."""
    kept = cache.read_json(_path())
    found = {}
    for name in files:
        key = _key(name, schema)
        if key is not None and isinstance(kept.get(key), int):
            found[name] = kept[key]
    return found


def remember(records: Mapping[str, int], schema: object) -> None:
    """`records` ({file: its records}) were checked clean against `schema`."""
    keys = {key: count for name, count in records.items()
            if (key := _key(name, schema)) is not None}
    if not keys:
        return
    path = _path()
    with cache.locked(path):
        kept = {**cache.read_json(path), **keys}
        cache.write_json(path, dict(list(kept.items())[-KEPT:]))
