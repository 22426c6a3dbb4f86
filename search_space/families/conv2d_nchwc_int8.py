"""The `conv2d_nchwc_int8` family: `nn.contrib_conv2d_NCHWc_int8` (uint8 `NCHW{bi}c` data, an int8 weight packed as
`(O/bo, C/bi, KH, KW, bi/4, bo, 4)`, int32 `NCHW{bo}c` sums; `relay_tune.op.quantized`).

The template is the fp32 blocked convolution's (`conv2d_nchwc`): a register tile of `tile_w` output columns by
`tile_cb` output channel blocks, the block's `bo` lanes vectorized, the reduction (channel blocks, kernel taps,
quads of a block) outside the tile. Each reduction step broadcasts one 32-bit quad of input channels and loads one
`4 * bo`-byte weight row per block, and the dot-product intrinsic turns that into vpdpbusd (VNNI) or
vpmaddubsw + vpmaddwd per register of lanes; with a weight in pairs (full-range int8 weights on x86 without VNNI) a
step broadcasts a pair of input channels widened to int16 and runs one vpmaddwd per register of lanes. The
requantization epilogue runs on the tile's vectors. The knobs and the default rule are `conv2d_nchwc`'s, with
registers fewer for the tile: two for the four-byte products (their int16 pair sums and the vector of ones vpmaddwd
widens them with), one for the two-term products (vpmaddwd's result before it is added).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from search_space.families.common import CpuWorkload, Family
from search_space.families.conv2d_nchwc import CONV2D_NCHWC
from search_space.families.convolution import analyse_blocked_conv, tagged
from search_space.knobs import Knob
from search_space.space import Constraint

DOT_REGISTERS = 2
"""Vector registers a four-byte dot-product step needs besides the tile's accumulators, weight rows and broadcast
quad."""
DOT2_REGISTERS = 1
"""The same for a two-term (weight in pairs) step: vpmaddwd's result before it is added."""


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    fields = analyse_blocked_conv(prim, sch, anchor, target, constants, depthwise=False)
    call = prim.anchor_call
    pairs = bool(call.attrs.get("pairs_fit_int16")) if call is not None else False
    two = any(len(t.shape) == 7 and t.shape[-1] == 2 for t in prim.inputs)  # a weight packed in pairs
    return {**fields, "extras": {"pairs_fit_int16": pairs, "pair_weight": two}}


def _with_dot_registers(workload: CpuWorkload) -> CpuWorkload:
    """The workload with the registers the dot products take away from the tile: without VNNI, an int8 weight whose
    pairs may saturate is split into two halves (`relay_tune.codegen.llvm_dot`), a second register per weight row,
    counted here as a smaller register file."""
    if workload.extras.get("pair_weight", False):
        return dataclasses.replace(workload, registers=workload.registers - DOT2_REGISTERS)
    spare = DOT_REGISTERS
    if not workload.extras.get("pairs_fit_int16", True):
        spare += 2
    return dataclasses.replace(workload, registers=workload.registers - spare)


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    return CONV2D_NCHWC.knobs(_with_dot_registers(workload))


def _default(workload: CpuWorkload) -> dict[str, Any]:
    return CONV2D_NCHWC.default_values(_with_dot_registers(workload))


CONV2D_NCHWC_INT8 = Family("conv2d_nchwc_int8", tagged("conv2d_nchwc_int8"), _analyse, _knobs, _default,
                           CONV2D_NCHWC.template)
