"""The on-disk cache of compiled kernels (`relay_tune.compile.kernel_cache`): what is reused, what is not."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import relay_tune
import relay_tune.compile.parallel as parallel
import relay_tune.compile.tasks as tasks
from relay_tune.compile.kernel_cache import KernelObjectCache, loop_nest_digest
from relay_tune.compile.target import resolve_target
from relay_tune.interpreter import evaluate
from relay_tune.kernel import tir
from relay_tune.passes import optimize
from relay_tune.passes.extract_tasks import extract_tasks
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types

MODEL = """#[version = "0.0.5"]
def @main(%x: Tensor[(5, 37), float32], %w: Tensor[(11, 37), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.relu(%0);
  nn.softmax(%1)
}"""


@pytest.fixture
def compiled_modules(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of LLVM modules compiled, per call of `compile_all`."""
    counts: list[int] = []
    real = parallel._compile_chunks

    def counting(chunks, *args):  # type: ignore[no-untyped-def]
        counts.append(len(chunks))
        return real(chunks, *args)

    monkeypatch.setattr(parallel, "_compile_chunks", counting)
    return counts


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"x": rng.standard_normal((5, 37)).astype("float32"), "w": rng.standard_normal((11, 37)).astype("float32")}


def test_a_second_build_takes_the_kernels_from_the_cache(compiled_modules: list[int],
                                                         _private_tuning_cache: Path) -> None:
    mod = parse_module(MODEL)
    inputs = _inputs()
    want = np.asarray(evaluate(mod, inputs))
    first = relay_tune.build(mod)
    assert sum(compiled_modules) >= 1
    assert list((_private_tuning_cache / "kernels").glob("*/*.o"))
    compiled_modules.clear()
    second = relay_tune.build(mod)
    assert sum(compiled_modules) == 0  # nothing compiled again
    for model in (first, second):
        np.testing.assert_allclose(model.run(**inputs), want, rtol=1e-5, atol=1e-5)


def test_a_damaged_entry_is_compiled_again(compiled_modules: list[int], _private_tuning_cache: Path) -> None:
    mod = parse_module(MODEL)
    relay_tune.build(mod)
    for path in (_private_tuning_cache / "kernels").glob("*/*.o"):
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    compiled_modules.clear()
    model = relay_tune.build(mod)
    assert sum(compiled_modules) >= 1
    inputs = _inputs()
    np.testing.assert_allclose(model.run(**inputs), np.asarray(evaluate(mod, inputs)), rtol=1e-5, atol=1e-5)


