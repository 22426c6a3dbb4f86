"""Finishing the graph plan: unused values dropped, storages placed (inputs, constants, outputs, one arena for
intermediates, concatenation parts inside their result's buffer), values and calls renumbered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from relay_tune.compile.concat import in_place_concats
from relay_tune.compile.kernel_calls import CallRecorder
from relay_tune.compile.trees import flatten
from relay_tune.errors import CompileError
from relay_tune.runtime.memory_plan import BufferLifetime, plan_memory
from relay_tune.runtime.model import GraphPlan, InputInfo, OutputTree, Storage, TaskInfo

Placement = dict[int, tuple[int, int]]
"""{storage: (buffer storage, byte offset)} of concatenation parts written in place."""


def finish_plan(
    recorder: CallRecorder, inputs: list[InputInfo], outputs: OutputTree, task_infos: tuple[TaskInfo, ...]
) -> tuple[GraphPlan, list[np.ndarray]]:
    """The plan and its constants. Values nothing reads (e.g. a weight that is only read packed) and their
    storages are dropped; intermediates returned by the model become outputs, the rest go into the arena."""
    used = {i.value for i in inputs} | {v for c in recorder.calls for v in c.args} | set(flatten(outputs))
    value_ids = sorted(used)
    new_value = {old: new for new, old in enumerate(value_ids)}
    storage_ids = sorted({recorder.values[v].storage for v in value_ids})
    new_storage = {old: new for new, old in enumerate(storage_ids)}
    output_storages = {recorder.values[v].storage for v in flatten(outputs)}

    inside, dropped = (in_place_concats(recorder, recorder.concats, output_storages) if recorder.concat_in_place
                       else ({}, set()))
    calls = [c for step, c in enumerate(recorder.calls) if step not in dropped]
    if any(not c.kernel for c in calls):
        raise CompileError("a concatenation planned to be written in place still needs its kernel")
    storages, constants, lifetimes = _place_storages(recorder, storage_ids, output_storages, inside)
    values = [replace(recorder.values[v], storage=new_storage[recorder.values[v].storage]) for v in value_ids]

    def renumber(tree: OutputTree) -> OutputTree:
        return tuple(renumber(t) for t in tree) if isinstance(tree, tuple) else new_value[tree]

    plan = GraphPlan(
        inputs=tuple(InputInfo(i.name, new_value[i.value]) for i in inputs),
        values=tuple(values),
        storages=tuple(storages),
        calls=tuple(replace(c, args=tuple(new_value[a] for a in c.args)) for c in calls),
        outputs=renumber(outputs),
        tasks=task_infos,
        memory=plan_memory(lifetimes),
    )
    return plan, constants


def _place_storages(
    recorder: CallRecorder, storage_ids: Sequence[int], output_storages: set[int], inside: Placement
) -> tuple[list[Storage], list[np.ndarray], list[BufferLifetime]]:
    """Every kept storage placed (in `storage_ids` order), the constants, and the arena buffers' lifetimes."""
    spans = _buffer_spans(recorder, storage_ids, output_storages, inside)
    lifetimes: list[BufferLifetime] = []
    buffer_of: dict[int, int] = {}  # old storage -> arena buffer number
    storages: list[Storage] = []
    constants: list[np.ndarray] = []
    num_outputs = 0
    for old in storage_ids:
        draft = recorder.storages[old]
        if draft.kind == "constant":
            storages.append(Storage("constant", len(constants), draft.nbytes))
            constants.append(recorder.constants[draft.index])
        elif draft.kind == "input":
            storages.append(Storage("input", draft.index, draft.nbytes))
        elif old in output_storages:
            storages.append(Storage("output", num_outputs, draft.nbytes))
            num_outputs += 1
        else:
            root, offset = inside.get(old, (old, 0))
            if root not in buffer_of:
                first, last = spans[root]
                first = max(first, 0)
                lifetimes.append(BufferLifetime(recorder.storages[root].nbytes, first, max(last, first)))
                buffer_of[root] = len(lifetimes) - 1
            storages.append(Storage("arena", buffer_of[root], draft.nbytes, offset))
    return storages, constants, lifetimes


def _buffer_spans(
    recorder: CallRecorder, storage_ids: Sequence[int], output_storages: set[int], inside: Placement
) -> dict[int, tuple[int, int]]:
    """The (first, last) step of every arena buffer. A buffer that holds other storages lives from the first write
    into any of them to the last read."""
    spans: dict[int, tuple[int, int]] = {}
    for old in storage_ids:
        draft = recorder.storages[old]
        if draft.kind != "intermediate" or old in output_storages:
            continue
        root = inside[old][0] if old in inside else old
        written = max(draft.first, 0)
        first, last = spans.get(root, (written, draft.last))
        spans[root] = (min(first, written), max(last, draft.last))
    return spans
