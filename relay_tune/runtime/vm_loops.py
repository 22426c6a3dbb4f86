"""Native loops for the virtual machine: a self-recursive VM function that is a plain loop runs as generated code.

The Relay way to loop is a global function that calls itself in tail position:

    def @loop(%i, %h, ...) { if (less(%i, N)) { @loop(add(%i, 1), cell(%h), ...) } else { %h } }

Run instruction by instruction, each iteration costs several ctypes calls and a dozen Python steps: far more than
the kernels of a small cell. `find_loop` recognises the shape

    A: kernels, packs, views    if c -> E    B: kernels, packs, views    tail self(args)    E: C: ...    ret r

and `NativeLoop` generates one LLVM function for it over a slot table (a data address per register), the way the
graph executor (`relay_tune.runtime.executor`) runs a static model: A, a test of the condition byte, B, the new
parameters, back to A; at the exit C. Every kernel output in A and B has two buffers that alternate between
iterations, so an output that becomes next iteration's parameter is never overwritten while that iteration still
reads it. That is safe when each new parameter is this iteration's kernel output, a constant, or the parameter
itself passed on unchanged (then it is never written); a function that passes one parameter's value on to
another parameter (a value that lives two iterations) or has any other instruction is left to the interpreter
loop. A pack of a parameter passed on unchanged runs once, before the loop.
"""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir

from relay_tune.codegen.jit import _jit_lock, _lljit
from relay_tune.errors import CompileError
from relay_tune.runtime.executor import _target_machine

LOOP_SYMBOL = "relay_tune_vm_loop"
_ids = itertools.count()

Step = tuple[str, str, tuple[int, ...]]  # ("call", kernel, argument slots) or ("copy", "", (dst, src))


@dataclass(frozen=True)
class LoopShape:
    """A VM function recognised as a loop (see the module docstring); registers are slots."""

    hoisted: tuple[int, ...]  # instruction positions of packs run once before the loop
    before: tuple[int, ...]  # A: instruction positions before the test
    cond: int  # the register holding the condition
    body: tuple[int, ...]  # B
    tail_args: tuple[int, ...]  # registers passed as the new parameters
    exit: tuple[int, ...]  # C
    result: int  # the register returned
    double: tuple[int, ...]  # registers kernels write in A or B (two buffers each)
    single: tuple[int, ...]  # registers the hoisted packs and C write (one buffer each)


_STRAIGHT = ("kernel", "pack", "view")


def find_loop(index: int, params: Sequence[int], code: Sequence[Any], constants: Sequence[int],
              single_output: Mapping[int, bool]) -> LoopShape | None:
    """The loop shape of function `index` (its parameter registers, instructions `code` of `Instr`s, constant
    registers; `single_output[k]`: kernel call k has one output), or None when it is not such a loop."""
    position = 0

    def straight(start: int) -> tuple[list[int], int]:
        found = []
        at = start
        while at < len(code) and code[at].op in _STRAIGHT:
            if code[at].op != "view" and not single_output[code[at].index]:
                return found, -1
            found.append(at)
            at += 1
        return found, at

    before, position = straight(0)
    if position < 0 or position >= len(code) or code[position].op != "if":
        return None
    test = code[position]
    body, position = straight(position + 1)
    if position < 0 or position >= len(code) or code[position].op != "tail" or code[position].index != index:
        return None
    tail = code[position]
    if test.index != position + 1:
        return None
    exit_steps, position = straight(position + 1)
    if position != len(code) - 1 or code[position].op != "ret":
        return None
    result = code[position].args[0]
    written = {code[i].dst for i in (*before, *body)}
    for param, arg in zip(params, tail.args):
        if arg != param and arg not in written and arg not in constants:
            return None  # a value that would live two iterations, or one this function does not own
    views = {code[i].dst for i in (*before, *body, *exit_steps) if code[i].op == "view"}
    if result in views or any(arg in views for arg in tail.args):
        return None  # the result and new parameters must be buffers of their own
    invariant = {p for p, a in zip(params, tail.args) if p == a} | set(constants)
    hoisted = tuple(i for i in (*before, *body)
                    if code[i].op == "pack" and code[i].args and code[i].args[0] in invariant)
    double = {code[i].dst for i in (*before, *body) if code[i].op != "view" and i not in hoisted}
    single = {code[i].dst for i in (*hoisted, *exit_steps) if code[i].op != "view"}
    return LoopShape(hoisted, tuple(i for i in before if i not in hoisted), test.args[0],
                     tuple(i for i in body if i not in hoisted), tuple(tail.args), tuple(exit_steps), result,
                     tuple(sorted(double)), tuple(sorted(single)))


