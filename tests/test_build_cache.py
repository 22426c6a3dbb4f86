"""The on-disk cache of finished builds (`relay_tune.compile.build_cache`): a hit returns the same model, anything
that changes the code misses, a damaged entry is built again."""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import relay_tune
import relay_tune.compile.build_model as build_model
from relay_tune.cli import main
from relay_tune.compile.build_cache import BUILD_CACHE_ENV, MODEL_FILE, BuildCache, wait_for_stores
from relay_tune.compile.lookup import BuildWarning
from relay_tune.interpreter import evaluate
from relay_tune.runtime.vm import load_model
from relay_tune.text import parse_module

MODEL = """#[version = "0.0.5"]
def @main(%x: Tensor[(3, 8, 13, 11), float32], %w: Tensor[(6, 8, 3, 3), float32], %b: Tensor[(6), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}"""


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The build cache on, and a list that grows by one per model actually compiled."""
    monkeypatch.delenv(BUILD_CACHE_ENV, raising=False)
    compiled: list[int] = []
    real = build_model.compile_model

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiled.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(build_model, "compile_model", counting)
    return compiled


def _params(seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((6, 8, 3, 3)).astype("float32"),
            "b": rng.standard_normal(6).astype("float32")}


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((3, 8, 13, 11)).astype("float32") + 0.5


def test_a_hit_returns_the_same_model_without_compiling(builds: list[int], _private_tuning_cache: Path) -> None:
    mod = parse_module(MODEL)
    params = _params()
    first = relay_tune.build(mod, params=params)
    assert len(builds) == 1 and first.build_info["build_cache"]["hit"] is False
    wait_for_stores()  # the entry is written in the background
    assert list((_private_tuning_cache / "models").glob(f"*/*/{MODEL_FILE}"))
    second = relay_tune.build(parse_module(MODEL), params=_params())  # parsed again, equal weights
    assert len(builds) == 1 and second.build_info["build_cache"]["hit"] is True
    x = _x()
    got = np.asarray(second.run(x=x))
    assert np.array_equal(got, np.asarray(first.run(x=x)))  # bit-identical
    want = np.asarray(evaluate(mod, {"x": x, **params}))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change", ["weight", "opt_level", "target", "winograd", "off"])
def test_what_changes_the_code_misses(builds: list[int], change: str) -> None:
    mod = parse_module(MODEL)
    relay_tune.build(mod, params=_params())
    params = _params()
    options: dict[str, Any] = {}
    if change == "weight":
        params["w"][5, 7, 2, 2] += 1.0
    elif change == "opt_level":
        options["opt_level"] = 2
    elif change == "target":
        options["target"] = "llvm -mcpu=x86-64"
    elif change == "winograd":
        options["winograd"] = "off"
    else:
        options["build_cache"] = False
    model = relay_tune.build(mod, params=params, **options)
    assert len(builds) == 2
    if change == "weight":
        x = _x()
        want = np.asarray(evaluate(mod, {"x": x, **params}))
        np.testing.assert_allclose(np.asarray(model.run(x=x)), want, rtol=1e-4, atol=1e-4)


def test_a_changed_tuning_record_misses(builds: list[int], tmp_path: Path) -> None:
    mod = parse_module(MODEL)
    log = tmp_path / "tune.jsonl"
    log.write_text("")
    relay_tune.build(mod, params=_params(), logs=str(log))
    relay_tune.build(mod, params=_params(), logs=str(log))
    assert len(builds) == 1
    log.write_text(json.dumps({"note": "another record"}) + "\n")
    relay_tune.build(mod, params=_params(), logs=str(log))
    assert len(builds) == 2


def test_a_lookup_function_is_never_cached(builds: list[int]) -> None:
    mod = parse_module(MODEL)
    for _ in range(2):
        model = relay_tune.build(mod, params=_params(), logs=lambda key, target: None)
    assert len(builds) == 2 and "build_cache" not in model.build_info


def test_a_hit_repeats_the_build_warnings(builds: list[int], tmp_path: Path) -> None:
    mod = parse_module(MODEL)
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    for expected_builds in (1, 1):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            relay_tune.build(mod, params=_params(), logs=str(log))
        assert len(builds) == expected_builds
        assert any(issubclass(w.category, BuildWarning) and "no tuning record" in str(w.message) for w in caught)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_entry_is_built_again(builds: list[int], _private_tuning_cache: Path, damage: str) -> None:
    mod = parse_module(MODEL)
    relay_tune.build(mod, params=_params())
    wait_for_stores()
    (path,) = (_private_tuning_cache / "models").glob(f"*/*/{MODEL_FILE}")
    data = bytearray(path.read_bytes())
    if damage == "flip":  # a byte inside the weights: only the member's CRC-32 tells
        offset = data.find(bytes(_params()["b"].tobytes()[:8]))
        assert offset > 0
        data[offset + 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    model = relay_tune.build(mod, params=_params())
    assert len(builds) == 2 and model.build_info["build_cache"]["hit"] is False
    x = _x()
    want = np.asarray(evaluate(mod, {"x": x, **_params()}))
    np.testing.assert_allclose(np.asarray(model.run(x=x)), want, rtol=1e-4, atol=1e-4)
    again = relay_tune.build(mod, params=_params())  # the rebuilt entry replaced the damaged one
    assert len(builds) == 2 and again.build_info["build_cache"]["hit"] is True


def test_the_build_does_not_wait_for_the_entry_to_be_written(
        builds: list[int], _private_tuning_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real_store = BuildCache.store

    def held_store(self: BuildCache, *args: Any, **kwargs: Any) -> None:
        assert release.wait(60)
        real_store(self, *args, **kwargs)

    monkeypatch.setattr(BuildCache, "store", held_store)
    mod = parse_module(MODEL)
    first = relay_tune.build(mod, params=_params())  # returns while the writer waits for `release`
    assert first.build_info["build_cache"]["hit"] is False
    assert not list((_private_tuning_cache / "models").glob(f"*/*/{MODEL_FILE}"))
    first.build_info["timings"]["changed after the build"] = 1.0  # the entry keeps the build's own build_info
    release.set()
    second = relay_tune.build(parse_module(MODEL), params=_params())  # waits for the entry, then loads it
    assert len(builds) == 1 and second.build_info["build_cache"]["hit"] is True
    x = _x()
    assert np.array_equal(np.asarray(second.run(x=x)), np.asarray(first.run(x=x)))
    (path,) = (_private_tuning_cache / "models").glob(f"*/*/{MODEL_FILE}")
    assert "changed after the build" not in json.dumps(load_model(path).build_info)


def test_the_cache_keeps_the_most_recently_used_entries(tmp_path: Path) -> None:
    class Saved:
        def __init__(self, size: int) -> None:
            self.size = size

        def save(self, path: Path) -> Path:
            path.write_bytes(b"\x01" * self.size)
            return path

    cache = BuildCache(tmp_path / "models", max_bytes=2500)
    for age, key in enumerate(("aa01", "bb02", "cc03")):
        cache.store(key, Saved(1000))
        os.utime(tmp_path / "models" / key[:2] / key, (1_000_000 + age, 1_000_000 + age))
    assert len(cache.entries()) == 3
    assert cache.prune() == 1
    assert sorted(e.name for e in cache.entries()) == ["bb02", "cc03"]



def test_the_command_line_builds_from_the_cache(builds: list[int], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "model.relay"
    source.write_text(MODEL.replace(", %w: Tensor[(6, 8, 3, 3), float32], %b: Tensor[(6), float32]", "")
                      .replace("nn.conv2d(%x, %w, padding=[1, 1, 1, 1])", "nn.relu(%x)")
                      .replace("nn.bias_add(%0, %b)", "nn.max_pool2d(%0, pool_size=[2, 2])"))
    outputs = [tmp_path / "first.rtmod", tmp_path / "second.rtmod"]
    for out in outputs:
        assert main(["build", str(source), "-o", str(out)]) == 0
    assert len(builds) == 1
    assert "compiled" in capsys.readouterr().out
    x = _x()
    first, second = (load_model(out) for out in outputs)
    assert np.array_equal(np.asarray(first.run(x=x)), np.asarray(second.run(x=x)))
