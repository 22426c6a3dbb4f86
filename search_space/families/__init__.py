"""The CPU operator families: one module per family, each holding its space, its default rule and its template side
by side, registered in one table.

    family = family_for(prim)                       # the first family of the table that matches
    workload = analyze(prim, target, constants)     # (search_space.cpu) the facts its space depends on
    space = family.space(workload)                  # knobs + constraints
    config = family.default(workload)               # the untuned config, computed from the shapes
    steps = family.steps(prim, config, target)      # the template's schedule steps

| family                   | module         | takes                                                               |
|--------------------------|----------------|---------------------------------------------------------------------|
| `winograd`               | `winograd`     | a Winograd transform (`relay_tune.op.winograd`) with its epilogue    |
| `injective`              | `injective`    | every function without a reduction (element-wise, layout transforms) |
| `dense`                  | `dense`        | `nn.dense` with a 2-D weight                                        |
| `batch_matmul`           | `dense`        | `nn.batch_matmul`                                                   |
| `conv2d_nchw`            | `conv2d_nchw`  | NCHW convolutions                                                   |
| `group_conv2d_nchw`      | `group_conv`   | NCHW grouped convolutions that are not depthwise                    |
| `conv2d_nchw_cl`         | `channel_last` | NCHW convolutions on narrow maps, sums kept channel-innermost       |
| `conv2d_nhwc`            | `channel_last` | NHWC convolutions                                                   |
| `depthwise_conv2d_nchw`  | `depthwise`    | NCHW depthwise convolutions                                         |
| `conv2d_nchwc`           | `conv2d_nchwc` | `nn.contrib_conv2d_NCHWc` (channel-blocked layouts)                 |
| `conv2d_nchwc_int8`      | `conv2d_nchwc_int8` | `nn.contrib_conv2d_NCHWc_int8` (u8 x s8, packed for dot products) |
| `conv2d_nchwc_bf16`      | `conv2d_nchwc_bf16` | `nn.contrib_conv2d_NCHWc_bf16` (bf16 pairs into fp32 lanes)      |
| `depthwise_conv2d_nchwc` | `depthwise`    | depthwise convolutions on channel-blocked layouts                   |
| `reduction`              | `reduction`    | every other reduction: pooling, softmax, normalisations, ...        |

The fixed LSTM kernels (`relay_tune.kernel.recurrent`, loop nests written by hand) have a family of their own,
`lstm` (`search_space.families.lstm`), outside this table: it has no tensor-expression template, and a task is of it
exactly when its fused function is one LSTM call. The table's order is the order in which families are asked: the
Winograd transforms before everything, functions without a reduction next, `reduction` last.
`search_space.families.common` holds what several families share. """

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from relay_tune.kernel.schedule import Schedule
from search_space.families.channel_last import CONV2D_NCHW_CL, CONV2D_NHWC
from search_space.families.common import Family, anchor_stage
from search_space.families.conv2d_nchw import CONV2D_NCHW
from search_space.families.conv2d_nchwc import CONV2D_NCHWC
from search_space.families.conv2d_nchwc_bf16 import CONV2D_NCHWC_BF16
from search_space.families.conv2d_nchwc_int8 import CONV2D_NCHWC_INT8
from search_space.families.dense import BATCH_MATMUL, DENSE
from search_space.families.depthwise import DEPTHWISE_CONV2D_NCHW, DEPTHWISE_CONV2D_NCHWC
from search_space.families.group_conv import GROUP_CONV2D_NCHW
from search_space.families.injective import INJECTIVE
from search_space.families.reduction import REDUCTION
from search_space.families.winograd import WINOGRAD

__all__ = ["FAMILIES", "FAMILY_TABLE", "Family", "family_for", "family_named", "matching_family"]

FAMILY_TABLE: tuple[Family, ...] = (
    WINOGRAD, INJECTIVE, DENSE, BATCH_MATMUL, CONV2D_NCHW, GROUP_CONV2D_NCHW, CONV2D_NCHW_CL, CONV2D_NHWC,
    DEPTHWISE_CONV2D_NCHW, CONV2D_NCHWC, CONV2D_NCHWC_INT8, CONV2D_NCHWC_BF16, DEPTHWISE_CONV2D_NCHWC, REDUCTION,
)
"""Every CPU family, in the order `family_for` asks them."""

_BY_NAME: Mapping[str, Family] = MappingProxyType({family.name: family for family in FAMILY_TABLE})

FAMILIES: tuple[str, ...] = tuple(_BY_NAME)
"""The names of the CPU families (a config's `family` knob)."""


def family_named(name: str) -> Family:
    """The family of a config's `family` knob. Raises KeyError for a name that is not a CPU family."""
    return _BY_NAME[name]


def matching_family(sch: Any, prim: Any, anchor: Any) -> Family:
    """The first family of the table that takes `prim` (its schedule `sch`, its anchor stage `anchor`)."""
    return next(family for family in FAMILY_TABLE if family.matches(sch, prim, anchor))


def family_for(prim: Any) -> Family:
    """The family that schedules a fused function's tensor expressions `prim`."""
    sch = Schedule(prim.outputs)
    return matching_family(sch, prim, anchor_stage(sch, prim))
