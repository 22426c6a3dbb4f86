"""What every ONNX converter works with: `OnnxNode` (one node, inputs resolved to Relay expressions) and
`Importer` (builds Relay expressions and tracks their types), shared by the importer (`relay_tune.frontend.onnx`)
and the converter tables beside it (`relay_tune.frontend.onnx_image`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError, UnsupportedError
from relay_tune.ir.expr import Call, Constant, Expr, Tuple, TupleGetItem, Var, op
from relay_tune.ir.types import AnyDim, Dim, TensorType, TupleType, Type
from relay_tune.op.registry import get_op


class OnnxModelError(RelayTuneError):
    """An ONNX model that is malformed or that a node of it cannot be converted (the message names it)."""


@dataclass
class OnnxNode:
    """One ONNX node, with its inputs resolved to Relay expressions (None for an omitted optional input)."""

    op_type: str
    name: str
    inputs: list[Expr | None]
    input_names: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def input(self, index: int) -> Expr | None:
        return self.inputs[index] if index < len(self.inputs) else None

    def required(self, index: int) -> Expr:
        value = self.input(index)
        if value is None:
            raise OnnxModelError(f"input {index} is required")
        return value

    def output_used(self, index: int) -> bool:
        return index < len(self.outputs) and bool(self.outputs[index])

    def attr_float(self, name: str, default: float) -> float:
        """A float attribute. ONNX stores them as float32: take the shortest decimal that is that float32
        (`1e-05`, not `9.999999747378752e-06`), which is the value the model's author wrote."""
        return float(str(np.float32(self.attrs.get(name, default))))

    def attr_str(self, name: str, default: str) -> str:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else str(value)


class Importer:
    """Builds Relay expressions for ONNX nodes, tracking the type of every expression it makes."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self._types: dict[int, Type] = {}
        self._keep: list[Expr] = []  # keeps typed nodes alive so `id()` keys stay unique

    # --- types ------------------------------------------------------------------------------
    def type_of(self, expr: Expr) -> Type:
        if isinstance(expr, Constant):
            return expr.tensor_type
        if isinstance(expr, Var):
            assert expr.type_annotation is not None
            return expr.type_annotation
        if isinstance(expr, Tuple):
            return TupleType(tuple(self.type_of(f) for f in expr.fields))
        if isinstance(expr, TupleGetItem):
            tuple_type = self.type_of(expr.tuple_value)
            assert isinstance(tuple_type, TupleType)
            return tuple_type.fields[expr.index]
        return self._types[id(expr)]

    def tensor(self, expr: Expr) -> TensorType:
        ty = self.type_of(expr)
        if not isinstance(ty, TensorType):
            raise OnnxModelError(f"expected a tensor, got a value of type {ty}")
        return ty

    def shape(self, expr: Expr) -> tuple[Dim, ...]:
        return self.tensor(expr).shape

    def rank(self, expr: Expr) -> int:
        return self.tensor(expr).ndim

    def dtype(self, expr: Expr) -> str:
        return self.tensor(expr).dtype

    def static_shape(self, expr: Expr, what: str = "the input") -> tuple[int, ...]:
        shape = self.shape(expr)
        if not all(isinstance(d, int) for d in shape):
            raise UnsupportedError(
                f"{what} has the dynamic shape {_fmt(shape)}; this conversion needs static dimensions "
                "(give the model's input shapes with shape_overrides / --shape)"
            )
        return tuple(int(d) for d in shape)  # type: ignore[arg-type]

    # --- building ---------------------------------------------------------------------------
    def call(self, op_name: str, args: Sequence[Expr], **attrs: Any) -> Expr:
        """`op_name(args, attrs)` with its type computed now; folded to a constant when every argument is one."""
        opdef = get_op(op_name)
        full = opdef.make_attrs(attrs)
        assert opdef.type_relation is not None, op_name
        out_type = opdef.type_relation([self.type_of(a) for a in args], full)
        if opdef.reference is not None and all(_is_constant(a) for a in args):
            return self._fold(opdef.reference([_constant_value(a) for a in args], full), out_type, op_name)
        node = Call(op(op_name), tuple(args), full)
        self._types[id(node)] = out_type
        self._keep.append(node)
        return node

    def _fold(self, value: Any, out_type: Type, op_name: str) -> Expr:
        if isinstance(value, tuple):
            assert isinstance(out_type, TupleType)
            return Tuple(tuple(self._fold(v, t, op_name) for v, t in zip(value, out_type.fields)))
        folded = Constant(np.asarray(value))
        assert folded.tensor_type == out_type, f"{op_name}: folded {folded.tensor_type}, relation says {out_type}"
        return folded

    def item(self, expr: Expr, index: int) -> Expr:
        if isinstance(expr, Tuple):
            return expr.fields[index]
        return TupleGetItem(expr, index)

    def const(self, value: Any, dtype: str) -> Constant:
        return Constant(np.asarray(value, dtype=dtype))

    def static(self, expr: Expr | None, what: str) -> np.ndarray:
        """The value of an input that must be known at import time (shapes, axes, pads, ...)."""
        if expr is None:
            raise OnnxModelError(f"{what} is missing")
        if not isinstance(expr, Constant):
            raise UnsupportedError(
                f"{what} is computed at run time; relay-tune needs it as a constant known at import time"
            )
        return expr.data

    def static_ints(self, expr: Expr | None, what: str) -> list[int]:
        return [int(v) for v in self.static(expr, what).reshape(-1)]

    # --- common compositions ----------------------------------------------------------------
    def cast(self, expr: Expr, dtype: str) -> Expr:
        return expr if self.dtype(expr) == dtype else self.call("cast", [expr], dtype=dtype)

    def reshape(self, expr: Expr, newshape: Sequence[int]) -> Expr:
        if tuple(newshape) == self.shape(expr):
            return expr
        return self.call("reshape", [expr], newshape=[int(d) for d in newshape])

    def binary(self, op_name: str, lhs: Expr, rhs: Expr) -> Expr:
        return self.call(op_name, [lhs, rhs])

    def scalar_op(self, op_name: str, expr: Expr, value: float) -> Expr:
        return self.call(op_name, [expr, self.const(value, self.dtype(expr))])


def _is_constant(expr: Expr) -> bool:
    return isinstance(expr, Constant) or (isinstance(expr, Tuple) and all(isinstance(f, Constant) for f in expr.fields))


def _constant_value(expr: Expr) -> Any:
    if isinstance(expr, Tuple):
        return [f.data for f in expr.fields]  # type: ignore[attr-defined]
    assert isinstance(expr, Constant)
    return expr.data


def _fmt(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if isinstance(d, AnyDim) else str(d) for d in shape) + ")"
