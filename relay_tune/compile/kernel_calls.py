"""Kernel calls of the graph plan: each fused-function call becomes a kernel call over values, with its inputs
packed where its schedule reads them packed (constants once at build time, run-time inputs by a packing kernel)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from relay_tune.compile.concat import Concat, bare_concatenation
from relay_tune.compile.storage import StoragePlan
from relay_tune.compile.tasks import LoweredTask, ParamBinding, packing_kernel, slug
from relay_tune.compile.trees import constant_leaf, flatten, flatten_types, structure
from relay_tune.errors import CompileError
from relay_tune.ir import Call, Expr, Function, TensorType
from relay_tune.kernel import tir
from relay_tune.passes.extract_tasks import workload_key
from relay_tune.runtime.model import PACKING_TASK, KernelCall, OutputTree
from relay_tune.target import Target


@dataclass(kw_only=True)
class CallRecorder(StoragePlan):
    """Records kernel calls (and run-time packing calls) over the values of a `StoragePlan`."""

    tasks: Mapping[str, LoweredTask]
    calls: list[KernelCall] = field(default_factory=list)
    packers: dict[str, tir.PrimFunc] = field(default_factory=dict)  # run-time packing kernels by name
    packed_at_run: dict[tuple[int, str], int] = field(default_factory=dict)
    task_index: dict[str, int] = field(default_factory=dict)
    call_keys: dict[int, str] = field(default_factory=dict)  # id(call site) -> workload key, from task extraction
    target: Target | None = None  # what the run-time packing kernels are scheduled for
    concats: list[Concat] = field(default_factory=list)

    @property
    def concat_in_place(self) -> bool:
        """Whether producers write a concatenation's parts into its buffer (`concat.in_place_concats`): on CPU
        targets; a GPU model's buffers are device allocations, not offsets in one arena."""
        return self.target is None or self.target.kind != "cuda"

    def kernel_call(self, call: Call, args_values: Sequence[OutputTree]) -> OutputTree:
        """Record the call of fused function `call.op` on argument value trees `args_values`; its output tree."""
        func = call.op
        assert isinstance(func, Function)
        key = self.call_keys.get(id(call)) or workload_key(func)
        task = self.tasks.get(key)
        if task is None:
            raise CompileError(f"no kernel was compiled for fused function {key[:12]}")
        leaves = [leaf for tree in args_values for leaf in flatten(tree)]
        out_type = func.body.checked_type if func.body.has_type() else func.ret_type
        if task.alias:
            source = self.values[leaves[0]]
            assert isinstance(out_type, TensorType)
            shape = out_type.static_shape
            return self.new_value(shape, source.dtype, source.storage)
        outputs = [self.intermediate(t.static_shape, t.dtype) for t in flatten_types(out_type)]
        args = [outputs[b.index] if b.kind == "output" else leaves[b.index] if b.kind == "input"
                else self._packed(call.args, leaves, b) for b in task.bindings]
        step = len(self.calls)
        for binding, value in zip(task.bindings, args):
            if binding.kind == "output":
                self.wrote(value, step)
            else:
                self.read(value, step)
        # A concatenation written in place at every site has no kernel (`placeholder_task`); `finish` drops it.
        index = self.task_index[key] if task.kernel_name else PACKING_TASK
        self.calls.append(KernelCall(task.kernel_name, index, tuple(args)))
        order = bare_concatenation(func)
        if order is not None and len(leaves) == len(func.params) and len(outputs) == 1:
            self.concats.append((step, [leaves[i] for i in order], outputs[0], id(call)))
        return structure(out_type, outputs)

    def _packed(self, call_args: Sequence[Expr], leaves: list[int], binding: ParamBinding) -> int:
        """The packed form of input `binding.index`: packed once now for a constant, else by a kernel each run."""
        lt = binding.pack
        layout_key = f"{lt.src_layout}->{lt.dst_layout}:{lt.dtype}:{list(lt.src_shape)}"
        source = leaves[binding.index]
        constant = constant_leaf(call_args, binding.index)
        if constant is not None:
            self.keep.append(constant)
            found = self.constant_ids.get((id(constant), layout_key))
            if found is not None:
                return found
            return self.constant(np.asarray(lt.pack(constant.data)), (id(constant), layout_key))
        found_run = self.packed_at_run.get((source, layout_key))
        if found_run is not None:
            return found_run
        packer = self._packer(lt, layout_key)
        value = self.intermediate(lt.packed_shape, lt.dtype)
        step = len(self.calls)
        self.read(source, step)
        self.wrote(value, step)
        self.calls.append(KernelCall(packer.name, PACKING_TASK, (source, value)))
        self.packed_at_run[(source, layout_key)] = value
        return value

    def _packer(self, lt: object, layout_key: str) -> tir.PrimFunc:
        """The run-time packing kernel for `layout_key`, made once per layout."""
        for existing in self.packers.values():
            if dict(existing.attrs).get("packing") == layout_key:
                return existing
        name = f"pack_{len(self.packers)}_{slug(lt.src_layout + '_' + lt.dst_layout)}"  # type: ignore[attr-defined]
        primfunc = packing_kernel(lt, name, self.target)
        primfunc = replace(primfunc, attrs=(*primfunc.attrs, ("packing", layout_key)))
        self.packers[name] = primfunc
        return primfunc