def loop_ir(pre: Sequence[Step], before: Sequence[Step], cond: int, body: Sequence[Step],
            updates: Sequence[tuple[int, int]], swaps: Sequence[tuple[int, int]], after: Sequence[Step],
            arity: Mapping[str, int]) -> str:
    """LLVM IR of `void loop(i8** slots)`: `pre`; then while the byte at slots[cond] is non-zero: `before` (run
    before the test), `body`, parameter slots set from `updates` (param, arg: all read before any is written),
    slot pairs in `swaps` exchanged; then `before` once more up to the failing test, and `after`."""
    i8, i64 = ir.IntType(8), ir.IntType(64)
    i8p = i8.as_pointer()
    void = ir.VoidType()
    module = ir.Module(name="relay_tune_vm_loop")
    kernels = {name: ir.Function(module, ir.FunctionType(void, [i8p] * count), name=name)
               for name, count in arity.items()}
    function = ir.Function(module, ir.FunctionType(void, [i8p.as_pointer()]), name=LOOP_SYMBOL)
    slots = function.args[0]
    entry = function.append_basic_block("entry")
    head = function.append_basic_block("head")
    taken = function.append_basic_block("body")
    done = function.append_basic_block("exit")
    builder = ir.IRBuilder(entry)

    def slot(number: int) -> Any:
        return builder.gep(slots, [ir.Constant(i64, number)])

    def emit(steps: Sequence[Step]) -> None:
        for kind, name, args in steps:
            if kind == "call":
                builder.call(kernels[name], [builder.load(slot(s)) for s in args])
            else:
                builder.store(builder.load(slot(args[1])), slot(args[0]))

    emit(pre)
    builder.branch(head)
    builder.position_at_end(head)
    emit(before)
    flag = builder.load(builder.load(slot(cond)))
    builder.cbranch(builder.icmp_unsigned("!=", flag, ir.Constant(i8, 0)), taken, done)
    builder.position_at_end(taken)
    emit(body)
    values = [builder.load(slot(arg)) for _param, arg in updates]
    for (param, _arg), value in zip(updates, values):
        builder.store(value, slot(param))
    for first, second in swaps:
        a, b = builder.load(slot(first)), builder.load(slot(second))
        builder.store(b, slot(first))
        builder.store(a, slot(second))
    builder.branch(head)
    builder.position_at_end(done)
    emit(after)
    builder.ret_void()
    return str(module)


class NativeLoop:
    """A loop shape compiled and JIT-linked: `slots` holds one address per register of the function, then the
    second buffer of every double-buffered register (`alternate[reg]` is its slot); `run()` runs the whole loop
    in generated code."""

    def __init__(self, shape: LoopShape, code: Sequence[Any], params: Sequence[int], num_regs: int,
                 calls: Sequence[Any], addresses: Mapping[str, int]) -> None:
        self.shape = shape
        self.alternate = {reg: num_regs + k for k, reg in enumerate(shape.double)}
        self.slots = (ctypes.c_void_p * max(1, num_regs + len(shape.double)))()
        arity: dict[str, int] = {}

        def steps(positions: Sequence[int]) -> list[Step]:
            found: list[Step] = []
            for at in positions:
                ins = code[at]
                if ins.op == "view":
                    found.append(("copy", "", (ins.dst, ins.args[0])))
                    continue
                call = calls[ins.index]
                args = tuple(p if p >= 0 else ins.dst for p in call.params)
                arity[call.kernel] = len(args)
                found.append(("call", call.kernel, args))
            return found

        updates = [(p, a) for p, a in zip(params, shape.tail_args) if p != a]
        text = loop_ir(steps(shape.hoisted), steps(shape.before), shape.cond, steps(shape.body), updates,
                       list(self.alternate.items()), steps(shape.exit), arity)
        try:
            parsed = llvm.parse_assembly(text)
            parsed.verify()
        except RuntimeError as err:
            raise CompileError(f"LLVM rejected a generated VM loop: {err}") from err
        obj = bytes(_target_machine().emit_object(parsed))
        with _jit_lock:
            jit = _lljit()
            builder = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
            for name in arity:
                builder.import_symbol(name, addresses[name])
            builder.export_symbol(LOOP_SYMBOL)
            try:
                self._tracker = builder.link(jit, f"relay_tune_vm_loop_{os.getpid()}_{next(_ids)}")
            except RuntimeError as err:
                raise CompileError(f"cannot load a generated VM loop: {err}") from err
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._tracker[LOOP_SYMBOL])
        self._slots_address = ctypes.addressof(self.slots)

    def run(self) -> None:
        """Run the loop on the addresses in `slots`."""
        self._fn(self._slots_address)
