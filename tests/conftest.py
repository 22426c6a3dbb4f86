"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The conformance corpus lives beside the checkout and is never copied into the repository.
CORPUS_DIR = REPO_ROOT.parent / "shared" / "relay_corpus"


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    if not CORPUS_DIR.is_dir():
        pytest.skip(f"Relay corpus not found at {CORPUS_DIR}")
    return CORPUS_DIR
