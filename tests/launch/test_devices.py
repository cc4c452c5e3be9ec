"""Which devices a job's towers and variables get, from towers.* and the GPUs visible."""

from __future__ import annotations

import pytest

from launch.config import SessionConfig, from_dict
from launch.devices import (
    CPU_TOWERS_WITHOUT_GPU,
    DeviceError,
    num_cpu_devices,
    param_device,
    tower_devices,
    visible_physical_ids,
)


def towers(**section):
    return from_dict({"towers": section}).towers


def test_auto_is_every_gpu_or_two_cpu_devices_without_one():
    assert tower_devices(towers(devices="auto"), 3) == ["/gpu:0", "/gpu:1", "/gpu:2"]
    assert tower_devices(towers(devices="auto"), 0) == [
        f"/cpu:{i}" for i in range(CPU_TOWERS_WITHOUT_GPU)]


def test_a_count_takes_the_first_devices_of_the_host_kind():
    assert tower_devices(towers(devices=2), 4) == ["/gpu:0", "/gpu:1"]
    assert tower_devices(towers(devices=3), 0) == ["/cpu:0", "/cpu:1", "/cpu:2"]


def test_more_towers_than_gpus_is_an_error_naming_both():
    with pytest.raises(DeviceError, match="5 towers asked for, but 2 GPU"):
        tower_devices(towers(devices=5), 2)


def test_a_list_is_taken_as_given_if_each_device_exists():
    assert tower_devices(towers(devices=["/gpu:0", "/gpu:2"]), 3) == ["/gpu:0", "/gpu:2"]
    with pytest.raises(DeviceError, match="/gpu:1 does not exist.*use /cpu:i"):
        tower_devices(towers(devices=["/gpu:1"]), 0)


def test_param_device_choices():
    assert param_device(towers(param_device="cpu"), 2) == "/cpu:0"
    assert param_device(towers(param_device="gpu"), 2) == "/gpu:0"
    assert param_device(towers(param_device="least_loaded"), 2) == "least_loaded"
    with pytest.raises(DeviceError, match="no GPU is visible"):
        param_device(towers(param_device="gpu"), 0)


def test_the_session_gets_a_cpu_device_for_every_cpu_named():
    assert num_cpu_devices(["/gpu:0", "/gpu:1"], "/cpu:0") == 1
    assert num_cpu_devices(["/cpu:0", "/cpu:3"], "/cpu:0") == 4
    assert num_cpu_devices(["/cpu:0", "/cpu:1"], "least_loaded") == 2


def test_cuda_visible_devices_then_visible_devices_pick_physical_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_physical_ids() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_physical_ids() == ["2", "3"]
    assert visible_physical_ids(SessionConfig(visible_devices="1")) == ["3"]
