#!/usr/bin/env bash
# Builds horovod 0.28.1 against the installed TensorFlow and installs it.
#
# Why a build step at all: 0.28.1 is horovod's last release, and as shipped it
# does not compile against TensorFlow 2.21. Its optional XLA op
# (horovod/tensorflow/xla_mpi_ops.cc) includes a header TF 2.21 no longer
# ships, so we drop that one source file. towers never uses horovod's XLA ops.
#
# The wheel is cached (TOWERS_WHEEL_CACHE, default ~/.cache/towers/wheels),
# keyed by the TensorFlow version, so a second install takes seconds.
# Builds with Gloo only (no MPI, PyTorch or MXNet); NCCL is picked up when
# HOROVOD_GPU_OPERATIONS=NCCL is set, as docker/Dockerfile.gpu does.
set -euo pipefail

HOROVOD_VERSION=0.28.1
python=${PYTHON:-python}
cache=${TOWERS_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/towers/wheels}
tf_version=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" -c 'import tensorflow as tf; print(tf.__version__)')
variant=tf${tf_version}-${HOROVOD_GPU_OPERATIONS:-cpu}
wheel_dir=$cache/horovod-$HOROVOD_VERSION-$variant

if "$python" -c 'import horovod.tensorflow' 2>/dev/null; then
    echo "horovod is already installed"
    exit 0
fi

if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    echo "building horovod $HOROVOD_VERSION for TensorFlow $tf_version (several minutes)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$python" -m pip download --quiet --no-deps --no-binary :all: \
        "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
    src=$work/horovod-$HOROVOD_VERSION
    sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    "$python" -m pip install --quiet cloudpickle psutil pyyaml packaging cffi
    mkdir -p "$wheel_dir"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        MAKEFLAGS=-j"$(nproc)" \
        "$python" -m pip wheel --quiet --no-build-isolation --no-deps \
        -w "$wheel_dir" "$src"
fi

"$python" -m pip install --quiet "$wheel_dir"/horovod-*.whl
"$python" -c 'import importlib.metadata as m; print("horovod", m.version("horovod"), "installed")'
