"""The `group_conv2d_nchw` family: grouped NCHW convolutions that are not depthwise (ShuffleNet v1's 1x1
convolutions in 3 to 8 groups, ResNeXt's 3x3 ones), each output channel `oc` of group `oc // og` summing the `cg`
input channels `(oc // og) * cg + rc`.

The template is `conv2d_nchw`'s (register tile of `tile_c` output channels by rows and vectorized columns, or flat
position tiles on narrow 1x1 maps, weights packed `OIHW -> OIHW<fc>o`), with the group as the outer part of the
parallel channel loop: a tile of output channels never crosses a group boundary (`tile_c` divides the channels per
group `og`), so the input channel of every read is one value per tile, hoisted out of the reduction and the vector
loop, and each tile streams one group's input planes. The default rule and knobs are `conv2d_nchw`'s restricted to
such tiles.
"""

from __future__ import annotations

import functools
from typing import Any

from search_space.config import Config
from search_space.families.common import CpuWorkload, Family, TileKnob, inner_factor, split_value
from search_space.families.conv2d_nchw import _default as _nchw_default
from search_space.families.conv2d_nchw import _knobs as _nchw_knobs
from search_space.families.conv2d_nchw import _later_knobs as _nchw_later_knobs
from search_space.families.conv2d_nchw import _template_conv2d_nchw, _tile_c
from search_space.families.convolution import analyse_conv, tagged
from search_space.knobs import Knob
from search_space.space import Constraint


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    """`analyse_conv`'s fields, and `og`: the output channels per group."""
    fields = analyse_conv(prim, sch, anchor, target, constants, pointwise=True)
    call = prim.anchor_call
    groups = int(call.attrs.get("groups", 1)) if call is not None else 1
    channels = int(fields["dims"]["c"])
    fields["dims"] = {**fields["dims"], "groups": groups, "og": channels // max(groups, 1)}
    return fields


def _tile_inside_group(config: Config, per_group: int) -> bool:
    """A tile of output channels lies inside one group: its input channels are one contiguous slab."""
    return per_group % inner_factor(config, "tile_c") == 0


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    knobs, constraints = _nchw_knobs(workload)
    constraints.append(Constraint("channel tiles stay inside one group", functools.partial(
        _tile_inside_group, per_group=workload.dims["og"])))
    return knobs, constraints


def _group_factor(knob: TileKnob, per_group: int, wanted: int) -> int:
    """The widest candidate tile of at most `wanted` channels that divides the channels per group (1 always does)."""
    return max((c for c in knob.candidates if c <= max(1, wanted) and per_group % c == 0), default=1)


def _default(workload: CpuWorkload) -> dict[str, Any]:
    """`conv2d_nchw`'s default with its channel tile narrowed to one that divides the channels per group (28 per
    group in tiles of 8 become tiles of 7: the same registers, no tile across two groups)."""
    values = _nchw_default(workload)
    dims = workload.dims
    tile = inner_factor(Config(values), "tile_c")
    if dims["og"] % tile:
        tile = _group_factor(_tile_c(workload), dims["og"], tile)
        values["tile_c"] = split_value(dims["c"], tile)
    if "pack_w" in values:
        # Unpacked: each channel's weights are one contiguous row of `cg` values, read once per tile by broadcasts.
        # Packed by tile, the 1x1 convolutions of ShuffleNet v1 ran 1.1-2.2x slower on one core (`python -m
        # experiments grouped-conv --kernels`).
        values["pack_w"] = False
    return values


def _later_knobs(workload: CpuWorkload, config: Config) -> Config:
    return _nchw_later_knobs(workload, config)


GROUP_CONV2D_NCHW = Family("group_conv2d_nchw", tagged("group_conv2d_nchw"), _analyse, _knobs, _default,
                           _template_conv2d_nchw, _later_knobs)
