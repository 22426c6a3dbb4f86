"""Printer from `relay_tune.ir` to the Relay text format, in TVM's A-normal-form style.

Layout rules (they match what TVM prints, so dumps look familiar and re-parse to the same program):
- Inside a scope (function body, `if` branch, parenthesised `let`), only the final expression and
  `let` values are written in place. Every other non-atomic node (calls, tuples, projections,
  function literals, `if`s) is hoisted into a graph binding `%k = ...;` the first time it is needed
  and referred to as `%k` afterwards; a node reached twice or more is always hoisted, so sharing
  in the DAG is visible in (and restored from) the text.
- One counter numbers `%k` for the whole printed object and inner bodies are printed first.
  Graph variables are a single flat table in the parser, so a binding made inside a nested body
  may be referred to later from outside it.
- Variables, globals, operators and constants are atoms and always written in place. Scalar
  constants of bool/int8/16/32/64/float16/32/64 print as literals; other constants print as
  `meta[relay.Constant][i]` and are appended to `constants_out`.
- Variable names are made unique over the whole printed object (`%x`, `%x1`, `%x2`, ...).

Every walk runs on `trampoline.drive`, so deeply nested expressions print without recursion.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from relay_tune.errors import UnknownOperatorError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.expr import (
    Call,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    Tuple,
    TupleGetItem,
    TypeDef,
    Var,
)
from relay_tune.ir.module import IRModule
from relay_tune.ir.traversal import free_vars, post_order
from relay_tune.ir.types import AnyDim, DataType, FuncType, IncompleteType, TensorType, TupleType, Type, TypeVar
from relay_tune.op.registry import get_op
from relay_tune.text.trampoline import Steps, drive

VERSION_HEADER = '#[version = "0.0.5"]'
INDENT = "  "

_INT_SUFFIX = {"int8": "i8", "int16": "i16", "int32": "", "int64": "i64"}
_FLOAT_SUFFIX = {"float16": "f16", "float32": "f", "float64": "f64"}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------- types and literals
def format_type(ty: Type) -> str:
    """A type in the text format: `Tensor[(1, ?), float32]`, `float32`, `(A, B)`, `fn (A) -> B`."""
    if isinstance(ty, TensorType):
        if not ty.shape:
            return ty.dtype
        dims = ", ".join("?" if isinstance(d, AnyDim) else str(int(d)) for d in ty.shape)
        return f"Tensor[({dims}), {ty.dtype}]"
    if isinstance(ty, TupleType):
        if len(ty.fields) == 1:
            return f"({format_type(ty.fields[0])},)"
        return "(" + ", ".join(format_type(f) for f in ty.fields) + ")"
    if isinstance(ty, FuncType):
        params = "[" + ", ".join(tv.name for tv in ty.type_params) + "]" if ty.type_params else ""
        args = ", ".join(format_type(a) for a in ty.arg_types)
        return f"fn {params}({args}) -> {format_type(ty.ret_type)}"
    if isinstance(ty, TypeVar):
        return ty.name
    if isinstance(ty, IncompleteType):
        return "_"
    if isinstance(ty, DataType):
        return f"{ty.name}[{', '.join(format_type(a) for a in ty.args)}]" if ty.args else ty.name
    raise UnsupportedError(f"cannot print type {ty!r}")


def format_type_def(type_def: TypeDef) -> str:
    """`type Name[A] {\n  Ctor(A, Name[A]),\n  Other,\n}`."""
    params = "[" + ", ".join(tv.name for tv in type_def.type_params) + "]" if type_def.type_params else ""
    lines = [f"type {type_def.name}{params} {{"]
    for name, fields in type_def.constructors:
        lines.append(f"{INDENT}{name}" + (f"({', '.join(format_type(f) for f in fields)})" if fields else "") + ",")
    return "\n".join([*lines, "}"])


def _format_pattern(pattern: Pattern, binder: Any) -> str:
    if isinstance(pattern, PatternVar):
        return binder(pattern.var)
    if isinstance(pattern, PatternConstructor):
        subs = ", ".join(_format_pattern(p, binder) for p in pattern.patterns)
        return f"{pattern.constructor.name}({subs})" if pattern.patterns else pattern.constructor.name
    if isinstance(pattern, PatternTuple):
        fields = [_format_pattern(p, binder) for p in pattern.patterns]
        return f"({fields[0]},)" if len(fields) == 1 else "(" + ", ".join(fields) + ")"
    return "_"


def _type_defs(roots: list[Expr]) -> list[TypeDef]:
    """The algebraic data types the constructors under `roots` belong to, in order of first use."""
    found: dict[str, TypeDef] = {}
    for root in roots:
        for node in post_order(root):
            if isinstance(node, Constructor):
                found.setdefault(node.type_def.name, node.type_def)
            elif isinstance(node, Match):
                for pattern, _body in node.clauses:
                    stack = [pattern]
                    while stack:
                        item = stack.pop()
                        if isinstance(item, PatternConstructor):
                            found.setdefault(item.constructor.type_def.name, item.constructor.type_def)
                        if isinstance(item, PatternConstructor | PatternTuple):
                            stack.extend(item.patterns)
    return list(found.values())


def format_float(value: float, dtype: str) -> str:
    """The shortest decimal text that reads back as exactly `value` in `dtype` (no suffix)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if dtype == "float64":
        text = repr(float(value))
    else:
        np_type = np.float16 if dtype == "float16" else np.float32
        text = str(np_type(value))
        # numpy's shortest form is meant to round-trip; fall back to the exact double if it does
        # not, or if it lies beyond the dtype's maximum (the parser rejects such literals).
        if np_type(float(text)) != np_type(value) or abs(float(text)) > float(np.finfo(np_type).max):
            text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def scalar_literal(data: np.ndarray) -> str | None:
    """The literal for a scalar constant, or None when its dtype has no literal form."""
    if data.ndim != 0:
        return None
    dtype = str(data.dtype)
    if dtype == "bool":
        return "True" if bool(data) else "False"
    if dtype in _INT_SUFFIX:
        return f"{int(data)}{_INT_SUFFIX[dtype]}"
    if dtype in _FLOAT_SUFFIX:
        return format_float(float(data), dtype) + _FLOAT_SUFFIX[dtype]
    return None


