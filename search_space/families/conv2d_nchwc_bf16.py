"""The `conv2d_nchwc_bf16` family: `nn.contrib_conv2d_NCHWc_bf16` (bfloat16 `NCHW{bi}c` data, a bfloat16 weight
packed as `(O/bo, C/bi, KH, KW, bi/2, bo, 2)`, float32 `NCHW{bo}c` sums; `relay_tune.op.bf16`).

The template is the fp32 blocked convolution's (`conv2d_nchwc`): a register tile of `tile_w` output columns by
`tile_cb` output channel blocks, the block's `bo` lanes vectorized, the reduction (channel blocks, kernel taps,
pairs of a block) outside the tile. Each reduction step broadcasts one 32-bit pair of input channels and loads one
`2 * bo`-element weight row per block, which the dot-product intrinsic turns into one vdpbf16ps per register of
lanes (AVX512_BF16) or, elsewhere, into the pairs widened to float32 (a shift and a mask each) and two fused
multiply-adds. The knobs and the default rule are `conv2d_nchwc`'s, with registers fewer for the tile where the
pairs are widened: the weight row's two halves and the broadcast pair's second half.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from relay_tune.target import DotFeatures
from search_space.families.common import CpuWorkload, Family
from search_space.families.conv2d_nchwc import CONV2D_NCHWC
from search_space.families.convolution import analyse_blocked_conv, tagged
from search_space.knobs import Knob
from search_space.space import Constraint

WIDENED_REGISTERS = 3
"""Vector registers a widened step needs besides the tile's accumulators, weight rows and broadcast pair."""


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    fields = analyse_blocked_conv(prim, sch, anchor, target, constants, depthwise=False)
    native = target.kind == "llvm" and DotFeatures.for_target(target).bf16
    return {**fields, "extras": {"bf16_native": bool(native)}}


def _with_dot_registers(workload: CpuWorkload) -> CpuWorkload:
    if workload.extras.get("bf16_native", False):
        return workload
    return dataclasses.replace(workload, registers=workload.registers - WIDENED_REGISTERS)


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    return CONV2D_NCHWC.knobs(_with_dot_registers(workload))


def _default(workload: CpuWorkload) -> dict[str, Any]:
    return CONV2D_NCHWC.default_values(_with_dot_registers(workload))


CONV2D_NCHWC_BF16 = Family("conv2d_nchwc_bf16", tagged("conv2d_nchwc_bf16"), _analyse, _knobs, _default,
                           CONV2D_NCHWC.template)
