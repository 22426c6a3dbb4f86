"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from model_sources import CORPUS_DIR, REPO_ROOT, program_path, write_zoo_files

__all__ = ["CORPUS_DIR", "REPO_ROOT"]


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small zoo models written as Relay files (see `model_sources`)."""
    return write_zoo_files(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session")
def program(zoo_dir: Path) -> Callable[[str], Path]:
    """`program(name)`: the path of a zoo file (`zoo_*.relay`) or of a corpus file."""
    return lambda name: program_path(name, zoo_dir)


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The corpus folder itself, for a test that can only mean the corpus. Such a test skips in a clone of the
    project alone; prefer parametrising over `model_sources.module_files()` with the `program` fixture."""
    if not CORPUS_DIR.is_dir():
        pytest.skip(f"Relay corpus not found at {CORPUS_DIR}")
    return CORPUS_DIR


@pytest.fixture(autouse=True)
def _private_tuning_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own tuning cache folder: no test reads or fills the user's (~/.cache/relay-tune)."""
    folder = tmp_path_factory.mktemp("tuning-cache")
    monkeypatch.setenv("RELAY_TUNE_CACHE", str(folder))
    return folder


@pytest.fixture(autouse=True)
def _no_build_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds compile: a test that builds a model twice, or patches the compiler between builds, must not get the
    first model back from the build cache. tests/test_build_cache.py turns the cache on where it tests it."""
    monkeypatch.setenv("RELAY_TUNE_BUILD_CACHE", "0")


@pytest.fixture(autouse=True)
def _small_cold_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's runner rotates weights through 1 MiB of copies, not 64 MiB: copying them costs the suite time
    and tests nothing that the size matters for (tests/test_runner_cold_weights.py checks the real size)."""
    monkeypatch.setenv("RELAY_TUNE_COLD_WEIGHTS_BYTES", str(1 << 20))
