"""Which devices this process can train on, which of them a job's towers use, the
session options (GPU memory policy, placement, threads) as a ConfigProto, and which
16-bit number types this host's CPU has instructions for (whether a job's kernels run
faster in them is measured: launch.kernels)."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

from launch import cpu_info
from launch.config import SessionConfig, TowersConfig
from launch.errors import BadInput
from towers import device_type

# On a host without GPUs, `devices: auto` still builds two towers on two CPU
# devices, so the default job exercises the same code path as a GPU node.
CPU_TOWERS_WITHOUT_GPU = 2

# CPU flags that mean the number type runs in hardware (oneDNN uses them).
NATIVE_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}


class DeviceError(BadInput):
    """A job asks for devices this host does not have."""


@dataclass(frozen=True)
class GpuInfo:
    logical: str  # "/gpu:0", as TensorFlow names it in this process
    physical_id: str  # the CUDA device id it maps to ("?" when unknown)
    name: str
    memory_bytes: int | None
    compute_capability: str | None


def visible_physical_ids(session: SessionConfig | None = None) -> list[str] | None:
    """Physical GPU ids in logical order, per CUDA_VISIBLE_DEVICES and session.visible_devices.

    None means no restriction is in force: logical /gpu:i is physical GPU i.
    CUDA_VISIBLE_DEVICES renumbers the GPUs the process sees (CUDA_VISIBLE_DEVICES=2,3
    makes physical 2 TensorFlow's /gpu:0); TensorFlow's visible_device_list then
    picks among those renumbered ids.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in env.split(",") if i.strip()] if env is not None else None
    if session is not None and session.visible_devices:
        picked = [int(i) for i in session.visible_devices.split(",")]
        ids = [ids[i] if ids is not None and i < len(ids) else str(i) for i in picked]
    return ids


def list_gpus(session: SessionConfig | None = None) -> list[GpuInfo]:
    """The GPUs TensorFlow sees, with names and memory where the driver reports them."""
    physical = visible_physical_ids(session)
    gpus = tf.config.list_physical_devices("GPU")
    if session is not None and session.visible_devices:
        gpus = [gpus[int(i)] for i in session.visible_devices.split(",") if int(i) < len(gpus)]
    out = []
    for i, gpu in enumerate(gpus):
        details = tf.config.experimental.get_device_details(gpu)
        capability = details.get("compute_capability")
        physical_id = physical[i] if physical and i < len(physical) else str(i)
        out.append(
            GpuInfo(
                logical=f"/gpu:{i}",
                physical_id=physical_id,
                name=details.get("device_name", "unknown GPU"),
                memory_bytes=_gpu_memory_bytes(physical_id),
                compute_capability=".".join(map(str, capability)) if capability else None,
            )
        )
    return out


def _gpu_memory_bytes(physical_id: str) -> int | None:
    """Total memory of a GPU via NVML when nvidia-ml-py is installed; None otherwise.

    NVML numbers GPUs physically, ignoring CUDA_VISIBLE_DEVICES, hence the
    physical id (a UUID in CUDA_VISIBLE_DEVICES is not looked up: None).
    """
    if not physical_id.isdigit():
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(physical_id))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError:
        return None


def tower_devices(towers: TowersConfig, num_gpus: int) -> list[str]:
    """Resolve `towers.devices` (auto, a count, or a list) to device strings."""
    spec = towers.devices
    if spec == "auto":
        if num_gpus:
            return [f"/gpu:{i}" for i in range(num_gpus)]
        return [f"/cpu:{i}" for i in range(CPU_TOWERS_WITHOUT_GPU)]
    if isinstance(spec, int):
        if num_gpus and spec > num_gpus:
            raise DeviceError(
                f"towers.devices: {spec} towers asked for, but {num_gpus} GPU(s) visible"
            )
        kind = "gpu" if num_gpus else "cpu"
        return [f"/{kind}:{i}" for i in range(spec)]
    devices = list(spec)
    for device in devices:
        if (device_type(device) == "GPU"
                and tf.DeviceSpec.from_string(device).device_index >= num_gpus):
            raise DeviceError(
                f"towers.devices: {device} does not exist; {num_gpus} GPU(s) visible"
                + (" (use /cpu:i devices on this host)" if not num_gpus else "")
            )
    return devices


def param_device(towers: TowersConfig, num_gpus: int) -> str:
    """Resolve `towers.param_device`: cpu, gpu, least_loaded, or an explicit device."""
    choice = towers.param_device
    if choice == "cpu":
        return "/cpu:0"
    if choice == "gpu":
        if not num_gpus:
            raise DeviceError("towers.param_device: gpu asked for, but no GPU is visible")
        return "/gpu:0"
    return choice


