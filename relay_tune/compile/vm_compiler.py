"""The virtual-machine compiler: a fused module with control flow as a `VMProgram` over compiled kernels.

A fused module (`relay_tune.passes.optimize`) whose entry function branches (`if`), calls other global functions
(recursion: the Relay way to loop), makes closures or uses algebraic data types cannot be a static graph plan.
Here every global function and every function literal that is not primitive becomes a `VMFunction` of
instructions; every call of a `Primitive=1` function becomes a `kernel` instruction that calls that task's
compiled kernel, exactly the kernel a static build compiles (same tasks, same tuning records). See
`relay_tune.runtime.vm` for the instructions.

Code generation walks each function body once, recursively: an expression's value lands in a register (a value
shared by several users is computed once per scope), `if` compiles to a conditional jump around its two branches
(which write one result register), `match` to tag tests per clause that jump to the next clause, and in tail
position a call replaces the frame (`tail`), so a recursive loop runs in constant stack.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from relay_tune.compile.parallel import compile_and_load
from relay_tune.compile.tasks import LoweredTask, ParamBinding, packing_kernel, slug
from relay_tune.compile.trees import constant_leaf, flatten_types
from relay_tune.errors import CompileError, UnsupportedError
from relay_tune.ir import (
    Call,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    IRModule,
    Let,
    Match,
    Op,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
    free_vars,
)
from relay_tune.kernel import tir
from relay_tune.passes.base import dataflow_post_order
from relay_tune.passes.extract_tasks import workload_key
from relay_tune.runtime.model import TaskInfo, host_triple
from relay_tune.runtime.vm import Instr, KernelCall, VMFunction, VMModel, VMProgram
from relay_tune.target import Target

RECURSION_LIMIT = 20_000
"""Python recursion allowed while compiling one function body (nesting depth of its expressions)."""


def needs_vm(fused: IRModule) -> bool:
    """Whether fused module `fused`'s entry function has control flow a static graph plan cannot hold: `if`, a
    use of another global function, or a function value (closure)."""
    for node in dataflow_post_order(fused["main"].body):
        if isinstance(node, If | GlobalVar | Match | Constructor):
            return True
        if isinstance(node, Function) and not node.is_primitive:
            return True
    return False


@dataclass
class _FunctionCode:
    """A function being generated: its instructions, register count and constant registers."""

    name: str
    code: list[Instr] = field(default_factory=list)
    num_regs: int = 0
    constants: list[tuple[int, int]] = field(default_factory=list)

    def reg(self) -> int:
        self.num_regs += 1
        return self.num_regs - 1

    def emit(self, instr: Instr) -> int:
        self.code.append(instr)
        return len(self.code) - 1


Scope = dict[int, int]  # id(var or expression) -> register


@dataclass
class VMCompiler:
    """Turns a fused module into a `VMProgram` over the kernels of `tasks` (lowered tasks by workload key)."""

    module: IRModule
    tasks: Mapping[str, LoweredTask]
    task_index: Mapping[str, int]
    call_keys: Mapping[int, str]
    target: Target
    functions: list[VMFunction | None] = field(default_factory=list)
    kernels: list[KernelCall] = field(default_factory=list)
    constants: list[np.ndarray] = field(default_factory=list)
    packers: dict[str, tir.PrimFunc] = field(default_factory=dict)
    _globals: dict[str, int] = field(default_factory=dict)
    _constant_ids: dict[tuple[int, str], int] = field(default_factory=dict)
    _keep: list[Any] = field(default_factory=list)  # keeps the objects behind `_constant_ids` alive

    def compile(self) -> VMProgram:
        """The program: every global function (entry first), then the closures lifted out of them."""
        main = self.module["main"]
        inputs = []
        for param in main.params:
            ty = param.checked_type if param.has_type() else param.type_annotation
            if not isinstance(ty, TensorType) or not ty.is_static:
                raise UnsupportedError(f"input %{param.name_hint} has type {ty}; compiled models take tensors of "
                                       "static shape")
            inputs.append((param.name_hint, ty.static_shape, ty.dtype))
        names = ["main", *(n for n, f in self.module.items() if n != "main" and not f.is_primitive)]
        for name in names:
            self._globals[name] = len(self.functions)
            self.functions.append(None)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
        try:
            for name in names:
                func = self.module[name]
                self.functions[self._globals[name]] = self._function(f"@{name}", func, [], None)
        except RecursionError:
            raise UnsupportedError("the program nests expressions too deeply for the virtual-machine compiler"
                                   ) from None
        finally:
            sys.setrecursionlimit(limit)
        functions = tuple(f for f in self.functions if f is not None)
        assert len(functions) == len(self.functions)
        return VMProgram(functions, self._globals["main"], tuple(self.kernels), tuple(inputs), ())

    # -- functions ------------------------------------------------------------------------------------------------
    def _function(self, name: str, func: Function, captured: list[Var], self_var: Var | None) -> VMFunction:
        """Code for `func`; its parameter registers are `captured`'s values, then its own parameters."""
        out = _FunctionCode(name)
        scope: Scope = {}
        params = []
        for var in [*captured, *func.params]:
            scope[id(var)] = out.reg()
            params.append(scope[id(var)])
        self._tail(func.body, out, scope)
        del self_var  # a recursive closure finds itself among its captured values
        return VMFunction(name, tuple(params), out.num_regs, tuple(out.code), tuple(out.constants))

    def _closure(self, func: Function, out: _FunctionCode, scope: Scope, self_var: Var | None) -> int:
        """A `closure` instruction for function literal `func` over its free variables; its register."""
        captured = [v for v in free_vars(func) if not isinstance(v, GlobalVar)]
        index = len(self.functions)
        self.functions.append(None)
        self.functions[index] = self._function(f"closure{index}", func, captured, self_var)
        dst = out.reg()
        args: list[int] = []
        self_slot = -1
        for position, var in enumerate(captured):
            if self_var is not None and var is self_var:
                self_slot = position
                args.append(dst)  # replaced by the closure itself when it is made
            elif id(var) in scope:
                args.append(scope[id(var)])
            else:
                raise CompileError(f"variable %{var.name_hint} is not bound where its closure is made")
        out.emit(Instr("closure", dst, tuple(args), index, self_slot=self_slot))
        return dst

    # -- expressions ----------------------------------------------------------------------------------------------
    def _tail(self, expr: Expr, out: _FunctionCode, scope: Scope) -> None:
        """Code that returns `expr`'s value from the function (calls in tail position replace the frame)."""
        while isinstance(expr, Let):
            self._bind(expr, out, scope)
            expr = expr.body
        if isinstance(expr, If):
            cond = self._value(expr.cond, out, scope)
            branch = out.emit(Instr("if", -1, (cond,), -1))
            self._tail(expr.true_branch, out, dict(scope))
            out.code[branch] = Instr("if", -1, (cond,), len(out.code))
            self._tail(expr.false_branch, out, dict(scope))
            return
        if isinstance(expr, Match):
            self._match(expr, out, scope, tail=True)
            return
        if isinstance(expr, Call) and isinstance(expr.op, GlobalVar):
            args = tuple(self._value(a, out, scope) for a in expr.args)
            out.emit(Instr("tail", -1, args, self._global(expr.op)))
            return
        if isinstance(expr, Call) and not isinstance(expr.op, Op | Constructor) and not _is_primitive(expr.op):
            closure = self._value(expr.op, out, scope)
            args = tuple(self._value(a, out, scope) for a in expr.args)
            out.emit(Instr("tail_closure", -1, (closure, *args)))
            return
        out.emit(Instr("ret", -1, (self._value(expr, out, scope),)))

    def _bind(self, let: Let, out: _FunctionCode, scope: Scope) -> None:
        if isinstance(let.value, Function) and not let.value.is_primitive:
            scope[id(let.var)] = self._closure(let.value, out, scope, let.var)
        else:
            scope[id(let.var)] = self._value(let.value, out, scope)

    def _value(self, expr: Expr, out: _FunctionCode, scope: Scope) -> int:
        """The register holding `expr`'s value, computing it unless this scope already has."""
        found = scope.get(id(expr))
        if found is not None:
            return found
        register = self._compute(expr, out, scope)
        if not isinstance(expr, Var):
            scope[id(expr)] = register
        return register

    def _compute(self, expr: Expr, out: _FunctionCode, scope: Scope) -> int:
        if isinstance(expr, Var):
            raise CompileError(f"variable %{expr.name_hint} is not bound here")
        if isinstance(expr, Constant):
            return self._constant_register(expr.data, (id(expr), ""), expr, out)
        if isinstance(expr, Tuple):
            args = tuple(self._value(f, out, scope) for f in expr.fields)
            dst = out.reg()
            out.emit(Instr("tuple", dst, args))
            return dst
        if isinstance(expr, TupleGetItem):
            source = self._value(expr.tuple_value, out, scope)
            dst = out.reg()
            out.emit(Instr("field", dst, (source,), expr.index))
            return dst
        if isinstance(expr, Let):
            inner = dict(scope)
            while isinstance(expr, Let):
                self._bind(expr, out, inner)
                expr = expr.body
            return self._value(expr, out, inner)
        if isinstance(expr, If):
            cond = self._value(expr.cond, out, scope)
            dst = out.reg()
            branch = out.emit(Instr("if", -1, (cond,), -1))
            then_value = self._value(expr.true_branch, out, dict(scope))
            out.emit(Instr("move", dst, (then_value,)))
            jump = out.emit(Instr("jump", -1, (), -1))
            out.code[branch] = Instr("if", -1, (cond,), len(out.code))
            else_value = self._value(expr.false_branch, out, dict(scope))
            out.emit(Instr("move", dst, (else_value,)))
            out.code[jump] = Instr("jump", -1, (), len(out.code))
            return dst
        if isinstance(expr, Match):
            return self._match(expr, out, scope, tail=False)
        if isinstance(expr, Constructor):
            raise UnsupportedError(f"constructor {expr.name} used as a function value (call it instead)")
        if isinstance(expr, GlobalVar):  # a global function as a value: a closure over nothing
            dst = out.reg()
            out.emit(Instr("closure", dst, (), self._global(expr)))
            return dst
        if isinstance(expr, Function):
            if expr.is_primitive:
                raise CompileError("a primitive function used as a value (it can only be called)")
            return self._closure(expr, out, scope, None)
        if isinstance(expr, Call):
            return self._call(expr, out, scope)
        raise UnsupportedError(f"compiled programs cannot evaluate a {type(expr).__name__}")

    def _call(self, call: Call, out: _FunctionCode, scope: Scope) -> int:
        if isinstance(call.op, Op):
            raise CompileError(f"operator call {call.op.name} outside any fused function (run the fusion passes)")
        if isinstance(call.op, Function) and call.op.is_primitive:
            return self._kernel(call, out, scope)
        args = tuple(self._value(a, out, scope) for a in call.args)
        dst = out.reg()
        if isinstance(call.op, Constructor):
            out.emit(Instr("construct", dst, args, tag=call.op.tag))
            return dst
        if isinstance(call.op, GlobalVar):
            out.emit(Instr("invoke", dst, args, self._global(call.op)))
        else:
            closure = self._value(call.op, out, scope)
            out.emit(Instr("call_closure", dst, (closure, *args)))
        return dst

    def _match(self, node: Match, out: _FunctionCode, scope: Scope, tail: bool) -> int:
        """Code for `match`: per clause, tests that jump to the next clause when its pattern does not apply, the
        pattern's variables bound to registers, its body (returned in tail position, else moved to the result
        register); `fail` when no clause applies. The result register (-1 in tail position)."""
        data = self._value(node.data, out, scope)
        dst = -1 if tail else out.reg()
        to_end: list[int] = []
        for pattern, body in node.clauses:
            inner = dict(scope)
            to_next: list[int] = []
            self._pattern(pattern, data, out, inner, to_next)
            if tail:
                self._tail(body, out, inner)
            else:
                out.emit(Instr("move", dst, (self._value(body, out, inner),)))
                to_end.append(out.emit(Instr("jump", -1, (), -1)))
            for position in to_next:
                out.code[position] = replace(out.code[position], index=len(out.code))
        out.emit(Instr("fail"))
        for position in to_end:
            out.code[position] = Instr("jump", -1, (), len(out.code))
        return dst

    def _pattern(self, pattern: Pattern, register: int, out: _FunctionCode, scope: Scope, to_next: list[int]) -> None:
        """Tests of `pattern` against the value in `register` (their jump positions appended to `to_next`, to be
        pointed at the next clause) and its variables bound in `scope`."""
        if isinstance(pattern, PatternVar):
            scope[id(pattern.var)] = register
            return
        if isinstance(pattern, PatternConstructor):
            to_next.append(out.emit(Instr("if_tag", -1, (register,), -1, tag=pattern.constructor.tag)))
        if isinstance(pattern, PatternConstructor | PatternTuple):
            for position, sub in enumerate(pattern.patterns):
                if isinstance(sub, PatternWildcard):
                    continue
                item = out.reg()
                out.emit(Instr("field", item, (register,), position))
                self._pattern(sub, item, out, scope, to_next)

    def _global(self, var: GlobalVar) -> int:
        index = self._globals.get(var.name)
        if index is None:
            raise CompileError(f"call of @{var.name}, which the module does not define")
        return index

    # -- kernels --------------------------------------------------------------------------------------------------
    def _kernel(self, call: Call, out: _FunctionCode, scope: Scope) -> int:
        """A `kernel` instruction for a call of a fused function (or a `view` for a memory-view task)."""
        func = call.op
        assert isinstance(func, Function)
        key = self.call_keys.get(id(call)) or workload_key(func)
        task = self.tasks.get(key)
        if task is None:
            raise CompileError(f"no kernel was compiled for fused function {key[:12]}")
        leaves: list[int] = []
        for arg in call.args:
            leaves += self._leaves(self._value(arg, out, scope), _type_of(arg), out)
        out_type = func.body.checked_type if func.body.has_type() else func.ret_type
        if isinstance(out_type, TupleType) and any(isinstance(f, TupleType) for f in out_type.fields):
            raise UnsupportedError("a fused function with a nested tuple result")
        out_types = flatten_types(out_type)
        dst = out.reg()
        if task.alias:
            out.emit(Instr("view", dst, (leaves[0],), shape=out_types[0].static_shape))
            return dst
        if not task.kernel_name:
            raise CompileError(f"task {key[:12]} has no kernel")
        params: list[int] = []
        for binding in task.bindings:
            if binding.kind == "output":
                params.append(-1 - binding.index)
            elif binding.kind == "input":
                params.append(leaves[binding.index])
            else:
                params.append(self._packed(call, leaves, binding, out))
        outputs = tuple((t.static_shape, t.dtype) for t in out_types)
        index = len(self.kernels)
        self.kernels.append(KernelCall(task.kernel_name, self.task_index[key], tuple(params), outputs,
                                       isinstance(out_type, TupleType)))
        out.emit(Instr("kernel", dst, (), index))
        return dst

    def _leaves(self, register: int, ty: Type | None, out: _FunctionCode) -> list[int]:
        """The registers of the tensors in a value of type `ty` (tuples projected field by field)."""
        if not isinstance(ty, TupleType):
            return [register]
        leaves: list[int] = []
        for position, field_type in enumerate(ty.fields):
            item = out.reg()
            out.emit(Instr("field", item, (register,), position))
            leaves += self._leaves(item, field_type, out)
        return leaves

    def _packed(self, call: Call, leaves: list[int], binding: ParamBinding, out: _FunctionCode) -> int:
        """The packed form of input `binding.index`: a constant packed now, else packed by a kernel each call."""
        layout = binding.pack
        layout_key = f"{layout.src_layout}->{layout.dst_layout}:{layout.dtype}:{list(layout.src_shape)}"
        constant = constant_leaf(call.args, binding.index)
        if constant is not None:
            return self._constant_register(np.asarray(layout.pack(constant.data)), (id(constant), layout_key),
                                           constant, out)
        name = next((n for n, f in self.packers.items() if dict(f.attrs).get("packing") == layout_key), None)
        if name is None:
            name = f"pack_{len(self.packers)}_{slug(layout.src_layout + '_' + layout.dst_layout)}"
            primfunc = packing_kernel(layout, name, self.target)
            self.packers[name] = replace(primfunc, attrs=(*primfunc.attrs, ("packing", layout_key)))
        dst = out.reg()
        index = len(self.kernels)
        self.kernels.append(KernelCall(name, -1, (leaves[binding.index], -1),
                                       ((tuple(layout.packed_shape), str(layout.dtype)),)))
        out.emit(Instr("pack", dst, (), index))
        return dst

    def _constant_register(self, data: np.ndarray, key: tuple[int, str], keep: Any, out: _FunctionCode) -> int:
        """A register of `out` that holds constant `data` in every frame (one copy per program)."""
        number = self._constant_ids.get(key)
        if number is None:
            number = len(self.constants)
            self.constants.append(np.ascontiguousarray(data))
            self._constant_ids[key] = number
            self._keep.append(keep)
        register = out.reg()
        out.constants.append((register, number))
        return register


