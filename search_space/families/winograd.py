"""The `winograd` family: the Winograd transforms of `relay_tune.op.winograd` (an output transform with its fused
epilogue), the transform positions unrolled and the channel block vectorized.

Knobs: `order` (tiles or channel blocks outermost) and `parallel`.
"""

from __future__ import annotations

from typing import Any

from relay_tune.kernel import te
from relay_tune.kernel.compute import INLINABLE_TAGS
from relay_tune.kernel.schedule import ROOT
from search_space.config import Config
from search_space.families.common import (
    CpuWorkload,
    Family,
    blocked_stage,
    default_parallel,
    parallel_choices,
    parallel_worthwhile,
    stage_work,
)
from search_space.knobs import ChoiceKnob, Knob
from search_space.space import Constraint

WINOGRAD_TAGS = ("winograd_input", "winograd_output")
"""Stage tags of the Winograd transforms (`relay_tune.op.winograd`): a fused function holding one is scheduled by
the `winograd` template."""


def winograd_stage(sch: Any) -> Any:
    """The Winograd transform stage of a schedule's function, or None."""
    return next((st for st in sch.stages.values() if st.op is not None and st.op.tag in WINOGRAD_TAGS), None)


def _matches(sch: Any, prim: Any, anchor: Any) -> bool:
    return len(prim.outputs) == 1 and winograd_stage(sch) is not None


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    out = sch[prim.outputs[0]]
    transform = winograd_stage(sch)
    dims = {"output": int(transform.op.tag == "winograd_output"),
            "block": out.op.axes[-1].extent if blocked_stage(out) else 0}
    return {"dims": dims, "lanes": target.vector_lanes(out.tensor.dtype),
            "default_parallel": parallel_worthwhile(target, stage_work(transform))}


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    # which loop is outermost (and parallel): tiles (`pc`) or channel blocks (`cp`)
    return [ChoiceKnob("order", ["pc", "cp"]), ChoiceKnob("parallel", parallel_choices(workload, 1))], []


def _default(workload: CpuWorkload) -> dict[str, Any]:
    """Output transforms loop over channel blocks outside the tiles: each tile reads alpha^2 rows of the product
    a whole row apart, and walking tiles of one block reuses their cache sets (ResNet-50's 36x16x256 product into
    14x14 maps, isolated: 60 us against 148 us tiles outermost; 36x196x64 73 against 89; 36x49x128 36 against
    28). Input transforms: tiles outermost (within noise of the other order)."""
    return {"order": "cp" if workload.dims["output"] else "pc", "parallel": default_parallel(workload, 1)}


def _template_winograd(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """A Winograd transform (`relay_tune.op.winograd`) and what is fused with it: every other stage inlined into
    the output, whose transform positions are unrolled, so that each position's `Select` on it leaves one sum with
    literal coefficients and the partial sums positions share are computed once; the channel block (or a vector of
    channels) is the vector.

    Input side, output `(alpha^2, tiles, C)`: loops tiles x channel blocks (`order`), then the alpha^2 positions
    (unrolled), then the block's channels (vectorized): one tile's alpha x alpha input vectors feed all positions.
    Output side, `(n, K/b, H, W, b)`: rows and columns split into tiles of m, loops over blocks and tiles
    (`order`), the m x m positions of a tile unrolled, the block vectorized; a fused epilogue (bias, activation,
    residual) runs on those vectors. An NCHW output (no block) keeps scalar code."""
    transform = winograd_stage(sch)
    out = sch[prim.outputs[0]]
    for name, stage in list(sch.stages.items()):
        if stage.op is not None and not stage.is_output and stage.attach == ROOT and (
                stage.op.tag in INLINABLE_TAGS or not stage.op.tag or stage.op.tag == "pad" or stage is transform):
            sch.compute_inline(name)
    parallel = bool(config["parallel"]) and target.num_cores > 1
    name = out.name
    leaves = list(sch.leaves(name))
    if transform.op.tag == "winograd_input":
        e, p, c = leaves
        block = _winograd_input_block(transform)
        lanes = target.vector_lanes(out.tensor.dtype)
        co, ci = sch.split(name, c, factor=block or lanes)
        outer = [p, co] if config["order"] == "pc" else [co, p]
        sch.reorder(name, *outer, e, ci)
        head = sch.fuse(name, *outer)
        if parallel:
            sch.parallel(name, head)
        sch.unroll(name, e)
        sch.vectorize(name, ci)
        return
    m = _winograd_tile(transform)
    if len(leaves) == 5:
        n, k, h, w, lane = leaves
    else:
        (n, k, h, w), lane = leaves, None
    ho, hi = sch.split(name, h, factor=m)
    wo, wi = sch.split(name, w, factor=m)
    outer = [n, k, ho] if config["order"] == "cp" else [n, ho, k]
    sch.reorder(name, *outer, wo, hi, wi, *([lane] if lane else []))
    head = sch.fuse(name, *outer)
    if parallel:
        sch.parallel(name, head)
    sch.unroll(name, hi)
    sch.unroll(name, wi)
    if lane is not None:
        sch.vectorize(name, lane)


def _winograd_input_block(transform: Any) -> int:
    """The channel block the input transform reads (`NCHW{b}c` data: its 5-D input's last axis), 0 for NCHW."""
    for t in te.tensors_read(transform.op.body):
        if t.ndim == 5:
            return int(t.shape[-1])
    return 0


def _winograd_tile(transform: Any) -> int:
    """m of the output transform's F(m x m, 3 x 3): alpha^2 = (m + 2)^2 rows in its input."""
    alpha_sq = next(t.shape[0] for t in te.tensors_read(transform.op.body) if t.ndim == 3)
    return round(alpha_sq ** 0.5) - 2


WINOGRAD = Family("winograd", _matches, _analyse, _knobs, _default, _template_winograd)
