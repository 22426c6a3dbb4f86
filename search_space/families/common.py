"""What every CPU operator family shares: the workload facts a space depends on, the shape analysis behind them,
knob and default helpers, and the loop helpers the templates build on.

A family module (`search_space.families.dense`, `.conv2d_nchw`, ...) holds one family's space, default rule and
template side by side; this module holds what two or more of them use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay_tune.kernel import te
from relay_tune.kernel.compute import INLINABLE_TAGS
from relay_tune.kernel.schedule import ROOT, Schedule, ScheduleError
from search_space.config import Config, InvalidConfigError
from search_space.knobs import ChoiceKnob, Knob, SplitKnob
from search_space.space import Constraint, Space

SPARE_REGISTERS = 4
"""Vector registers left for operands (broadcast inputs, weight vectors) besides the accumulator tile."""
MAX_TILE_ROWS = 16  # register rows of a matmul tile (unrolled)
MAX_VECTOR = 64  # lanes of a vectorized tile axis
MAX_K_UNROLL = 16
MAX_CONV_CHANNELS = 32  # output channels of a convolution register tile
MAX_CONV_ROWS = 8
MAX_CHANNEL_BLOCKS = 8  # output channel blocks of a blocked convolution's register tile
PARALLEL_MIN_WORK = 1 << 14
"""Below this much work (output elements times reduction size) a default kernel runs on one core: starting a
parallel region costs more than it saves. With the team's threads spinning briefly between regions
(`relay_tune.codegen.jit.DEFAULT_GOMP_SPINCOUNT`) a region costs a few microseconds on an idle host. On a host with
more runnable threads than cores a libgomp region can cost a scheduler time slice, and a threshold of 2^18 with no
spin kept small models steady there (`python -m experiments spin-policy`), but made the zoo CNNs 1.3x slower on an
idle host: this threshold is for the idle host. The native thread team (the default runtime) does not wait for
threads that have not started, so its regions stay cheap there (`python -m experiments thread-team`)."""


# ---------------------------------------------------------------------------------------------------------------
# What a space needs to know about a fused function
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuWorkload:
    """The facts about one fused function on one CPU target that its space depends on (plain data).

    dims: family-specific extents (see each family's `analyse`). lanes: vector lanes of the anchor's dtype.
    registers: vector registers of the target. constant_weight: the operand a schedule may pack is a model constant
    (packing is then done once, ahead of time; a packed non-constant input would cost a copy the measurement cannot
    see).
    """

    family: str
    dims: Mapping[str, int]
    lanes: int
    registers: int
    cores: int
    constant_weight: bool = False
    has_pad: bool = False
    pointwise: bool = False
    weight_layout: str = ""
    default_parallel: bool = False
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def accumulator_budget(self) -> int:
        return max(1, self.registers - SPARE_REGISTERS)


def vector_registers(width: int, lanes: int) -> int:
    """Registers one row of `width` lanes occupies: whole vectors, then the power-of-two chunks the code generator
    cuts the rest into (each in a register of its own)."""
    return max(1, width // lanes + bin(width % lanes).count("1"))


def accumulator_registers(rows: int, width: int, lanes: int) -> int:
    return rows * vector_registers(width, lanes)


def target_registers(target: Any) -> int:
    return 32 if target.vector_bits >= 512 else 16


def anchor_stage(sch: Any, prim: Any) -> Any:
    """The stage of the anchor call that holds its main reduction (or its result when it has none)."""
    call = prim.anchor_call
    if call is None:
        return None
    stages = [st for st in (sch.stage_of_tensor(t) for t in call.tensors) if st is not None and st.op is not None]
    for st in reversed(stages):
        if st.op.is_reduction:
            return st
    return stages[-1] if stages else None


def producers_tagged(sch: Any, stage: Any, tag: str) -> list[Any]:
    found = []
    for t in te.tensors_read(stage.op.body):
        producer = sch.stage_of_tensor(t)
        if producer is not None and producer.op is not None and producer.op.tag == tag:
            found.append(producer)
    return found


def stage_work(stage: Any) -> int:
    return math.prod(ax.extent for ax in stage.root_axes)


def parallel_worthwhile(target: Any, work: int) -> bool:
    return target.num_cores > 1 and work >= PARALLEL_MIN_WORK


def input_index(tensor: Any) -> int | None:
    """The parameter number of a kernel input placeholder (`p3` -> 3, `p1.0` -> 1)."""
    name = str(tensor.name)
    if not name.startswith("p"):
        return None
    head = name[1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def parameter_numbers(prim: Any) -> tuple[int, ...]:
    """The parameter number of every kernel input (as constants: every weight a schedule may pack)."""
    return tuple(i for i in (input_index(t) for t in prim.inputs) if i is not None)


def blocked_stage(stage: Any) -> bool:
    """A 5-D stage whose innermost axis looks like a channel block (`NCHW{b}c`: a power of two from 4 to
    `MAX_VECTOR` lanes; a 5-D channel shuffle `(n, g, c/g, h, w)` on maps of 7, 14, 28... columns does not)."""
    axes = stage.op.axes
    block = axes[-1].extent if len(axes) == 5 else 0
    return 4 <= block <= MAX_VECTOR and block & (block - 1) == 0


def pad_stages(sch: Any) -> list[Any]:
    """The stages of `sch` that pad an input (a pooling window's border), not the output."""
    return [st for st in sch.stages.values() if st.op is not None and st.op.tag == "pad" and not st.is_output]


def _unchanged(workload: CpuWorkload, config: Config) -> Config:
    return config


@dataclass(frozen=True)
class Family:
    """One operator family's schedule knowledge on CPU: which fused functions it takes, what it reads from their
    shapes, its knobs, the rule for its untuned config, and its template.

    matches(schedule, prim, anchor stage): the family takes this function (the table asks in its order).
    analyse(prim, schedule, anchor stage, target, constant inputs): the family's `CpuWorkload` fields.
    knobs(workload): the knobs after `family`, and the constraints.
    default_values(workload): the untuned value of each of those knobs, in the same order.
    template(schedule, prim, config, target): records the config's steps on the schedule.
    later_knobs(workload, config): a logged config with the knobs added since, at the value that keeps its schedule.
    """

    name: str
    matches: Callable[[Any, Any, Any], bool]
    analyse: Callable[[Any, Any, Any, Any, frozenset[int]], dict[str, Any]]
    knobs: Callable[[CpuWorkload], tuple[list[Knob], list[Constraint]]]
    default_values: Callable[[CpuWorkload], dict[str, Any]]
    template: Callable[[Any, Any, Config, Any], None]
    later_knobs: Callable[[CpuWorkload, Config], Config] = _unchanged

    def space(self, workload: CpuWorkload) -> Space:
        """The search space of a workload of this family (the `family` knob first)."""
        knobs, constraints = self.knobs(workload)
        return Space([ChoiceKnob("family", [self.name]), *knobs], constraints)

    def default(self, workload: CpuWorkload) -> Config:
        """The untuned config of a workload of this family, computed from its shapes."""
        return Config({"family": self.name, **self.default_values(workload)})

    def steps(self, prim: Any, config: Config | Mapping[str, Any], target: Any) -> list[Any]:
        """The schedule steps of a config of this family for the fused function's tensor expressions `prim` (a
        function of this family). Raises `InvalidConfigError` for a config of another family, or one the template
        rejects."""
        if not isinstance(config, Config):
            config = Config(dict(config))
        if config.get("family") != self.name:
            raise InvalidConfigError(f"a {config.get('family')!r} config does not apply to a {self.name} workload")
        sch = Schedule(prim.outputs)
        try:
            self.template(sch, prim, config, target)
        except ScheduleError as err:
            raise InvalidConfigError(f"the {self.name} template rejects {config!r}: {err}") from err
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidConfigError(f"not a complete {self.name} config ({err}): {config!r}") from err
        return list(sch.steps)


def default_parallel(workload: CpuWorkload, levels: int) -> int:
    """The default `parallel` knob of a space with `parallel_choices(workload, levels)`: every outer level where
    the work pays for a parallel region, else none."""
    return max(parallel_choices(workload, levels)) if workload.default_parallel else 0


# ---------------------------------------------------------------------------------------------------------------
# Knobs, constraints and defaults (constraints are module-level functions: spaces travel to build worker processes)
# ---------------------------------------------------------------------------------------------------------------


def inner_factor(config: Config, name: str) -> int:
    value = config[name]
    assert isinstance(value, tuple)
    return int(value[-1])


def middle_factor(config: Config, name: str) -> int:
    value = config[name]
    assert isinstance(value, tuple)
    return int(value[1]) if len(value) == 3 else 1


def outer_factor(config: Config, name: str) -> int:
    value = config[name]
    assert isinstance(value, tuple)
    return int(value[0])


def mid_level_needs_outer(config: Config, name: str) -> bool:
    """A middle split level only matters when the outer level has more than one iteration."""
    value = config[name]
    assert isinstance(value, tuple)
    return len(value) < 3 or int(value[1]) == 1 or int(value[0]) > 1


class TileKnob(SplitKnob):
    """A multi-level split whose inner factors are the "verbose" candidates (divisors and powers of two) plus
    `extra` sizes that matter for registers whatever the extent: 6 or 12 rows of accumulators, 48 lanes (three
    AVX-512 vectors). A factor need not divide the extent; the tail is peeled or guarded by lowering."""

    def __init__(self, name: str, extent: int, levels: int, max_factor: int, extra: Iterable[int] = ()) -> None:
        super().__init__(name, extent, levels=levels, policy="verbose", max_factor=max_factor)
        chosen = set(self.candidates) | {int(e) for e in extra if 1 <= int(e) <= min(extent, max_factor)}
        self._candidates = tuple(sorted(chosen | {1}))
        self._index = {c: i for i, c in enumerate(self._candidates)}
        self._materialised = None


def row_sizes(limit: int) -> range:
    return range(1, limit + 1)


def vector_sizes(lanes: int, limit: int) -> list[int]:
    step = max(1, lanes // 2)
    return list(range(step, limit + 1, step))


def parallel_choices(workload: CpuWorkload, levels: int) -> list[int]:
    return [0] if workload.cores <= 1 else list(range(levels + 1))


def vector_choices(extent: int, lanes: int) -> list[int]:
    choices = [v for v in (lanes // 2, lanes, 2 * lanes, 4 * lanes) if 1 <= v <= max(extent, 1)]
    return sorted(set(choices)) or [1]


def split_value(extent: int, *inner: int) -> tuple[int, ...]:
    return (-(-extent // math.prod(inner)), *inner)


def closest_factor(knob: SplitKnob, wanted: int) -> int:
    """The largest candidate factor of a split knob that is at most `wanted` (1 at least)."""
    return max((c for c in knob.candidates if c <= max(1, wanted)), default=1)


def dividing_factor(knob: SplitKnob, wanted: int) -> int:
    """The largest candidate factor at most `wanted` that divides the knob's extent, unless that is less than half
    of `wanted` (then the closest factor, tail and all). A tile that leaves a tail gets its last block peeled by
    lowering; when the blocks are few (8 channels in tiles of 7), the peeled copy is most of the loop and the
    parallel loop over blocks disappears with it (the 1x1 convolution 1x32x8x8 by 8x32 ran on one core)."""
    limit = max(1, wanted)
    dividing = max((c for c in knob.candidates if c <= limit and knob.extent % c == 0), default=1)
    return dividing if 2 * dividing >= limit else closest_factor(knob, wanted)


def balanced(extent: int, most: int) -> int:
    """The widest piece of the fewest pieces of at most `most` that cover `extent`, as even as they go (13 in
    pieces of at most 8: 7 + 6)."""
    most = max(1, min(extent, most))
    return -(-extent // -(-extent // most))


# ---------------------------------------------------------------------------------------------------------------
# Loops the templates share
# ---------------------------------------------------------------------------------------------------------------


def inline_cheap(sch: Any, keep: Iterable[str] = ()) -> None:
    """Inline every element-wise / injective stage that is not an output (nor listed in `keep`)."""
    kept = set(keep)
    for name, stage in list(sch.stages.items()):
        op = stage.op
        if op is None or stage.is_output or name in kept or op.is_reduction or stage.attach != ROOT:
            continue
        if op.tag in INLINABLE_TAGS or not op.tag:
            sch.compute_inline(name)


def cache_accumulator(sch: Any, anchor: Any) -> str:
    acc = sch.cache_write(anchor.name, "local")
    if not anchor.is_output:
        sch.compute_inline(anchor.name)
    return str(acc)


def flat_loops(sch: Any, stage: Any, target: Any, mode: str = "inner", vector: int | None = None,
                parallel: bool | None = None) -> None:
    """Loops of a root stage without reduction.

    mode "inner": the innermost axis vectorized whole when it is at least a vector wide, else as "flat";
    "rows": the two innermost axes fused and split by `vector` (vectorized inside), the others fused outside;
    "split": the innermost axis split by `vector` (vectorized inside), the other axes fused outside;
    "flat": every axis fused into one loop split by `vector`. The outer loop is parallel when `parallel` (None:
    when the work is large enough). A stage with a reduction gets its spatial loops fused (and parallel).
    """
    name = stage.name
    spatial = [lp for lp in sch.leaves(name) if not stage.loops[lp].is_reduce]
    if not spatial:
        return
    has_reduce = len(sch.leaves(name)) > len(spatial)
    lanes = target.vector_lanes(stage.tensor.dtype)
    width = vector or lanes
    extents = [ax.extent for ax in stage.op.axes]
    outer: str | None
    if has_reduce or lanes == 1:
        outer = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
    elif mode == "inner" and len(spatial) >= 2 and extents[-1] >= lanes:
        outer = spatial[0] if len(spatial) == 2 else sch.fuse(name, *spatial[:-1])
        sch.vectorize(name, spatial[-1])
    elif mode == "inner" and len(spatial) >= 3 and trailing_axes(extents, width) < len(spatial) - 1:
        # Rows narrower than a vector (a 14x14 or 7x7 map): fuse the fewest trailing axes that fill a vector and
        # vectorize those in pieces of `width`; the leading axes (channels) stay outside. Fusing every axis
        # instead lets one vector span two channels, and a kernel that moves channels (concatenation, channel
        # shuffle, split) then gathers lane by lane; here a vector reads one channel, contiguously.
        count = trailing_axes(extents, width)
        rows = spatial[-1] if count == 1 else sch.fuse(name, *spatial[-count:])  # one axis wide enough: no fuse
        _, ii = sch.split(name, rows, factor=width)
        lead = spatial[:-count]
        outer = lead[0] if len(lead) == 1 else sch.fuse(name, *lead)
        sch.vectorize(name, ii)
    elif mode == "rows" and len(spatial) >= 3:
        # the two innermost axes (columns and channel block of NCHW{b}c) as one run, in vectors of `width`
        row = sch.fuse(name, spatial[-2], spatial[-1])
        inner = sch.split(name, row, factor=width)[1] if extents[-2] * extents[-1] > width else row
        lead = spatial[:-2]
        outer = lead[0] if len(lead) == 1 else sch.fuse(name, *lead)
        sch.vectorize(name, inner)
    elif mode == "split" and len(spatial) >= 2 and extents[-1] > width:
        _, ii = sch.split(name, spatial[-1], factor=width)
        outer = spatial[0] if len(spatial) == 2 else sch.fuse(name, *spatial[:-1])
        sch.vectorize(name, ii)
    else:
        flat = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
        if math.prod(extents) >= width:
            outer, inner = sch.split(name, flat, factor=width)
            sch.vectorize(name, inner)
        else:
            outer = None
            sch.vectorize(name, flat)
    if parallel is None:
        parallel = parallel_worthwhile(target, stage_work(stage))
    if outer is not None and parallel and target.num_cores > 1:
        sch.parallel(name, outer)


def trailing_axes(extents: Sequence[int], width: int) -> int:
    """How many trailing axes together reach `width` elements (all of them when none do)."""
    total = 1
    for count, extent in enumerate(reversed(extents), 1):
        total *= extent
        if total >= width:
            return count
    return len(extents)


def split_levels(sch: Any, stage: str, loop: str, value: tuple[int, ...]) -> list[str]:
    """Split `loop` by a split-knob value (outer, [middle,] inner), leaving out middle levels of 1."""
    inner = [int(f) for f in value[1:]]
    kept = [f for f in inner[:-1] if f > 1] + [inner[-1]]
    if len(kept) == 1:
        return list(sch.split(stage, loop, factor=kept[0]))
    return list(sch.split(stage, loop, factors=(None, *kept)))


def fuse_outer(sch: Any, out: str, outer: Sequence[str], parallel: int, target: Any) -> str:
    """Fuse a conv's outer loops `[n, a, b]`: parallel 2 (or serial 0) fuses all three into one loop, parallel 1
    makes `n.a` the parallel loop and leaves `b` serial inside it. Returns the innermost outer loop."""
    n, a, b = outer
    if parallel == 1 and target.num_cores > 1:
        head = sch.fuse(out, n, a)
        sch.parallel(out, head)
        return b
    fused = sch.fuse(out, n, a, b)
    if parallel == 2 and target.num_cores > 1:
        sch.parallel(out, fused)
    return str(fused)


def blocked_rows(sch: Any, stage: Any, target: Any) -> None:
    """Loops of a root stage `(n, c, h, w, b)` on a blocked layout: rows in parallel, the columns of a row a
    serial loop, each column one vector of the block. `flat_loops` fuses every axis but the block, and the index
    arithmetic of one 16-lane copy then costs more than the copy."""
    leaves = list(sch.leaves(stage.name))
    if len(leaves) != 5:
        flat_loops(sch, stage, target)
        return
    n, c, h, _w, lane = leaves
    rows = sch.fuse(stage.name, n, c, h)
    if parallel_worthwhile(target, stage_work(stage)):
        sch.parallel(stage.name, rows)
    sch.vectorize(stage.name, lane)
