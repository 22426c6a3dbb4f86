"""What every ONNX converter works with: `OnnxNode` (one node, inputs resolved to Relay expressions), `Importer`
(builds Relay expressions and tracks their types), and the helpers the converter modules share (element types,
axes, flattening, batched matmul), used by the importer (`relay_tune.frontend.onnx`) and every converter module
beside it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from relay_tune.errors import RelayTuneError, UnsupportedError
from relay_tune.ir.expr import Call, Constant, Expr, Tuple, TupleGetItem, Var, op
from relay_tune.ir.types import AnyDim, Dim, TensorType, TupleType, Type
from relay_tune.op._shape import broadcast_shapes
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
    # The values visible by name where the node is (its graph's and the enclosing graphs'): what the subgraphs
    # of a control-flow node see.
    scope: dict[str, Expr] = field(default_factory=dict, repr=False)

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
        # Converts a subgraph attribute's nodes in the enclosing graph's scope; set by the graph walk.
        self.graph_inliner: Callable[[onnx.GraphProto, Sequence[Expr]], list[Expr]] | None = None

    def inline_graph(self, graph: onnx.GraphProto, inputs: Sequence[Expr]) -> list[Expr]:
        """The outputs of subgraph `graph` (a GRAPH attribute) applied to `inputs`."""
        if self.graph_inliner is None:
            raise UnsupportedError("subgraphs are only converted inside an ONNX graph walk")
        return self.graph_inliner(graph, inputs)

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
                f"{what} has the dynamic shape {format_shape(shape)}; this conversion needs static dimensions "
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
        if opdef.reference is not None and all(_is_constant(a) or is_empty(self.type_of(a)) for a in args):
            # An empty tensor has one possible value, so a call whose other arguments are constants is one too
            # (and zero-size tensors are not compiled).
            values = [_constant_value(a) if _is_constant(a) else _empty_value(self.type_of(a)) for a in args]
            return self._fold(opdef.reference(values, full), out_type, op_name)
        if is_empty(out_type):  # an empty result holds no data: a constant whatever the arguments
            return Constant(_empty_value(out_type))
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
    def cast(self, expr: Expr, dtype: str, saturate: bool = True, round_mode: str = "up") -> Expr:
        """`expr` converted to `dtype`; `saturate` and `round_mode` as ONNX Cast's (float8 targets only)."""
        if self.dtype(expr) == dtype:
            return expr
        return self.call("cast", [expr], dtype=dtype, saturate=saturate, round_mode=round_mode)

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


def is_empty(ty: Type) -> bool:
    """Whether `ty` is a tensor type of static shape with no elements."""
    return isinstance(ty, TensorType) and all(isinstance(d, int) for d in ty.shape) and 0 in ty.shape


def _empty_value(ty: Type) -> np.ndarray:
    assert isinstance(ty, TensorType)
    return np.zeros([int(d) for d in ty.shape], dtype=ty.dtype)  # type: ignore[call-overload]


def _constant_value(expr: Expr) -> Any:
    if isinstance(expr, Tuple):
        return [f.data for f in expr.fields]  # type: ignore[attr-defined]
    assert isinstance(expr, Constant)
    return expr.data


def format_shape(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if isinstance(d, AnyDim) else str(d) for d in shape) + ")"


_ONNX_DTYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8_e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    onnx.TensorProto.FLOAT8E8M0: "float8_e8m0fnu",
    onnx.TensorProto.FLOAT4E2M1: "float4_e2m1fn",
    onnx.TensorProto.INT4: "int4",
    onnx.TensorProto.UINT4: "uint4",
    onnx.TensorProto.INT2: "int2",
    onnx.TensorProto.UINT2: "uint2",
}


def relay_dtype(elem_type: int, what: str) -> str:
    """The Relay dtype of an ONNX element type; types without one (string, complex) are unsupported."""
    try:
        return _ONNX_DTYPES[elem_type]
    except KeyError:
        known = elem_type in onnx.TensorProto.DataType.values()
        name = onnx.TensorProto.DataType.Name(elem_type) if known else str(elem_type)
        raise UnsupportedError(f"{what}: ONNX element type {name} is not supported") from None


