"""The graph planner: walks the fused entry function in evaluation order and turns it into a `GraphPlan` (model
inputs, constants, intermediates and outputs as values over storages, and the kernel calls between them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relay_tune.compile.concat import in_place_concats
from relay_tune.compile.kernel_calls import CallRecorder
from relay_tune.compile.plan_finish import finish_plan
from relay_tune.compile.trees import flatten, nbytes
from relay_tune.errors import CompileError, UnsupportedError
from relay_tune.ir import Call, Constant, Expr, Function, GlobalVar, If, Let, Op, TensorType, Tuple, TupleGetItem, Var
from relay_tune.runtime.model import GraphPlan, InputInfo, OutputTree, TaskInfo


@dataclass(kw_only=True)
class Planner(CallRecorder):
    """Walks the fused entry function in evaluation order and records values, storages and kernel calls."""

    def run(self, main: Function) -> tuple[list[InputInfo], OutputTree]:
        """Walk `main`: its inputs, and the value tree of its result."""
        inputs: list[InputInfo] = []
        env: dict[int, OutputTree] = {}  # id(expr) or id(var) -> value tree
        for position, param in enumerate(main.params):
            ty = param.checked_type
            if not isinstance(ty, TensorType) or not ty.is_static:
                raise UnsupportedError(
                    f"input %{param.name_hint} has type {ty}; compiled models take tensors of static shape"
                )
            shape = ty.static_shape
            storage = self.new_storage("input", position, nbytes(shape, ty.dtype))
            value = self.new_value(shape, ty.dtype, storage)
            env[id(param)] = value
            inputs.append(InputInfo(param.name_hint, value))
        self._walk(main.body, env)
        return inputs, env[id(main.body)]

    def in_place_sites(self, outputs: OutputTree) -> set[int]:
        """The call sites (ids) of the concatenations `finish` will have written in place."""
        output_storages = {self.values[v].storage for v in flatten(outputs)}
        _inside, dropped = in_place_concats(self, self.concats, output_storages)
        return {site for step, _parts, _result, site in self.concats if step in dropped}

    def finish(
        self, inputs: list[InputInfo], outputs: OutputTree, task_infos: tuple[TaskInfo, ...]
    ) -> tuple[GraphPlan, list[np.ndarray]]:
        """The plan and its constants (`plan_finish.finish_plan`)."""
        return finish_plan(self, inputs, outputs, task_infos)

    def _walk(self, root: Expr, env: dict[int, OutputTree]) -> None:
        """Evaluate every node under `root` after its operands (iteratively: models can be deep)."""
        stack: list[tuple[Expr, int]] = [(root, 0)]
        done: set[int] = set(env)
        while stack:
            node, phase = stack.pop()
            if phase == 0:
                if id(node) not in done:
                    stack += _operands_first(node)
                continue
            if phase == 1:  # a let's value is ready: bind its variable
                assert isinstance(node, Let)
                env[id(node.var)] = env[id(node.value)]
                done.add(id(node.var))
                continue
            if id(node) in done:
                continue
            env[id(node)] = self._value_of(node, env)
            done.add(id(node))

    def _value_of(self, node: Expr, env: dict[int, OutputTree]) -> OutputTree:
        if isinstance(node, Var):
            if id(node) not in env:
                raise UnsupportedError(f"variable %{node.name_hint} is not bound to a value here")
            return env[id(node)]
        if isinstance(node, Constant):
            return self.constant(node.data, (id(node), ""))
        if isinstance(node, Tuple):
            return tuple(env[id(f)] for f in node.fields)
        if isinstance(node, TupleGetItem):
            tup = env[id(node.tuple_value)]
            if not isinstance(tup, tuple):
                raise CompileError("projection of a value that is not a tuple")
            return tup[node.index]
        if isinstance(node, Let):
            return env[id(node.body)]
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            return self.kernel_call(node, [env[id(a)] for a in node.args])
        raise _not_compilable(node)


def _operands_first(node: Expr) -> list[tuple[Expr, int]]:
    """Stack entries that evaluate `node`'s operands, then `node` (phase 2); a let binds its variable (phase 1)
    between its value and its body. Pushed in reverse: the last entry runs first."""
    if isinstance(node, Let):
        return [(node, 2), (node.body, 0), (node, 1), (node.value, 0)]
    if isinstance(node, Call) and isinstance(node.op, Function):
        return [(node, 2), *((a, 0) for a in reversed(node.args))]
    if isinstance(node, Tuple):
        return [(node, 2), *((f, 0) for f in reversed(node.fields))]
    if isinstance(node, TupleGetItem):
        return [(node, 2), (node.tuple_value, 0)]
    return [(node, 2)]


def _not_compilable(node: Expr) -> Exception:
    """The error for a node a compiled model cannot evaluate."""
    if isinstance(node, If):
        return UnsupportedError("compiled models cannot branch (`if`); run such programs with the interpreter")
    if isinstance(node, Call) and isinstance(node.op, GlobalVar):
        return UnsupportedError(
            f"compiled models cannot call other global functions (@{node.op.name}); run such programs with the "
            "interpreter"
        )
    if isinstance(node, Call) and isinstance(node.op, Op):
        return CompileError(f"operator call {node.op.name} outside any fused function (run the fusion passes)")
    return UnsupportedError(f"compiled models cannot evaluate a {type(node).__name__} here")
