"""The `lstm` family: the schedule space of the fixed LSTM kernels (`nn.lstm_sequence` and its int8 twin
`nn.lstm_sequence_int8`, `relay_tune.kernel.recurrent`), its default rule, and the config's one step.

    workload = lstm_workload(func, target)        # None: not one LSTM call (or a fixed kernel without a space)
    space = lstm_space(workload)                  # knobs + constraints
    config = lstm_default(workload)               # what an untuned build runs
    prim_func = lstm_kernel(func, target, "k", config)

The kernel's loop nest is written by hand (its step loop carries the state), so this family has no tensor-expression
template: a config becomes an `LstmSchedule`, and its "steps" (what a tuning-log lookup hands the build) are one
JSON dict `{"kind": "lstm_schedule", "config": {...}}` that `lstm_kernel_from_steps` turns back into the kernel.

Each step's work is the matrix-vector product of the state by the packed recurrent weights (4H x H per direction:
at H = 256 one megabyte of float32, more than a core's L2, so every step streams it from L3), then the gates. Knobs:

- `width`: accumulator columns per block (a quarter panel to two panels, whole vectors, as many as the
  accumulator registers hold): narrow blocks re-read the state row per block but keep fewer registers live; wide
  ones give more independent FMA chains per state value loaded;
- `k_unroll`: reduction steps per loop iteration (1, 2, 4, 8; a remainder loop takes the rest);
- `parallel`: the two directions of a bidirectional layer on separate cores, or in turn on one;
- `interleave`: with the directions on one core, both advance a step at a time in one loop (two independent
  dependence chains) rather than one direction after the other.

Every point computes the same result: blocks and unrolling only regroup the same sums in the same k order per
column, and the directions are independent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relay_tune.ir import Call, Function, Op
from relay_tune.kernel import tir
from relay_tune.kernel.recurrent import (
    SCHEDULED_KERNELS,
    LstmSchedule,
    default_lstm_schedule,
    fixed_kernel,
    fixed_kernel_call,
    parallel_worthwhile,
)
from relay_tune.op.recurrent import LSTM_SEQUENCE_INT8
from relay_tune.target import Target
from search_space.config import Config, InvalidConfigError
from search_space.families.common import CpuWorkload, target_registers, vector_registers
from search_space.knobs import ChoiceKnob, Knob
from search_space.space import Constraint, Space

__all__ = ["LSTM_FAMILY", "LSTM_STEP", "K_UNROLLS", "lstm_call", "lstm_default", "lstm_kernel",
           "lstm_flops", "lstm_kernel_from_steps", "lstm_schedule", "lstm_space", "lstm_steps", "lstm_test_scales",
           "lstm_workload"]

LSTM_FAMILY = "lstm"
"""The `family` knob of an LSTM kernel's configs."""

LSTM_STEP = "lstm_schedule"
"""The `kind` of the one step an LSTM config decodes to."""

K_UNROLLS = (1, 2, 4, 8)
"""Reduction steps per loop iteration the space offers (at most the reduction's length)."""


def lstm_call(func: Function) -> Call | None:
    """The LSTM call of a fused function that is one call of an LSTM kernel with a schedule space, else None."""
    call = fixed_kernel_call(func)
    if call is None or not isinstance(call.op, Op) or call.op.name not in SCHEDULED_KERNELS:
        return None
    return call


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in value.checked_type.shape)


def lstm_workload(func: Function, target: Target) -> CpuWorkload | None:
    """The workload of a fused LSTM call on `target` (None for any other function). dims: seq, batch, directions,
    hidden, panel (the packed weights' panel width), columns (panels times panel), depth (the reduction: hidden,
    or its pairs for int8 weights); extras: int8, and the default schedule."""
    call = lstm_call(func)
    if call is None:
        return None
    seq, batch, directions, gates = _shape(call.args[0])
    weights = _shape(call.args[1])
    panels, depth, panel = weights[1], weights[2], weights[3]
    default = default_lstm_schedule(call, target)
    int8 = isinstance(call.op, Op) and call.op.name == LSTM_SEQUENCE_INT8
    return CpuWorkload(family=LSTM_FAMILY, dims={"seq": seq, "batch": batch, "directions": directions,
                                                  "hidden": gates // 4, "panel": panel, "columns": panels * panel,
                                                  "depth": depth},
                       lanes=target.vector_lanes("float32"), registers=target_registers(target),
                       cores=target.num_cores, constant_weight=True,
                       default_parallel=parallel_worthwhile(call, target),
                       extras={"int8": int8, "default": default})


