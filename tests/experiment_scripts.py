"""Import a script of experiments/ as a module, for tests of its pure functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_experiment(name: str) -> ModuleType:
    """experiments/<name>.py, executed afresh as module `experiments_<name>`."""
    module_name = f"experiments_{name}"
    spec = importlib.util.spec_from_file_location(module_name, EXPERIMENTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up by name while the class is built
    spec.loader.exec_module(module)
    return module