def cast_options(node: OnnxNode) -> tuple[bool, str]:
    """Cast's and CastLike's `saturate` and `round_mode` (defaults 1 and "up")."""
    round_mode = node.attrs.get("round_mode", "up")
    if isinstance(round_mode, bytes):
        round_mode = round_mode.decode()
    if round_mode not in ("up", "down", "nearest"):
        raise OnnxModelError(f"{node.op_type} round_mode must be up, down or nearest, got {round_mode!r}")
    return bool(int(node.attrs.get("saturate", 1))), str(round_mode)


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in `[0, rank)`, counting a negative axis from the end."""
    if not -rank <= axis < rank:
        raise OnnxModelError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def legacy_broadcast(imp: Importer, node: OnnxNode, lhs: Expr, rhs: Expr) -> Expr:
    """Before opset 7, `broadcast=1, axis=k` aligns the right operand's dims with the left's from axis k."""
    if imp.opset >= 7 or not node.attrs.get("broadcast") or "axis" not in node.attrs:
        return rhs
    rank = imp.rank(lhs)
    axis = normalize_axis(int(node.attrs["axis"]), rank)
    rhs_shape = imp.shape(rhs)
    trailing = rank - axis - len(rhs_shape)
    if trailing <= 0:
        return rhs
    return imp.call("reshape", [rhs], newshape=[*[0] * len(rhs_shape), *[1] * trailing])


def flatten_2d(imp: Importer, x: Expr, axis: int) -> Expr:
    """`x` reshaped to `(prod(shape[:axis]), prod(shape[axis:]))`."""
    shape = imp.shape(x)
    tail = shape[axis:]
    if all(isinstance(d, int) for d in shape):
        return imp.reshape(x, [math.prod(shape[:axis]), math.prod(tail)])  # type: ignore[arg-type]
    if all(isinstance(d, int) for d in tail):
        return imp.call("reshape", [x], newshape=[-1, math.prod(tail)])  # type: ignore[arg-type]
    raise UnsupportedError(f"flattening a tensor of dynamic shape {format_shape(shape)} at axis {axis}")


def restore_shape(imp: Importer, x: Expr, shape: Sequence[Dim]) -> Expr:
    """`x` reshaped to `shape`, whose one dynamic dimension (if any) is inferred from the element count."""
    if all(isinstance(d, int) for d in shape):
        return imp.reshape(x, shape)  # type: ignore[arg-type]
    # A single dynamic dimension (typically the batch) is inferred from the element count.
    spec = [-1 if isinstance(d, AnyDim) else int(d) for d in shape]
    if spec.count(-1) != 1:
        raise UnsupportedError(f"restoring the dynamic shape {format_shape(shape)}")
    return imp.call("reshape", [x], newshape=spec)


def onnx_softmax(imp: Importer, x: Expr, axis: int) -> Expr:
    """Softmax over `axis` as the ONNX reference computes it in `x`'s own type.

    float32 and float64 use `nn.softmax` (one fused, tuned kernel). A float16 softmax is spelled out as max,
    subtract, exp, sum and divide in float16, because the reference rounds the shifted scores and each
    exponential to float16 before summing; `nn.softmax` keeps them in float32, one float16 ulp away. The sum
    accumulates in float32 as numpy does over a last axis (the attention case: the results agree exactly); over
    another axis numpy adds in float16 step by step, which is not imitated (an ulp or two apart)."""
    if imp.dtype(x) != "float16":
        return imp.call("nn.softmax", [x], axis=axis)
    shifted = imp.call("subtract", [x, imp.call("max", [x], axis=[axis], keepdims=True)])
    exps = imp.call("exp", [shifted])
    return imp.call("divide", [exps, imp.call("sum", [exps], axis=[axis], keepdims=True)])


def batch_matmul(imp: Importer, a: Expr, b: Expr) -> Expr:
    """numpy matmul of `a (..., M, K)` and `b (..., K, N)` with broadcast batch dims, via nn.batch_matmul."""
    a_shape = imp.static_shape(a, "the first MatMul operand")
    b_shape = imp.static_shape(b, "the second MatMul operand")
    batch = tuple(int(d) for d in broadcast_shapes(a_shape[:-2], b_shape[:-2], op_name="MatMul"))  # type: ignore[call-overload]
    count = math.prod(batch)

    def as_3d(x: Expr, shape: tuple[int, ...]) -> Expr:
        own = shape[:-2]
        if math.prod(own) == 1:
            return imp.reshape(x, [1, *shape[-2:]])  # batch_matmul broadcasts a batch of 1
        padded = (1,) * (len(batch) - len(own)) + own
        if padded != batch:
            x = imp.call("broadcast_to", [x], shape=[*batch, *shape[-2:]])
        return imp.reshape(x, [count, *shape[-2:]])

    out = imp.call("nn.batch_matmul", [as_3d(a, a_shape), as_3d(b, b_shape)])
    return imp.reshape(out, [*batch, a_shape[-2], b_shape[-1]])


# --- normalisation ------------------------------------------------------------------------------
