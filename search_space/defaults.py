"""The default schedule of a fused function: its family's template applied to the family's default config.

    steps = default_steps(func, target, constants)   # what an untuned build runs

There is no other way to schedule a function: `search_space.families` (CPU) and `search_space.gpu` (CUDA) hold
one parameterised template per operator family and a rule that picks the untuned config from the workload's
shapes. The tuner measures that same config first and records it in the log, so the log's "default" is
exactly the kernel an untuned build runs (`tests/test_default_schedules.py` checks it for every task of every
model the tests build).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relay_tune.codegen.nvptx import arch_of
from relay_tune.kernel.compute import PrimitiveCompute, primitive_compute
from search_space.config import Config
from search_space.cpu import parameter_numbers, task_workload
from search_space.families import family_named
from search_space.gpu import default_config as gpu_default
from search_space.gpu import steps_of_prim

__all__ = ["default_config_of", "default_steps"]


def _prim(func_or_prim: Any) -> Any:
    return func_or_prim if isinstance(func_or_prim, PrimitiveCompute) else primitive_compute(func_or_prim)


def default_config_of(func_or_prim: Any, target: Any, constants: Iterable[int] | None = ()) -> Config:
    """The default config of a fused function (or its tensor expressions) on `target`. `constants`: parameter
    numbers that are model constants at every call site (weights a schedule may pack once, ahead of time); None
    counts every parameter as one (a kernel called on its own, which packs its inputs on every call)."""
    prim = _prim(func_or_prim)
    if constants is None:
        constants = parameter_numbers(prim)
    if target.kind == "cuda":
        return gpu_default(prim, arch_of(target))

    return task_workload(prim, target, constants)[1]


def default_steps(func_or_prim: Any, target: Any, constants: Iterable[int] | None = ()) -> list[Any]:
    """The default schedule's steps: the family template at `default_config_of(...)`."""
    prim = _prim(func_or_prim)
    config = default_config_of(prim, target, constants)
    if target.kind == "cuda":
        return steps_of_prim(prim, config)

    return family_named(str(config["family"])).steps(prim, config, target)
