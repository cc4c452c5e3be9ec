"""Whether Horovod can run here, for tests: the product's own probe
(launch.bench.runs.horovod_missing: horovodrun on the PATH, and horovod.tensorflow
imports in a fresh Python), asked at most once per test process and only when a test
needs the answer. Not at import: the probe is a process that imports TensorFlow (about
3 s), and every test worker imports the modules it collects, e2e or not."""

import functools

import pytest

from launch.bench.runs import horovod_missing


@functools.cache
def missing() -> str | None:
    """Why Horovod cannot run here, or None if it can."""
    return horovod_missing()


class _Missing:
    """True where Horovod cannot run; pytest asks a skipif condition's truth when a test
    that carries it is set up."""

    def __bool__(self) -> bool:
        return missing() is not None


needs_horovod = pytest.mark.skipif(
    _Missing(), reason="horovod is not installed (`make horovod` builds it)")
