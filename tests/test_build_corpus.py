"""Whole corpus models compiled by `relay_tune.build` agree with the interpreter; saving and loading keeps them
exactly, without recompiling."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import evaluate
from relay_tune.ir import IRModule
from relay_tune.runtime.model import CompiledModel
from relay_tune.text import load_module
from relay_tune.type_infer import infer_types

FAST_MODELS = ["tvm_menagerie_mnist", "tvm_menagerie_mobilenet", "tvm_menagerie_gpt2_extract"]


def load(corpus_dir: Path, name: str) -> IRModule:
    return infer_types(load_module(corpus_dir / f"{name}.relay"))


@pytest.fixture(scope="module")
def built(corpus_dir: Path) -> dict[str, tuple[IRModule, CompiledModel]]:
    """Models built once per test module, by name (several tests look at the same build)."""

    class Builds(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> tuple[IRModule, CompiledModel]:
            mod = load(corpus_dir, name)
            self[name] = (mod, relay_tune.build(mod))
            return self[name]

    return Builds()


def leaves(value: object) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in leaves(item)]
    assert isinstance(value, np.ndarray)
    return [value]


def assert_agrees(model: CompiledModel, mod: IRModule, seed: int = 0) -> None:
    inputs = model.random_inputs(seed)
    expected = leaves(evaluate(mod, inputs))
    got = leaves(model.run(**inputs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("name", FAST_MODELS)
def test_corpus_model_compiles_and_agrees_with_interpreter(
    built: dict[str, tuple[IRModule, CompiledModel]], name: str
) -> None:
    mod, model = built[name]
    assert_agrees(model, mod)
    report = model.memory_report()
    assert report.arena_bytes <= report.naive_bytes
    assert model.build_info["kernels"] == len({c.kernel for c in model.plan.calls})


def test_mobilenet_memory_plan_and_save_load(built: dict[str, tuple[IRModule, CompiledModel]], tmp_path: Path) -> None:
    _mod, model = built["tvm_menagerie_mobilenet"]
    report = model.memory_report()
    # Intermediates of a deep chain reuse a few slots: far below one buffer per tensor.
    assert report.intermediate_tensors > 40
    assert report.arena_bytes < 0.3 * report.naive_bytes
    assert report.arena_bytes >= report.lower_bound_bytes

    path = model.save(tmp_path / "mobilenet.rtmod")
    start = time.perf_counter()
    loaded = relay_tune.runtime.load(path)
    load_seconds = time.perf_counter() - start
    inputs = model.random_inputs(3)
    np.testing.assert_array_equal(loaded.run(**inputs), model.run(**inputs))  # type: ignore[arg-type]
    # Loading links the saved object code: a small fraction of what compiling took.
    assert load_seconds < 0.5 * model.build_info["timings"]["total_s"]


@pytest.mark.slow
def test_resnet50_compiles_and_agrees_with_interpreter(corpus_dir: Path) -> None:
    mod = load(corpus_dir, "tvm_menagerie_resnet50")
    model = relay_tune.build(mod)
    assert_agrees(model, mod)
    report = model.memory_report()
    assert report.arena_bytes < 0.25 * report.naive_bytes
