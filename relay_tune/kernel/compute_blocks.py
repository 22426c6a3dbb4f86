"""The building blocks of operator computes: stage tags, broadcast reads, element-wise maps, layout index maps,
named index functions.

The operator families (`relay_tune.op`) write their `@compute` rules with these; `relay_tune.kernel.compute`
applies the rules to a fused function. This module sits below both and reads no operator registry, so the
operator layer and the fused-function compute import in one direction only (op -> compute_blocks,
compute -> op.registry).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from relay_tune.errors import CompileError, UnsupportedError
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES
from relay_tune.ir.types import TensorType, Type
from relay_tune.kernel import te, tir
from relay_tune.kernel.tir import ExprLike, PrimExpr

# ------------------------------------------------------------------------------------------------
# Tags
# ------------------------------------------------------------------------------------------------

ELEMWISE = "elemwise"
BROADCAST = "broadcast"
INJECTIVE = "injective"
INLINABLE_TAGS = frozenset({ELEMWISE, BROADCAST, INJECTIVE})
"""Tags of stages that are cheap to recompute wherever they are read (the default schedule inlines them)."""

FAMILY_TAGS = frozenset(
    {"dense", "batch_matmul", "conv2d_nchw", "conv2d_nchw_cl", "conv2d_nhwc", "depthwise_conv2d_nchw", "conv",
     "group_conv2d_nchw",
     "conv2d_nchwc", "depthwise_conv2d_nchwc", "conv_transpose",
     "pool", "global_pool", "reduce", "softmax", "norm", "pad", "pack", "winograd_input", "winograd_output"}
)
"""Tags of the stages operator computes create besides the inlinable ones."""


# ------------------------------------------------------------------------------------------------
# Helpers for operator computes
# ------------------------------------------------------------------------------------------------


def static_shape(ty: Type, what: str = "tensor") -> tuple[int, ...]:
    """The shape of a tensor type whose dims are all known (kernels are compiled for fixed shapes)."""
    if not isinstance(ty, TensorType):
        raise UnsupportedError(f"expected a tensor type for the {what}, got {ty}")
    if not ty.is_static:
        raise UnsupportedError(f"cannot compile a kernel for {what} of dynamic shape {ty}; kernels need static shapes")
    return tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]


def tensor_type(ty: Type, what: str = "result") -> TensorType:
    if not isinstance(ty, TensorType):
        raise UnsupportedError(f"expected a tensor type for the {what}, got {ty}")
    return ty


def named(names: Sequence[str], body: Callable[..., ExprLike]) -> Callable[..., ExprLike]:
    """`body(*indices)` under a signature with the given parameter names, so that `te.compute` names the
    axes (and so the schedule's loops) after them instead of `ax0, ax1, ...`."""

    def fcompute(*idx: PrimExpr) -> ExprLike:
        return body(*idx)

    fcompute.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names]
    )
    return fcompute


def axis_names(count: int, prefix: str = "ax") -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def broadcast_read(tensor: te.Tensor, indices: Sequence[PrimExpr]) -> PrimExpr:
    """Read `tensor` at the output position `indices` under numpy broadcasting (trailing dims aligned;
    a dim of extent 1 always reads index 0)."""
    offset = len(indices) - tensor.ndim
    if offset < 0:
        raise CompileError(f"cannot broadcast {tensor.name} {tensor.shape} to rank {len(indices)}")
    idx = tuple(tir.IntImm(0) if tensor.shape[d] == 1 else indices[offset + d] for d in range(tensor.ndim))
    return tensor[idx]


def elementwise(
    name: str,
    inputs: Sequence[te.Tensor],
    out_type: Type,
    fn: Callable[..., ExprLike],
    tag: str = ELEMWISE,
) -> te.Tensor:
    """`out[i] = fn(inputs[0][i'], inputs[1][i''], ...)` with broadcasting reads."""
    ty = tensor_type(out_type)
    shape = static_shape(ty)

    def body(*idx: PrimExpr) -> PrimExpr:
        value = tir.as_expr(fn(*(broadcast_read(t, idx) for t in inputs)))
        return te.cast(ty.dtype, value)

    return te.compute(shape, named(axis_names(len(shape)), body), name, tag)


