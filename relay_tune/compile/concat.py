"""In-place concatenation: producers write a concatenation's parts straight into its result's buffer.

A concatenation along an axis with only unit axes before it (batch 1: NCHW or NCHW{b}c on channels) lays its
inputs out one after the other, so the kernel producing input k can write it at byte offset sum(nbytes of inputs
< k) of the result's buffer, and the concatenation kernel, a copy of every byte, is dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from relay_tune.compile.storage import StoragePlan
from relay_tune.ir import Call, Function, Op, Tuple
from relay_tune.runtime.memory_plan import DEFAULT_ALIGNMENT

Concat = tuple[int, list[int], int, int]
"""A concatenation call as the planner records it: (step, part values, result value, id(call site))."""


def bare_concatenation(func: Function) -> list[int] | None:
    """For a fused function that only concatenates its parameters (each once): the parameter numbers in the
    order of the concatenation; else None."""
    body = func.body
    if not (isinstance(body, Call) and isinstance(body.op, Op) and body.op.name == "concatenate"
            and len(body.args) == 1 and isinstance(body.args[0], Tuple)):
        return None
    position = {id(p): i for i, p in enumerate(func.params)}
    order = [position.get(id(f), -1) for f in body.args[0].fields]
    if -1 in order or len(set(order)) != len(order):
        return None
    return order


def concat_axis(out_shape: Sequence[int], shapes: Sequence[Sequence[int]]) -> int | None:
    """The axis along which `shapes` are laid out one after the other in `out_shape`, when every axis before it
    has extent 1 (so each part is one contiguous run of bytes); else None."""
    if any(len(s) != len(out_shape) for s in shapes):
        return None
    for axis in range(len(out_shape)):
        if all(s[axis] == out_shape[axis] for s in shapes) and out_shape[axis] == 1:
            continue  # a unit axis before the concatenation's
        rest = tuple(out_shape[:axis]) + tuple(out_shape[axis + 1:])
        same_elsewhere = all(tuple(s[:axis]) + tuple(s[axis + 1:]) == rest for s in shapes)
        return axis if same_elsewhere and sum(s[axis] for s in shapes) == out_shape[axis] else None
    return None


def in_place_concats(
    plan: StoragePlan, concats: Sequence[Concat], output_storages: set[int]
) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """Concatenations whose producers can write their parts straight into the result, and the parts' places.

    Taken where every input is an intermediate that lives alone in its storage (no model input, constant or
    output), appears once, and is no other concatenation's part already, and every part starts on an aligned
    byte. A result that is itself a part of a later concatenation nests (DenseNet's growing feature maps end up in
    one buffer, written once). Returns {storage: (buffer storage, byte offset)} and the steps of the dropped
    calls."""
    holders: dict[int, int] = {}
    for value in plan.values:
        holders[value.storage] = holders.get(value.storage, 0) + 1
    parent: dict[int, tuple[int, int]] = {}  # storage -> (enclosing storage, offset in it)
    dropped: set[int] = set()

    def free(storage: int) -> bool:  # an intermediate no output or other concatenation has claimed
        return (plan.storages[storage].kind == "intermediate" and storage not in output_storages
                and storage not in parent)

    for step, parts, result, _site in concats:
        out = plan.values[result]
        storages = [plan.values[p].storage for p in parts]
        if (concat_axis(out.shape, [plan.values[p].shape for p in parts]) is None
                or len(set(storages)) != len(storages) or not free(out.storage)
                or any(not free(s) or holders[s] != 1 for s in storages)
                or any(plan.values[p].dtype != out.dtype for p in parts)):
            continue
        offsets = list(itertools.accumulate((plan.values[p].nbytes for p in parts), initial=0))[:-1]
        if any(offset % DEFAULT_ALIGNMENT for offset in offsets):
            continue
        for storage, offset in zip(storages, offsets):
            parent[storage] = (out.storage, offset)
        dropped.add(step)
    return _roots(parent), dropped


def _roots(parent: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Nested placements resolved to the outermost buffer: {storage: (root storage, byte offset in it)}."""
    inside: dict[int, tuple[int, int]] = {}
    for storage in parent:
        root, offset = storage, 0
        while root in parent:
            root, step_offset = parent[root]
            offset += step_offset
        inside[storage] = (root, offset)
    return inside