def _is_primitive(expr: Expr) -> bool:
    return isinstance(expr, Function) and expr.is_primitive


def _type_of(expr: Expr) -> Type | None:
    return expr.checked_type if expr.has_type() else None


def compile_vm_model(
    fused: IRModule,
    lowered: Mapping[str, LoweredTask],
    call_keys: Mapping[int, str],
    target: Target,
    *,
    jobs: int | None,
    threading_runtime: str,
    kernel_cache: bool,
    timings: dict[str, float],
    start: float,
    opt_level: int,
) -> VMModel:
    """The `VMModel` of fused module `fused` (which `needs_vm`), its tasks lowered in `lowered`."""
    if target.kind == "cuda":
        raise UnsupportedError("programs with control flow (if, recursion, closures) compile for CPU targets only")
    task_list = [t for t in lowered.values() if t.kernel_name or t.alias]
    task_index = {t.key: i for i, t in enumerate(task_list)}
    compiler = VMCompiler(fused, lowered, task_index, call_keys, target)
    program = compiler.compile()
    sites = [k.task for k in program.kernels]
    tasks = tuple(TaskInfo(t.key, t.description, "" if t.alias else t.kernel_name, t.tuned,
                           max(sites.count(i), t.occurrences if t.alias else 0), t.flops)
                  for i, t in enumerate(task_list))
    program = VMProgram(program.functions, program.entry, program.kernels, program.inputs, tasks)
    timings["plan_s"] = time.perf_counter() - start - sum(timings.values())

    called = {k.kernel for k in program.kernels}
    funcs = [t.primfunc for t in task_list if not t.alias and t.kernel_name in called]
    funcs += [f for f in compiler.packers.values() if f.name in called]
    objects, libraries = compile_and_load(funcs, target, jobs, kernel_cache, threading_runtime, timings, start)
    info: dict[str, Any] = {
        "triple": host_triple(),
        "opt_level": opt_level,
        "timings": timings,
        "kernels": len(funcs),
        "tuned_tasks": sum(t.tuned for t in task_list),
        "default_tasks": sum(not t.tuned and not t.alias for t in task_list),
        "alias_tasks": sum(t.alias for t in task_list),
        "lower_seconds": {t.key: t.lower_seconds for t in task_list},
        "executor": "vm",
    }
    return VMModel(program, objects, compiler.constants, target, info, threading_runtime, libraries=libraries)