def test_the_cache_can_be_turned_off(compiled_modules: list[int], _private_tuning_cache: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_TUNE_KERNEL_CACHE", "0")
    mod = parse_module(MODEL)
    relay_tune.build(mod)
    relay_tune.build(mod)
    assert len(compiled_modules) == 2 and all(compiled_modules)
    assert not (_private_tuning_cache / "kernels").exists()
    monkeypatch.delenv("RELAY_TUNE_KERNEL_CACHE")
    compiled_modules.clear()
    relay_tune.build(mod, kernel_cache=False)
    assert sum(compiled_modules) >= 1 and not (_private_tuning_cache / "kernels").exists()


def _kernel(extent: int, var_name: str = "i", buffer_name: str = "a") -> tir.PrimFunc:
    a = tir.Buffer(buffer_name, (extent,), "float32")
    i = tir.LoopVar(var_name)
    body = tir.For(i, extent, tir.Store(a, (i,), tir.BinaryOp("mul", tir.Load(a, (i,)), tir.FloatImm(2.0))))
    return tir.PrimFunc("twice", (a,), body)


def test_the_key_is_the_loop_nest_and_the_target() -> None:
    cache = KernelObjectCache("/nonexistent")
    host = resolve_target("llvm")
    same = cache.key([_kernel(16)], host)
    assert cache.key([_kernel(16)], host) == same  # separately built, structurally equal
    # A loop variable's name is not in the code; the kernel's name (its symbol) is.
    assert loop_nest_digest(_kernel(16, var_name="j")) == loop_nest_digest(_kernel(16))
    renamed = _kernel(16)
    assert loop_nest_digest(tir.PrimFunc("thrice", renamed.params, renamed.body)) != loop_nest_digest(renamed)
    assert cache.key([_kernel(17)], host) != same
    assert cache.key([_kernel(16)], resolve_target("llvm -mcpu=x86-64 -num-cores=1")) != same


def test_loop_variables_are_numbered_not_named() -> None:
    # Two distinct variables with one name are two variables: the digest tells the nests apart.
    a = tir.Buffer("a", (4, 4), "float32")
    i, j, i2 = tir.LoopVar("i"), tir.LoopVar("i"), tir.LoopVar("i")
    inner = tir.Store(a, (i, j), tir.FloatImm(1.0))
    swapped = tir.Store(a, (i2, i), tir.FloatImm(1.0))
    one = tir.PrimFunc("f", (a,), tir.For(i, 4, tir.For(j, 4, inner)))
    other = tir.PrimFunc("f", (a,), tir.For(i, 4, tir.For(i2, 4, swapped)))
    assert loop_nest_digest(one) != loop_nest_digest(other)


def test_prune_drops_the_least_recently_used(tmp_path: Path) -> None:
    cache = KernelObjectCache(tmp_path)
    for n in range(4):
        cache.store(f"{n:02d}" + "0" * 62, bytes(1000))
    oldest = cache._path("00" + "0" * 62)
    os.utime(oldest, (1, 1))
    assert cache.prune(max_bytes=3 * 1032) == 1
    assert not oldest.exists() and len(cache.entries()) == 3
    assert cache.load("01" + "0" * 62) == bytes(1000)


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernel names of every task lowered (not read from the lowered-kernel cache)."""
    names: list[str] = []
    real = tasks.lower_task

    def counting(func, target, steps, name):  # type: ignore[no-untyped-def]
        names.append(name)
        return real(func, target, steps, name)

    monkeypatch.setattr(tasks, "lower_task", counting)
    return names


CONV_MODEL = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 5, 9, 7), float32], %w: Tensor[(16, 5, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  %1 = nn.relu(%0);
  nn.max_pool2d(%1, pool_size=[2, 2])
}"""


def test_a_second_build_reads_the_lowered_kernels(lowered: list[str], compiled_modules: list[int],
                                                  _private_tuning_cache: Path) -> None:
    mod = parse_module(CONV_MODEL)
    w = np.random.default_rng(2).standard_normal((16, 5, 3, 3)).astype("float32")
    x = np.random.default_rng(4).standard_normal((1, 5, 9, 7)).astype("float32")
    first = relay_tune.build(mod, params={"w": w})  # the weight packed for a blocked layout: a packed binding
    assert lowered and list((_private_tuning_cache / "lowered").glob("*/*.pickle"))
    lowered.clear()
    compiled_modules.clear()
    second = relay_tune.build(mod, params={"w": w})
    assert lowered == [] and sum(compiled_modules) == 0
    assert np.array_equal(np.asarray(second.run(x=x)), np.asarray(first.run(x=x)))
    want = np.asarray(evaluate(mod, {"x": x, "w": w}))
    np.testing.assert_allclose(np.asarray(second.run(x=x)), want, rtol=1e-4, atol=1e-4)


def test_a_damaged_lowered_kernel_is_lowered_again(lowered: list[str], _private_tuning_cache: Path) -> None:
    mod = parse_module(CONV_MODEL)
    relay_tune.build(mod)
    count = len(lowered)
    entries = list((_private_tuning_cache / "lowered").glob("*/*.pickle"))
    for path in entries:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    lowered.clear()
    model = relay_tune.build(mod)
    assert len(lowered) == count
    x = np.random.default_rng(4).standard_normal((1, 5, 9, 7)).astype("float32")
    w = np.random.default_rng(5).standard_normal((16, 5, 3, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(model.run(x=x, w=w)), np.asarray(evaluate(mod, {"x": x, "w": w})),
                               rtol=1e-4, atol=1e-4)


def test_the_lowered_key_is_the_task_the_steps_and_the_target() -> None:
    cache = tasks.LoweredCache(KernelObjectCache("/nonexistent", suffix=".pickle"))
    fused = optimize(infer_types(parse_module(CONV_MODEL)), opt_level=3)
    spec = extract_tasks(fused)[0]
    host = resolve_target("llvm")
    default = cache.key(spec, host, None, "k0")
    assert cache.key(spec, host, None, "k0") == default
    assert cache.key(spec, host, None, "k1") != default
    assert cache.key(spec, resolve_target("llvm -mcpu=x86-64"), None, "k0") != default
    steps = tasks.task_default_steps(spec, host)
    assert cache.key(spec, host, steps, "k0") not in (default, cache.key(spec, host, steps[:-1], "k0"))


def test_the_kernel_cache_off_turns_the_lowered_cache_off(lowered: list[str], _private_tuning_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_TUNE_KERNEL_CACHE", "0")
    mod = parse_module(CONV_MODEL)
    relay_tune.build(mod)
    count = len(lowered)
    relay_tune.build(mod)
    assert len(lowered) == 2 * count and not (_private_tuning_cache / "lowered").exists()