def num_cpu_devices(devices: list[str], param: str) -> int:
    """How many CPU devices the session must create so every /cpu:i named exists."""
    indices = [
        tf.DeviceSpec.from_string(d).device_index or 0
        for d in [*devices, param]
        if d != "least_loaded" and device_type(d) == "CPU"
    ]
    return max(indices, default=0) + 1


def describe(session: SessionConfig | None = None) -> str:
    """The `towers devices` report: GPUs with memory and CUDA id mapping, then the CPU."""
    lines = []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    lines.append(f"CUDA_VISIBLE_DEVICES={env if env is not None else '(unset: all GPUs visible)'}")
    gpus = list_gpus(session)
    if not gpus:
        lines.append("GPUs: none visible")
    for gpu in gpus:
        memory = f"{gpu.memory_bytes / 2**30:.1f} GiB" if gpu.memory_bytes else "memory unknown"
        capability = (
            f", compute capability {gpu.compute_capability}" if gpu.compute_capability else ""
        )
        lines.append(
            f"{gpu.logical}  <- physical GPU {gpu.physical_id}: {gpu.name}, {memory}{capability}"
        )
    cpus = os.cpu_count() or 1
    lines.append(f"/cpu:0  host CPU, {cpus} core(s); more /cpu:i devices are made on request")
    return "\n".join(lines)


def session_config(cfg: SessionConfig, num_cpu_devices: int = 1,
                   cpu_towers: bool = False) -> tf.compat.v1.ConfigProto:
    """ConfigProto for a job: GPU memory policy, placement, threads, CPU device count and
    graph rewriting.

    num_cpu_devices: how many /cpu:i devices to create (CPU towers need one each).
    cpu_towers: every tower is a CPU (graph_rewriting).
    """
    gpu_options = tf.compat.v1.GPUOptions(allow_growth=cfg.allow_growth)
    if cfg.per_process_gpu_memory_fraction is not None:
        gpu_options.per_process_gpu_memory_fraction = cfg.per_process_gpu_memory_fraction
    if cfg.visible_devices:
        gpu_options.visible_device_list = cfg.visible_devices
    return tf.compat.v1.ConfigProto(
        device_count={"CPU": num_cpu_devices},
        gpu_options=gpu_options,
        graph_options=tf.compat.v1.GraphOptions(rewrite_options=graph_rewriting(cpu_towers)),
        allow_soft_placement=cfg.allow_soft_placement,
        log_device_placement=cfg.log_device_placement,
        inter_op_parallelism_threads=cfg.inter_op_threads,
        intra_op_parallelism_threads=cfg.intra_op_threads,
    )


def graph_rewriting(cpu_towers: bool) -> RewriterConfig:
    """Grappler's settings: TensorFlow's defaults, lighter where the towers are CPUs.

    A session optimises the graph of each new set of fetches before it first runs it:
    the initialisers, the first checkpoint, the first step, the first step without
    summaries. On a 1-device resnet20 that was 0.8 s of a 4 s start, 0.54 s of it before
    the first step ended. On CPU towers (resnet20 on 1 and 2 towers, the default job):
      - the second of Grappler's two passes over each graph took a third of the time
        and removed at most one duplicate node (resnet20's step), 4 of 270 (the default
        job's): one pass;
      - the layout optimizer changes data layouts for GPUs, and the memory optimizer
        swaps GPU memory to the host or recomputes ops a model marked: both walked
        every graph and changed nothing: off.
    Towers on GPUs keep TensorFlow's defaults (not measured here)."""
    if not cpu_towers:
        return RewriterConfig()
    return RewriterConfig(meta_optimizer_iterations=RewriterConfig.ONE,
                          layout_optimizer=RewriterConfig.OFF,
                          memory_optimization=RewriterConfig.NO_MEM_OPT)


def on_cpus(devices: list[str]) -> bool:
    """Whether every one of `devices` is a CPU."""
    return all(device_type(d) == "CPU" for d in devices)


def bfloat16_units(devices: Collection[str], flags: Collection[str] | None = None
                   ) -> str | None:
    """Where towers on `devices` compute bfloat16 in hardware, as the advice words it:
    'GPUs' (their own units), 'this CPU has amx_bf16' (its flags), or None: the CPU has
    none, and TensorFlow emulates bfloat16, converting to float32 and back (0.07-0.13x
    float32 measured on an AMD EPYC without AVX-512). flags: the CPU's (default: this
    one's)."""
    if any(device_type(device) == "GPU" for device in devices):
        return "GPUs"
    native = native_flags("bfloat16", flags)
    return f"this CPU has {' and '.join(native)}" if native else None


def native_flags(number_type: str, flags: Collection[str] | None = None) -> list[str]:
    """The flags among `flags` (default: this CPU's) that run the 16-bit `number_type`
    (a key of NATIVE_FLAGS) in hardware; none means TensorFlow emulates it on this CPU,
    converting to float32 and back."""
    have = cpu_info.flags() if flags is None else flags
    return [flag for flag in NATIVE_FLAGS[number_type] if flag in have]
