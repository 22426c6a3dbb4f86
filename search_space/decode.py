"""A logged tuning config back into schedule steps, on any target: what a build runs for a tuned task.

    steps = config_to_steps(func, config, target)   # func: a fused Primitive=1 function; target: a resolved Target

CUDA configs go through the GPU family template (`search_space.gpu`). CPU configs go through their family's
template (`search_space.families`) once the config is checked to be a point of this workload's space (a log
written by another version may hold configs of another space). A CPU config may instead carry its steps as the
JSON text of a list of step dicts in a `"steps"` knob (hand-pinned schedules).

It lives with the templates, below the model compiler and the tuner, which both decode logs through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from relay_tune.errors import RelayTuneError
from relay_tune.kernel.compute import primitive_compute
from search_space import gpu
from search_space.config import Config
from search_space.cpu import analyze, cpu_space, parameter_numbers, with_later_knobs
from search_space.families import FAMILIES, family_named
from search_space.families.lstm import LSTM_FAMILY, lstm_space, lstm_steps, lstm_workload

__all__ = ["ConfigNotInSpace", "config_to_steps"]


class ConfigNotInSpace(RelayTuneError):
    """A logged config that is not a point of the workload's current schedule space: the log was written by another
    version, or the operator's compute changed (e.g. a convolution that now accumulates channel-innermost). A build
    passes such a record over; it is not the user's mistake."""


def config_to_steps(func: Any, config: Mapping[str, Any], target: Any) -> list[Any]:
    """Schedule steps for fused function `func` from a logged `config` on `target` (see the module docstring)."""
    if target.kind == "cuda":
        return gpu.steps_of_prim(primitive_compute(func), config)
    steps = config.get("steps")
    if isinstance(steps, str):
        try:
            decoded = json.loads(steps)
        except json.JSONDecodeError as err:
            raise RelayTuneError(f"a tuning config's steps are not valid JSON: {err}") from None
        if isinstance(decoded, list):
            return decoded
    if config.get("family") == LSTM_FAMILY and target.kind == "llvm":
        lstm = lstm_workload(func, target)
        plain = config if isinstance(config, Config) else Config(dict(config))
        if lstm is None or not lstm_space(lstm).is_valid(plain):
            raise ConfigNotInSpace(f"cannot turn a tuning config into an LSTM schedule: {dict(config)} is not a point "
                                   "of this workload's lstm schedule space")
        return lstm_steps(plain)
    if config.get("family") not in FAMILIES or target.kind != "llvm":
        raise ConfigNotInSpace(
            f"cannot turn a tuning config into schedule steps (knobs: {', '.join(config) or 'none'}): it is not a "
            "config of a CPU schedule space and carries no steps")
    config = config if isinstance(config, Config) else Config(dict(config))
    prim = primitive_compute(func)
    # The space has a weight-packing knob exactly when the weight is a model constant.
    packs = "pack_b" in config or "pack_w" in config
    workload = analyze(prim, target, parameter_numbers(prim) if packs else ())
    space = cpu_space(workload)
    config = with_later_knobs(workload, config)
    if not space.is_valid(config):
        raise ConfigNotInSpace(
            f"cannot turn a tuning config into schedule steps: {dict(config)} is not a point of the {workload.family} "
            "schedule space of this workload (a log written by another relay-tune version?)")
    return family_named(workload.family).steps(prim, config, target)