def format_attr_value(value: Any) -> str:
    """An attribute value: ints plain, floats with `f`, bools True/False, strings quoted, lists in `[]`."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # Attribute floats are doubles; `f64` keeps values beyond float32's range readable.
        wide = math.isfinite(value) and abs(value) > _FLOAT32_MAX
        return format_float(value, "float64") + ("f64" if wide else "f")
    if isinstance(value, str):
        if '"' in value:
            raise UnsupportedError(f"the text format cannot write a string containing a double quote: {value!r}")
        return f'"{value}"'
    if value is None:
        return "None"
    if isinstance(value, AnyDim):
        return "?"
    if isinstance(value, tuple):
        return "[" + ", ".join(format_attr_value(v) for v in value) + "]"
    raise UnsupportedError(f"cannot print attribute value {value!r}")


def _format_attrs(attrs: Attrs | dict[str, Any]) -> list[str]:
    return [f"{key}={format_attr_value(value)}" for key, value in attrs.items()]


def _sanitize_name(name: str) -> str:
    cleaned = "".join(c if (c.isascii() and (c.isalnum() or c in "_/")) else "_" for c in name)
    if not cleaned or not (cleaned[0].isalpha() or cleaned[0] == "_"):
        cleaned = "v" + cleaned
    return cleaned


# ---------------------------------------------------------------------- the printer
Text = Any
"""Printed text as a rope: a `str`, a `_Block`, or a list of Texts. Nested bodies are not copied
into their parents' strings (that would cost time quadratic in the nesting depth); `flatten`
joins everything once at the end."""


class _Block:
    """The lines of one scope being printed; `indent` is the absolute indentation of its lines."""

    __slots__ = ("indent", "lines")

    def __init__(self, indent: str) -> None:
        self.indent = indent
        self.lines: list[Text] = []


def flatten(text: Text) -> str:
    """Join a rope into one string (iteratively; blocks become their lines joined by newlines)."""
    out: list[str] = []
    stack: list[Text] = [text]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, _Block):
            for i in range(len(item.lines) - 1, -1, -1):
                stack.append(item.lines[i])
                if i:
                    stack.append("\n")
        else:
            stack.extend(reversed(item))
    return "".join(out)


class Printer:
    """State of one print call: temp counter, variable names, meta constants, reference counts."""

    def __init__(self, show_types: bool, constants_out: list[np.ndarray] | None) -> None:
        self.show_types = show_types
        self.constants_out = constants_out
        self.constant_index: dict[int, int] = {}
        self.memo: dict[int, str] = {}  # id(node) -> `%k` of its hoisted binding
        self.counter = 0
        self.var_names: dict[int, str] = {}
        self.used_names: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.refcount: dict[int, int] = {}
        self.roots: list[Expr] = []  # keeps every printed node alive, so ids stay unique

    def count_references(self, roots: list[Expr]) -> None:
        self.roots.extend(roots)
        refcount = self.refcount
        for root in roots:
            for node in post_order(root):
                for child in node.children():
                    refcount[id(child)] = refcount.get(id(child), 0) + 1

    # ------------------------------------------------------------------ names and atoms
    def name_var(self, var: Var) -> str:
        name = self.var_names.get(id(var))
        if name is not None:
            return name
        base = _sanitize_name(var.name_hint)
        name = base
        if name in self.used_names:
            k = self.next_suffix.get(base, 1)
            while f"{base}{k}" in self.used_names:
                k += 1
            self.next_suffix[base] = k + 1
            name = f"{base}{k}"
        self.used_names.add(name)
        self.var_names[id(var)] = name
        return name

    def binder_text(self, var: Var) -> str:
        text = "%" + self.name_var(var)
        if var.type_annotation is not None:
            text += ": " + format_type(var.type_annotation)
        return text

    def atom_text(self, node: Expr) -> str | None:
        if isinstance(node, Var):
            return "%" + self.name_var(node)
        if isinstance(node, Constant):
            literal = scalar_literal(node.data)
            return literal if literal is not None else self.meta_constant(node)
        if isinstance(node, GlobalVar):
            return "@" + node.name
        if isinstance(node, Op):
            return node.name
        if isinstance(node, Constructor):
            return node.name
        return None

    def meta_constant(self, node: Constant) -> str:
        index = self.constant_index.get(id(node))
        if index is None:
            if self.constants_out is not None:
                index = len(self.constants_out)
                self.constants_out.append(node.data)
            else:
                index = len(self.constant_index)
            self.constant_index[id(node)] = index
        return f"meta[relay.Constant][{index}]"

    def type_comment(self, node: Expr) -> str:
        if self.show_types and node.has_type():
            return f" /* ty={format_type(node.checked_type)} */"
        return ""

    def value_comment(self, node: Expr) -> str:
        # A node printed as a binding carries its comment on that binding.
        return "" if id(node) in self.memo else self.type_comment(node)

    # ------------------------------------------------------------------ expressions
    def g_expr(self, node: Expr, block: _Block, in_place: bool) -> Steps[Text]:
        """Text naming `node` inside `block`; non-atomic nodes are hoisted unless `in_place`."""
        atom = self.atom_text(node)
        if atom is not None:
            return atom
        key = id(node)
        bound = self.memo.get(key)
        if bound is not None:
            return bound
        if self.refcount.get(key, 0) > 1:
            in_place = False
        text = yield self.g_node_text(node, block)
        if in_place:
            return text
        name = f"%{self.counter}"
        self.counter += 1
        block.lines.append([block.indent, name, " = ", text, self.type_comment(node), ";"])
        self.memo[key] = name
        return name

    def g_node_text(self, node: Expr, block: _Block) -> Steps[Text]:
        """The text of a non-atomic node itself, its operands hoisted into `block`."""
        if isinstance(node, Call) and isinstance(node.op, Constructor) and not node.args:
            return node.op.name  # a constructor without fields reads as its value (`Nil`)
        if isinstance(node, Call):
            # Arguments before the callee: a fused function literal then sits right above its call.
            parts = []
            for arg in node.args:
                parts.append((yield self.g_expr(arg, block, False)))
            callee = yield self.g_expr(node.op, block, False)
            parts.extend(_format_attrs(self.call_attrs(node)))
            return f"{callee}({', '.join(parts)})"
        if isinstance(node, Tuple):
            fields = []
            for field in node.fields:
                fields.append((yield self.g_expr(field, block, False)))
            if len(fields) == 1:
                return f"({fields[0]},)"
            return "(" + ", ".join(fields) + ")"
        if isinstance(node, TupleGetItem):
            value = yield self.g_expr(node.tuple_value, block, False)
            if not value.startswith(("%", "@", "meta[")):
                value = f"({value})"  # `0.1` would read as a number, `(0).1` is a projection
            return f"{value}.{node.index}"
        if isinstance(node, Function):
            return (yield self.g_function(node, block.indent, None))
        if isinstance(node, If):
            cond = yield self.g_expr(node.cond, block, False)
            then_block = yield self.g_scope(node.true_branch, block.indent + INDENT)
            else_block = yield self.g_scope(node.false_branch, block.indent + INDENT)
            return [f"if ({cond}) {{\n", then_block, f"\n{block.indent}}} else {{\n", else_block, f"\n{block.indent}}}"]
        if isinstance(node, Match):
            data = yield self.g_expr(node.data, block, False)
            pieces: list[Text] = [f"match ({data}) {{\n"]
            for pattern, body in node.clauses:
                clause = yield self.g_scope(body, block.indent + INDENT + INDENT)
                pieces += [f"{block.indent}{INDENT}{_format_pattern(pattern, self.binder_text)} => {{\n", clause,
                           f"\n{block.indent}{INDENT}}},\n"]
            return [*pieces, f"{block.indent}}}"]
        if isinstance(node, Let):
            # A let used as an operand: its own scope, in parentheses.
            inner = yield self.g_scope(node, block.indent + INDENT, expand_let=True)
            return ["(\n", inner, f"\n{block.indent})"]
        raise UnsupportedError(f"cannot print expression node {type(node).__name__}")

    def call_attrs(self, call: Call) -> Attrs | dict[str, Any]:
        if isinstance(call.op, Op):
            try:
                opdef = get_op(call.op.name)
            except UnknownOperatorError:
                return call.attrs
            shown = opdef.non_default_attrs(call.attrs)
            # A required attribute must be written even when it equals its default, or the text
            # would not parse back.
            return {k: v for k, v in call.attrs.items() if k in shown or k in opdef.required_attrs}
        return call.attrs

    def g_scope(self, body: Expr, indent: str, expand_let: bool = False) -> Steps[_Block]:
        """A new scope whose value is `body`."""
        block = _Block(indent)
        yield self.g_body(body, block, expand_let)
        return block

    def g_body(self, expr: Expr, block: _Block, expand_let: bool = False) -> Steps[None]:
        """Append `let` lines and the final expression of a scope to `block` (let chains iteratively).

        A shared `let` is printed once as a hoisted, parenthesised scope; `expand_let` says that
        `expr` is that let itself, so it must be written out here rather than hoisted again.
        """
        while isinstance(expr, Let) and (
            expand_let or (self.refcount.get(id(expr), 0) <= 1 and id(expr) not in self.memo)
        ):
            expand_let = False
            binder = self.binder_text(expr.var)
            value = yield self.g_expr(expr.value, block, True)
            block.lines.append([block.indent, "let ", binder, " = ", value, self.value_comment(expr.value), ";"])
            expr = expr.body
        final = yield self.g_expr(expr, block, True)
        block.lines.append([block.indent, final, self.value_comment(expr)])

    def g_function(self, func: Function, indent: str, global_name: str | None) -> Steps[Text]:
        head = f"def @{global_name}" if global_name is not None else "fn "
        if func.type_params:
            head += "[" + ", ".join(tv.name for tv in func.type_params) + "]"
        params = [self.binder_text(p) for p in func.params]
        params.extend(_format_attrs(func.attrs))
        ret = f" -> {format_type(func.ret_type)}" if func.ret_type is not None else ""
        body = _Block(indent + INDENT)
        if global_name is not None:
            # A global function with free variables (possible with `free_var`) must declare them
            # to be readable again; well-formed modules have none.
            for var in free_vars(func):
                body.lines.append([body.indent, "free_var ", self.binder_text(var), ";"])
        yield self.g_body(func.body, body)
        return [f"{head}({', '.join(params)}){ret} {{\n", body, f"\n{indent}}}"]


# ---------------------------------------------------------------------- public functions
def print_module(mod: IRModule, show_types: bool = False, constants_out: list[np.ndarray] | None = None) -> str:
    """The text of `mod`: version header, then each global function sorted by name.

    Non-scalar constants print as `meta[relay.Constant][i]`; pass a list as `constants_out` to
    receive them (then `parse_module(text, constants=constants_out)` gives `mod` back).
    """
    printer = Printer(show_types, constants_out)
    names = sorted(mod)
    printer.count_references([mod[name] for name in names])
    definitions = [format_type_def(t) for t in _type_defs([mod[name] for name in names])]
    definitions += [flatten(drive(printer.g_function(mod[name], "", name))) for name in names]
    return VERSION_HEADER + "\n" + "\n\n".join(definitions) + "\n"


def print_expr(expr: Expr, show_types: bool = False, constants_out: list[np.ndarray] | None = None) -> str:
    """The text of a bare expression; its free variables are declared with `free_var` lines."""
    printer = Printer(show_types, constants_out)
    printer.count_references([expr])
    lines = [VERSION_HEADER]
    for var in free_vars(expr):
        lines.append(f"free_var {printer.binder_text(var)};")
    block = _Block("")
    drive(printer.g_body(expr, block))
    lines.append(flatten(block))
    return "\n".join(lines) + "\n"


def print_type(ty: Type) -> str:
    """The text of a type (same as used in annotations)."""
    return format_type(ty)
