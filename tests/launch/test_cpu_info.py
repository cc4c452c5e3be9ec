"""launch.cpu_info: the CPU's name, flags and identity read from /proc/cpuinfo."""

import pytest

from launch import cpu_info

# Two cores of a hybrid CPU, as Linux writes them (vmx flags: the virtualization
# features, not instruction sets).
HYBRID = """processor\t: 0
model name\t: Example CPU P-core
flags\t\t: fpu avx2 avx512f amx_bf16
vmx flags\t: vnmi ept
bugs\t\t: spectre_v1

processor\t: 1
model name\t: Example CPU P-core
flags\t\t: fpu avx2
vmx flags\t: vnmi ept
"""


@pytest.fixture
def hybrid(tmp_path, monkeypatch):
    path = tmp_path / "cpuinfo"
    path.write_text(HYBRID)
    monkeypatch.setattr(cpu_info, "CPUINFO", str(path))


def test_the_name_and_flags_are_the_first_cores(hybrid):
    assert cpu_info.value("model name") == "Example CPU P-core"
    assert cpu_info.flags() == {"fpu", "avx2", "avx512f", "amx_bf16"}


def test_the_identity_holds_every_distinct_name_and_flags_line_once(hybrid):
    assert cpu_info.identity() == ("flags\t\t: fpu avx2\n"
                                   "flags\t\t: fpu avx2 avx512f amx_bf16\n"
                                   "model name\t: Example CPU P-core\n")


def test_without_proc_cpuinfo_nothing_is_read_and_the_identity_is_the_processors(
        tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_info, "CPUINFO", str(tmp_path / "missing"))
    assert cpu_info.value("model name") is None and cpu_info.flags() == set()
    assert cpu_info.identity()