def scalar_constant(value: Any, dtype: str, name: str = "const") -> te.Tensor:
    """A rank-0 tensor holding a compile-time constant (inlined by the default schedule)."""
    expr = const_expr(value, dtype)
    return te.compute((), named([], lambda: expr), name, ELEMWISE)


def const_expr(value: Any, dtype: str) -> PrimExpr:
    """A constant of `dtype` from a Python or numpy scalar (bools become `bool` immediates)."""
    if dtype == "bool":
        return tir.IntImm(int(bool(value)), "bool")
    if dtype.startswith(("float", "bfloat")):
        return tir.FloatImm(float(value), dtype)
    return tir.IntImm(int(value), dtype)


def accumulate_dtype(dtype: str) -> str:
    """The dtype sums and products accumulate in: float32 for float16 and narrower floats (as the references
    do), else `dtype`."""
    return "float32" if dtype == "float16" or dtype in LOW_PRECISION_FLOAT_DTYPES else dtype


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


_LAYOUT_TOKEN = re.compile(r"(\d*)([A-Za-z])")


@dataclass(frozen=True)
class LayoutMap:
    """Index arithmetic between a layout string (`NCHW`, `NHWC`, `NCHW8c`, `OIHW4i8o`, ...) and its
    logical ("primal") axes: a lower-case `<factor><letter>` axis is the inner part of a split primal axis."""

    name: str
    axes: tuple[tuple[str, int | None], ...]

    @staticmethod
    def parse(name: str, what: str = "layout") -> LayoutMap:
        axes: list[tuple[str, int | None]] = []
        pos = 0
        for m in _LAYOUT_TOKEN.finditer(name):
            if m.start() != pos:
                break
            pos = m.end()
            digits, letter = m.groups()
            axes.append((letter, None) if letter.isupper() else (letter.upper(), int(digits or 0) or None))
            if letter.islower() and not digits:
                raise UnsupportedError(f"{what} {name!r}: split axis {letter} needs a factor")
        if pos != len(name) or not name:
            raise UnsupportedError(f"invalid {what} {name!r}")
        return LayoutMap(name, tuple(axes))

    @property
    def primal(self) -> str:
        return "".join(letter for letter, f in self.axes if f is None)

    def factor(self, letter: str) -> int | None:
        for a, f in self.axes:
            if a == letter and f is not None:
                return f
        return None

    def index(self, primal: dict[str, PrimExpr]) -> tuple[PrimExpr, ...]:
        """Position in this layout of the element at logical position `primal` (letter -> index)."""
        out: list[PrimExpr] = []
        for letter, f in self.axes:
            value = primal[letter]
            if f is not None:
                out.append(value % f)
            else:
                sub = self.factor(letter)
                out.append(value // sub if sub is not None else value)
        return tuple(out)

    def logical(self, idx: Sequence[PrimExpr]) -> dict[str, PrimExpr]:
        """Logical index (letter -> expression) of the element at position `idx` in this layout."""
        outer: dict[str, PrimExpr] = {}
        inner: dict[str, tuple[PrimExpr, int]] = {}
        for (letter, f), value in zip(self.axes, idx):
            if f is None:
                outer[letter] = value
            else:
                inner[letter] = (value, f)
        result: dict[str, PrimExpr] = {}
        for letter, value in outer.items():
            if letter in inner:
                sub, f = inner[letter]
                result[letter] = value * f + sub
            else:
                result[letter] = value
        return result

    def axis_names(self, names: dict[str, str]) -> list[str]:
        """Readable axis names in this layout's order, from primal letter -> name (`8c` -> `<name>_i`)."""
        return [names.get(letter, letter.lower()) if f is None else names.get(letter, letter.lower()) + "_i"
                for letter, f in self.axes]
