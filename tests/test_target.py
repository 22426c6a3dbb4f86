"""Targets: parsing, canonical strings (tuning-log keys), host detection and SIMD widths."""

from __future__ import annotations

import os

import pytest

from relay_tune.errors import RelayTuneError
from relay_tune.target import Target, TargetError


def test_parse_and_print_round_trip() -> None:
    target = Target.parse("llvm -mcpu=znver4 -num-cores=2")
    assert (target.kind, target.mcpu, target.num_cores, target.mattr) == ("llvm", "znver4", 2, ())
    assert str(target) == "llvm -mcpu=znver4 -num-cores=2"
    assert Target.parse(str(target)) == target


def test_equal_targets_print_equal_strings() -> None:
    a = Target.parse("llvm -mattr=+fma,+avx2,-avx512f -mcpu=haswell -num-cores=4")
    b = Target.parse("llvm -num-cores=4 -mcpu=haswell -mattr=-avx512f,+avx2,+fma")
    assert a == b and hash(a) == hash(b)
    assert str(a) == str(b) == "llvm -mcpu=haswell -mattr=+avx2,-avx512f,+fma -num-cores=4"
    assert Target("llvm", num_cores=1) == Target.parse("llvm")
    assert str(Target.parse("llvm")) == "llvm -num-cores=1"


def test_cuda_targets() -> None:
    target = Target.parse("cuda -arch=sm_90")
    assert target.kind == "cuda" and target.arch == "sm_90"
    assert str(target) == "cuda -arch=sm_90"
    assert Target.parse(str(target)) == target
    assert Target.parse("cuda -arch=sm_90a").arch == "sm_90a"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("opencl", "unknown target kind"),
        ("llvm -mcpu", "-name=value"),
        ("llvm mcpu=x", "-name=value"),
        ("llvm -foo=1", "unknown target option -foo"),
        ("llvm -num-cores=0", "positive integer"),
        ("llvm -num-cores=two", "positive integer"),
        ("llvm -mcpu=a -mcpu=b", "twice"),
        ("llvm -mattr=avx2", r"\+name or -name"),
        ("llvm -mcpu=", "needs a value"),
        ("llvm -arch=sm_90", "cuda targets only"),
        ("cuda -arch=90", "sm_90"),
        ("cuda -mcpu=znver4", "-arch"),
    ],
)
def test_bad_target_strings_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=message) as info:
        Target.parse(text)
    assert isinstance(info.value, RelayTuneError)


def test_host_target_describes_this_machine() -> None:
    host = Target.host()
    assert host.kind == "llvm" and host.mcpu
    assert host.num_cores == len(os.sched_getaffinity(0))
    assert Target.parse(str(host)) == host
    assert Target.host(num_cores=1).num_cores == 1
    assert host.with_cores(1) == Target.host(num_cores=1)
    native = Target.parse("llvm -mcpu=native -num-cores=1")
    assert native.mcpu == host.mcpu and native.mattr == host.mattr and native.num_cores == 1


def test_vector_lanes_follow_features() -> None:
    assert Target.parse("llvm -mcpu=znver4").vector_lanes("float32") == 16
    assert Target.parse("llvm -mcpu=skylake-avx512").vector_lanes("float64") == 8
    assert Target.parse("llvm -mcpu=haswell").vector_lanes("float32") == 8
    assert Target.parse("llvm -mcpu=haswell").vector_lanes("int8") == 32
    assert Target.parse("llvm -mcpu=znver4 -mattr=-avx512f").vector_lanes() == 8
    assert Target.parse("llvm -mcpu=x86-64 -mattr=+avx512f").vector_lanes() == 16
    assert Target.parse("llvm").vector_lanes() == 4
    assert Target.parse("llvm -mcpu=haswell").has_feature("fma")
    assert not Target.parse("llvm -mcpu=haswell -mattr=-fma").has_feature("fma")


def test_host_vector_width_matches_llvm_features() -> None:
    host = Target.host()
    if "+avx512f" in host.mattr:
        assert host.vector_lanes() == 16
    elif "+avx2" in host.mattr:
        assert host.vector_lanes() == 8
