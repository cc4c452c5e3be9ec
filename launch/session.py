"""The session options of a job (the seed docs' ConfigProto settings) as a ConfigProto."""

from __future__ import annotations

import tensorflow as tf

from launch.config import SessionConfig


def session_config(cfg: SessionConfig, num_cpu_devices: int = 1) -> tf.compat.v1.ConfigProto:
    """ConfigProto for a job: GPU memory policy, placement, threads, and CPU device count.

    num_cpu_devices: how many /cpu:i devices to create (CPU towers need one each).
    """
    gpu_options = tf.compat.v1.GPUOptions(allow_growth=cfg.allow_growth)
    if cfg.per_process_gpu_memory_fraction is not None:
        gpu_options.per_process_gpu_memory_fraction = cfg.per_process_gpu_memory_fraction
    if cfg.visible_devices:
        gpu_options.visible_device_list = cfg.visible_devices
    return tf.compat.v1.ConfigProto(
        device_count={"CPU": num_cpu_devices},
        gpu_options=gpu_options,
        allow_soft_placement=cfg.allow_soft_placement,
        log_device_placement=cfg.log_device_placement,
        inter_op_parallelism_threads=cfg.inter_op_threads,
        intra_op_parallelism_threads=cfg.intra_op_threads,
    )
