"""What a towers process loads with TensorFlow, which allocator holds its host memory, and
which CPU kernels it runs (cpu_kernels: what its figures and cached timings are filed
under).

Two choices made as TensorFlow starts (launch.log.quiet_tensorflow, which every towers
process calls first), each measured against tf_cnn_benchmarks on the same job
(BENCHMARKS.md, "Memory against tf_cnn_benchmarks"):

- `import tensorflow` imports Keras' optimizers (so that their registrations run at
  load time) and with them all of Keras 3, which imports matplotlib and IPython where
  they are installed; TensorFlow's own legacy Keras imports scipy. A towers process
  uses none of them unless its model does, and a model that uses Keras imports it when
  it is resolved, registrations and all. Skipping them saves about 77 MB of resident
  memory and 0.9 s of every process's start. The same legacy Keras imports h5py (and
  the HDF5 library with it) for saving its own models to .h5, which towers never
  does: 10 MB more (measured as the peak RSS of `import tensorflow`, 470 against
  460 MB). Keras 3 imports h5py itself where a model needs it.
- Keras 3 in turn, imported by a model that uses it, tries matplotlib (for
  keras.visualization's image gallery) and IPython (for the saving file editor's
  notebook display) and goes on without them where they are missing. A towers process
  calls neither, so Keras' own imports of them are refused (RefusedToKeras), from the
  start of every towers process: Keras imported after TensorFlow took 0.30 s of CPU
  and a peak RSS of 489 MB against 1.24 s and 538 MB (BENCHMARKS.md, "Keras' optional
  imports"). Anyone else's import of them, a model's own, goes on as usual.
- Without oneDNN (TensorFlow turns it off on x86 CPUs without AVX-512 VNNI, BF16 or
  AMX, or with TF_ENABLE_ONEDNN_OPTS=0) a step's convolution gradients take temporary
  buffers of tens of MB from several threads, and glibc's heaps, which keep what they
  freed, held resnet20's peak at 1.5x the step's live bytes. TensorFlow's BFC allocator
  reuses its own blocks for the same shapes step after step: the same job peaked 30%
  lower, and stepped no slower. With oneDNN on, glibc did better than BFC (its peak
  was 5% lower), so it is kept. TF_CPU_ALLOCATOR_USE_BFC set in the environment is
  always obeyed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys
from collections.abc import Iterator

# Modules TensorFlow tries to import as it loads, falling back when they are missing.
UNUSED_AT_IMPORT = ("keras.src.optimizers", "tf_keras.src.optimizers", "scipy.sparse", "h5py")
# Modules Keras 3 tries to import, for helpers a training process never calls, falling back
# when they are missing.
OPTIONAL_FOR_KERAS = ("matplotlib", "IPython")

# oneDNN's settings of its own that change which kernels it picks, read once as it
# loads. They matter with TensorFlow's oneDNN kernels off too: TensorFlow's own kernels
# do their matrix products in oneDNN's sgemm, which picks its instructions (AVX-512,
# AVX2) from the CPU at run time unless ONEDNN_MAX_CPU_ISA holds it lower (BENCHMARKS.md,
# "The default job as an AVX2-only CPU runs it"). DNNL_ is oneDNN's older prefix.
ONEDNN_SETTINGS = tuple(f"{prefix}_{name}" for name in ("MAX_CPU_ISA", "CPU_ISA_HINTS",
                                                        "DEFAULT_FPMATH_MODE")
                        for prefix in ("ONEDNN", "DNNL"))

BFC_ENV = "TF_CPU_ALLOCATOR_USE_BFC"
# TensorFlow's BFC host allocator refuses to grow past this many MiB (default 64 GiB);
# towers raises it to the host's memory, so a job that fits the host fits the allocator.
BFC_LIMIT_ENV = "TF_CPU_BFC_MEM_LIMIT_IN_MB"


@contextlib.contextmanager
def unused_imports_skipped(names: tuple[str, ...] = UNUSED_AT_IMPORT) -> Iterator[None]:
    """Inside the block, importing one of `names` (not yet imported) fails at once, so
    code that tries it carries on without; after the block it imports as usual."""
    skipped = [name for name in names if name not in sys.modules]
    for name in skipped:
        sys.modules[name] = None  # the import system's own "not importable" mark
    try:
        yield
    finally:
        for name in skipped:
            if sys.modules.get(name, "") is None:
                del sys.modules[name]


class RefusedToKeras(importlib.abc.MetaPathFinder):
    """An import finder that refuses the packages `names` (and their modules) to an import
    statement in Keras' own code, as if they were not installed; an import of them
    anywhere else is left to the other finders."""

    def __init__(self, names: tuple[str, ...] = OPTIONAL_FOR_KERAS):
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path=None, target=None) -> None:
        if fullname.partition(".")[0] in self.names and _importer().partition(".")[0] == "keras":
            raise ModuleNotFoundError(f"{fullname} is not imported for Keras in a towers "
                                      "process (launch.tf_process)", name=fullname)
        return None


def _importer() -> str:
    """The name of the module whose code runs the import under way: the first frame
    outside the import system's own."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def refuse_to_keras() -> None:
    """From now on in this process, Keras' own imports of OPTIONAL_FOR_KERAS fail (once,
    however often it is called)."""
    if not any(isinstance(finder, RefusedToKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, RefusedToKeras())


def choose_host_allocator() -> str:
    """Sets the host allocator TensorFlow creates at its first allocation (call before
    any session or eager op): BFC where oneDNN is off, else glibc's, unless the
    environment already says. Returns 'bfc' or 'malloc', the one in force."""
    if BFC_ENV not in os.environ and not _onednn_on():
        os.environ[BFC_ENV] = "true"
        os.environ.setdefault(BFC_LIMIT_ENV, str(_host_mib()))
    return "bfc" if os.environ.get(BFC_ENV, "").lower() in ("1", "true") else "malloc"


def cpu_kernels() -> str:
    """Which CPU kernels TensorFlow runs in this process, as a figure or a cached timing
    must name them: 'oneDNN on' or 'oneDNN off', then oneDNN's own settings where set
    (ONEDNN_SETTINGS), e.g. 'oneDNN off, ONEDNN_MAX_CPU_ISA=AVX2'. The CPU's model and
    flags are not in it."""
    settings = [f"{name}={os.environ[name]}" for name in ONEDNN_SETTINGS
                if os.environ.get(name)]
    return ", ".join([f"oneDNN {'on' if _onednn_on() else 'off'}", *settings])


def _onednn_on() -> bool:
    """Whether TensorFlow runs its oneDNN kernels in this process (its build, this CPU
    and TF_ENABLE_ONEDNN_OPTS decide); True where that cannot be read."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return True
    return bool(_pywrap_util_port.IsMklEnabled())


def _host_mib() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError):
        return 1 << 16  # TensorFlow's own default
