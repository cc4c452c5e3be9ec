"""The data sources, one module each, by ``data.source``: what each format gives, checks
and reads (``base.Source``). A source's job-file side, the data keys it uses, is its
line in ``launch.config.SOURCE_KEYS``."""

from launch.config import DataConfig
from launch.data.errors import DataError
from launch.data.sources.base import DataSpec, Shard, Source
from launch.data.sources.builtin import Builtin
from launch.data.sources.csv import Csv
from launch.data.sources.npz import Npz
from launch.data.sources.synthetic import Synthetic
from launch.data.sources.tfrecord import TfRecord

# Every data.source; launch.config.SOURCE_KEYS has the same names.
SOURCES: dict[str, type[Source]] = {s.name: s for s in (Synthetic, Builtin, Npz, Csv, TfRecord)}


def source_of(cfg: DataConfig) -> Source:
    """The source that reads data section ``cfg``; DataError for an unknown one."""
    if cfg.source not in SOURCES:
        raise DataError(f"unknown data source {cfg.source!r}; accepted: {', '.join(SOURCES)}")
    return SOURCES[cfg.source](cfg)


__all__ = ["SOURCES", "DataSpec", "Shard", "Source", "source_of"]