def _widths(workload: CpuWorkload) -> list[int]:
    """Block widths: a quarter panel to two panels, whole vectors (or the whole panel where it is narrower than a
    vector), dividing the panel or made of whole panels that divide the columns, within the accumulator
    registers."""
    dims, lanes = workload.dims, workload.lanes
    panel, columns = dims["panel"], dims["columns"]
    candidates = {panel // 4, panel // 2, panel, 2 * panel}
    widths = []
    for width in sorted(candidates):
        if width < 1 or (width % lanes and width != panel):
            continue
        if not (panel % width == 0 or (width % panel == 0 and columns % width == 0)):
            continue
        if width != panel and vector_registers(width, lanes) > workload.accumulator_budget:
            continue
        widths.append(width)
    return widths


def _interleave_on_one_core(config: Config) -> bool:
    """Only directions that share a core interleave."""
    return not (config["interleave"] and config["parallel"])


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    dims = workload.dims
    two = dims["directions"] > 1
    knobs: list[Knob] = [
        ChoiceKnob("width", _widths(workload)),
        ChoiceKnob("k_unroll", [u for u in K_UNROLLS if u <= max(1, dims["depth"])]),
        ChoiceKnob("parallel", [False, True] if two and workload.cores > 1 else [False]),
        ChoiceKnob("interleave", [False, True] if two else [False]),
    ]
    return knobs, [Constraint("only directions on one core interleave", _interleave_on_one_core)]


def lstm_flops(workload: CpuWorkload) -> float:
    """Operations of one call: the recurrent products (a multiply and an add per weight per step, padding columns
    included) and about 30 per gate column per step for the nonlinearities and the state update."""
    dims = workload.dims
    steps = dims["seq"] * dims["batch"] * dims["directions"]
    depth = dims["depth"] * (2 if workload.extras["int8"] else 1)
    return float(steps * (2 * dims["columns"] * depth + 30 * dims["hidden"]))


def lstm_test_scales(func: Function) -> dict[int, float]:
    """Per parameter of a fused LSTM call, the scale of its random test floats where it is not 1: the recurrent
    weights at a trained layer's scale, 1/sqrt(H) (PyTorch's initialisation; for int8 weights, whose test integers
    average about 4, the column scales 1/(8 sqrt(H))). At +-1 a layer of hundreds of units is chaotic: rounding that
    differs from the reference's (another summation order) grows over the steps until every state differs."""
    call = lstm_call(func)
    if call is None:
        return {}
    hidden = _shape(call.args[0])[3] // 4
    int8 = isinstance(call.op, Op) and call.op.name == LSTM_SEQUENCE_INT8
    weight = call.args[2] if int8 else call.args[1]  # rscale, or rp
    scale = 1.0 / (8.0 if int8 else 1.0) / hidden ** 0.5
    return {i: scale for i, p in enumerate(func.params) if p is weight}


def lstm_space(workload: CpuWorkload) -> Space:
    """The schedule space of an LSTM kernel (the `family` knob first)."""
    knobs, constraints = _knobs(workload)
    return Space([ChoiceKnob("family", [LSTM_FAMILY]), *knobs], constraints)


def lstm_default(workload: CpuWorkload) -> Config:
    """The untuned config: the kernel's own default (`kernel.recurrent.default_lstm_schedule`: one panel per block,
    the reduction unrolled by 4 where that divides it, the directions in parallel where a region pays), so an
    untuned build and the tuner's first measurement are one kernel."""
    default: LstmSchedule = workload.extras["default"]
    return Config({"family": LSTM_FAMILY, "width": default.width, "k_unroll": default.k_unroll,
                   "parallel": default.parallel, "interleave": default.interleave})


def lstm_schedule(workload: CpuWorkload, config: Mapping[str, Any]) -> LstmSchedule:
    """The `LstmSchedule` of a config of this workload's space. Raises InvalidConfigError for a config that is not
    a point of it."""
    config = config if isinstance(config, Config) else Config(dict(config))
    lstm_space(workload).validate(config)
    return LstmSchedule(int(config["width"]), int(config["k_unroll"]),  # type: ignore[arg-type]
                        bool(config["parallel"]), bool(config["interleave"]))


def lstm_kernel(func: Function, target: Target, name: str, config: Mapping[str, Any] | None = None
                ) -> tir.PrimFunc:
    """The loop nest of a fused LSTM call under `config` (None: the default config)."""
    workload = lstm_workload(func, target)
    if workload is None:
        raise InvalidConfigError("an lstm config applies only to one call of an LSTM kernel")
    schedule = lstm_schedule(workload, config if config is not None else lstm_default(workload))
    return fixed_kernel(func, target, name, schedule)


def lstm_steps(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The steps of an LSTM config: one dict holding the config (see the module docstring)."""
    plain = config.to_dict() if isinstance(config, Config) else dict(config)
    return [{"kind": LSTM_STEP, "config": plain}]


def lstm_kernel_from_steps(func: Function, target: Target, name: str, steps: Sequence[Any]) -> tir.PrimFunc:
    """The loop nest of a fused LSTM call under the steps a tuning-log lookup found (`lstm_steps`). Raises
    InvalidConfigError for steps of another kind or a config outside the workload's space."""
    if len(steps) != 1 or not isinstance(steps[0], Mapping) or steps[0].get("kind") != LSTM_STEP:
        raise InvalidConfigError(f"an LSTM kernel takes one {LSTM_STEP!r} step, got {list(steps)[:2]}")
    return lstm_kernel(func, target, name, steps[0]["config"])
