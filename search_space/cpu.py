"""CPU schedule spaces: the workload of a fused function, and dispatch to its operator family.

    workload = analyze(prim, target, constant_inputs)   # prim: relay_tune.kernel.compute.primitive_compute(func)
    space = cpu_space(workload)                          # knobs + constraints (invalid configs never get built)
    config = default_config(workload)                    # the untuned config, chosen by a rule from the shapes
    steps = family_for(prim).steps(prim, config, target) # replayable `Step`s for `lower_primitive`

Each operator family (`search_space.families`: dense, conv2d_nchw, depthwise, reduction, injective, winograd, ...)
holds its space, its default rule and its template in one module; this module only asks the family table. The
default schedule an untuned build runs is the family's template at `default_config(workload)`
(`search_space.defaults`), and the tuner measures and logs that same config first.

A config is plain data; its `family` knob names the template. The template is deterministic: the same config gives
the same steps in every process, which is what makes a tuning log a recipe for the build. Tiles need not divide
their loops (lowering peels or guards the tails), so every config of a space is correct; constraints only reject
configs that cannot be fast (an accumulator tile that spills out of the vector registers) or that would describe
the same schedule as another config (a duplicate costs a measurement).

`relay-tune tasks MODEL --spaces` prints each task's family and space size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from relay_tune.kernel.schedule import Schedule
from search_space.config import Config
from search_space.families import FAMILIES, FAMILY_TABLE, Family, family_for, family_named, matching_family
from search_space.families.common import (
    PARALLEL_MIN_WORK,
    CpuWorkload,
    TileKnob,
    accumulator_registers,
    anchor_stage,
    input_index,
    parameter_numbers,
    target_registers,
    vector_registers,
)
from search_space.space import Space

__all__ = [
    "FAMILIES",
    "FAMILY_TABLE",
    "PARALLEL_MIN_WORK",
    "CpuWorkload",
    "Family",
    "TileKnob",
    "accumulator_registers",
    "analyze",
    "cpu_space",
    "default_config",
    "family_for",
    "family_named",
    "family_of",
    "format_space_table",
    "input_index",
    "parameter_numbers",
    "task_workload",
    "vector_registers",
    "with_later_knobs",
]


def family_of(prim: Any) -> str:
    """The name of the family that schedules a fused function."""
    return family_for(prim).name


def analyze(prim: Any, target: Any, constant_inputs: Iterable[int] = ()) -> CpuWorkload:
    """The `CpuWorkload` of a fused function's tensor expressions on `target`.

    constant_inputs: parameter numbers of the function that are model constants at every call site (weights).
    """
    sch = Schedule(prim.outputs)
    anchor = anchor_stage(sch, prim)
    family = matching_family(sch, prim, anchor)
    fields = family.analyse(prim, sch, anchor, target, frozenset(constant_inputs))
    return CpuWorkload(family=family.name, registers=target_registers(target), cores=target.num_cores, **fields)


def cpu_space(workload: CpuWorkload) -> Space:
    """The search space of one fused function on one CPU target (its family's knobs and constraints)."""
    return family_named(workload.family).space(workload)


def default_config(workload: CpuWorkload) -> Config:
    """The untuned config of a workload, a point of `cpu_space(workload)`: the family's rule picks each knob from
    the shapes (register tiles as large as the vector registers allow, parallel wherever the work pays for a
    parallel region). The default schedule is the family template at this config, and the tuner's first
    measurement."""
    return family_named(workload.family).default(workload)


def with_later_knobs(workload: CpuWorkload, config: Config) -> Config:
    """`config` with the knobs added to the space after it may have been logged, at the value that gives the
    schedule it described then (`tile_p` off: pointwise configs logged before flat mode existed)."""
    return family_named(workload.family).later_knobs(workload, config)


def task_workload(prim: Any, target: Any, constants: Iterable[int]) -> tuple[CpuWorkload, Config]:
    """The workload a task's space comes from and its default config (what an untuned build runs).

    `analyze` with the model constants, except for a dense whose weight the model receives at run time: its space
    also holds schedules that read the weight packed, the model packing it with a packing kernel before every call
    (the build and the runner both put that kernel in front of the dense), and the default packs it as it would
    pack a constant weight. Packing on every run beat reading the weight across the vector lanes (a gather) at
    every size measured, packing included: N = K = 1024, 4 / 64 / 512 rows: 1.13 / 12.6 / 75.0 ms unpacked,
    0.28 / 1.33 / 6.3 ms packed; N = K = 768, 4 rows: 0.19 against 0.16 ms."""
    workload = analyze(prim, target, constants)
    default = default_config(workload)
    if workload.family != "dense" or workload.constant_weight:
        return workload, default
    packable = analyze(prim, target, parameter_numbers(prim))
    if not packable.constant_weight:
        return workload, default
    space = cpu_space(packable)
    packed = default_config(packable)
    if space.is_valid(packed):
        return packable, packed
    unpacked = Config({**default, "pack_b": False})
    return (packable, unpacked) if space.is_valid(unpacked) else (workload, default)


def format_space_table(rows: Sequence[tuple[str, str, Space]]) -> str:
    """A plain-text table of (description, family, space): knob combinations and valid configs (when small
    enough to count)."""
    lines = [f"{'family':22}  {'knobs':>5}  {'combinations':>12}  {'valid':>10}  workload"]
    for description, family, space in rows:
        valid = space.count_valid(limit=200_000)
        lines.append(f"{family:22}  {len(space.knobs):>5}  {space.size():>12,}  "
                     f"{(f'{valid:,}' if valid is not None else '-'):>10}  {description}")
    return "\n".join(lines)
