"""Shape, dtype and layout helpers shared by the operator type relations and numpy references.

Dimensions are `Dim` values: a non-negative `int` or `ANY` (a `?` dimension whose size is only
known at run time). The rule used throughout is that `?` never hides an error we can see: a `?`
is compatible with anything, and wherever a static size is known it wins.

Every error raised here is a `RelayTypeError` whose message names the shapes involved, because a
user reading "cannot broadcast" without the two shapes has to go and find them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.errors import RelayTypeError, UnsupportedError
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES, is_low_precision, ml_dtypes_module
from relay_tune.ir.types import ANY, AnyDim, Dim, TensorType, TupleType, Type

# --------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------

# The low-precision types (relay_tune.ir.dtypes) are named as in ml_dtypes, so `numpy_dtype` maps them 1:1.
FLOAT_DTYPES = frozenset({"float16", "float32", "float64"}) | LOW_PRECISION_FLOAT_DTYPES
SIGNED_INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "int4", "int2"})
UNSIGNED_INT_DTYPES = frozenset({"uint8", "uint16", "uint32", "uint64", "uint4", "uint2"})
INT_DTYPES = SIGNED_INT_DTYPES | UNSIGNED_INT_DTYPES
DTYPES = FLOAT_DTYPES | INT_DTYPES | {"bool"}


def is_float_dtype(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int_dtype(dtype: str) -> bool:
    """Signed or unsigned integer (bool is not an integer here)."""
    return dtype in INT_DTYPES


MAX_RANK = 64  # far beyond any real tensor; a larger rank comes from an absurd attribute, not a model
INT64_MAX = 2**63 - 1


def check_rank(ndim: int, op_name: str | None = None) -> int:
    """`ndim` if a tensor may have that many dimensions; else a type error (before any list that long is built)."""
    if ndim > MAX_RANK:
        raise RelayTypeError(f"the result would have {ndim} dimensions (at most {MAX_RANK} are supported)",
                             op_name=op_name)
    return ndim


def check_dtype(dtype: Any, op_name: str | None = None, what: str = "dtype") -> str:
    """Validate a dtype string given as an attribute (e.g. `cast(x, dtype=...)`)."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        known = ", ".join(sorted(DTYPES))
        raise RelayTypeError(f"unknown {what} {dtype!r} (supported: {known})", op_name=op_name)
    return dtype


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a Relay dtype string."""
    if dtype not in DTYPES:
        raise UnsupportedError(f"dtype {dtype!r} has no numpy equivalent")
    if is_low_precision(dtype):
        return np.dtype(getattr(ml_dtypes_module(), dtype))
    return np.dtype(dtype)


# --------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------


def format_dim(dim: Dim) -> str:
    return "?" if isinstance(dim, AnyDim) else str(dim)


def format_shape(shape: Sequence[Dim]) -> str:
    """`(2, ?, 3)`; a rank-1 shape prints as `(5,)` so it does not read as a parenthesised number."""
    if len(shape) == 1:
        return f"({format_dim(shape[0])},)"
    return "(" + ", ".join(format_dim(d) for d in shape) + ")"


def is_static(shape: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in shape)


def prod(dims: Iterable[Dim]) -> Dim:
    """Product of dimensions; `ANY` if any factor is `ANY` (1 for no dimensions)."""
    result = 1
    for d in dims:
        if isinstance(d, AnyDim):
            return ANY
        result *= d
    return result


def merge_dims(a: Dim, b: Dim) -> Dim | None:
    """The dimension two dims that must be equal agree on, or None if they conflict.

    `?` against k gives k (the static size is the stronger statement); `?` against `?` stays `?`.
    """
    if isinstance(a, AnyDim):
        return b
    if isinstance(b, AnyDim):
        return a
    return a if a == b else None


def broadcast_dims(a: Dim, b: Dim) -> Dim | None:
    """numpy broadcasting of one dimension pair; None if incompatible.

    A static 1 yields to the other side even if that is `?` (the 1 carries no information), while
    `?` against a static k > 1 gives k: the program is only valid if `?` turns out to be 1 or k.
    """
    if isinstance(a, int) and isinstance(b, int):
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        return None
    if a == 1:
        return b
    if b == 1:
        return a
    return merge_dims(a, b)


def broadcast_shapes(a: Sequence[Dim], b: Sequence[Dim], *, op_name: str | None = None) -> tuple[Dim, ...]:
    """numpy broadcasting aligned at the trailing dimension; raises `RelayTypeError` naming both shapes."""
    ndim = max(len(a), len(b))
    pa = (1,) * (ndim - len(a)) + tuple(a)
    pb = (1,) * (ndim - len(b)) + tuple(b)
    out: list[Dim] = []
    for i, (da, db) in enumerate(zip(pa, pb)):
        d = broadcast_dims(da, db)
        if d is None:
            raise RelayTypeError(
                f"shapes {format_shape(a)} and {format_shape(b)} cannot be broadcast together "
                f"(axis {i - ndim}: {format_dim(da)} vs {format_dim(db)})",
                op_name=op_name,
            )
        out.append(d)
    return tuple(out)


def normalize_axis(axis: Any, ndim: int, *, op_name: str | None = None, what: str = "axis") -> int:
    """Map `axis` in [-ndim, ndim) to [0, ndim); anything else is a `RelayTypeError`.

    Operators that insert an axis (expand_dims, stack) accept [-ndim-1, ndim]: call this with ndim+1.
    """
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise RelayTypeError(f"{what} must be an integer, got {axis!r}", op_name=op_name)
    if not -ndim <= axis < ndim:
        raise RelayTypeError(
            f"{what} {axis} is out of range for a tensor of rank {ndim} (valid: {-ndim} to {ndim - 1})",
            op_name=op_name,
        )
    return axis + ndim if axis < 0 else axis


def as_int_tuple(value: Any, *, op_name: str | None = None, what: str = "value") -> tuple[int, ...]:
    """An attribute that must be an int or a list of ints, as a tuple."""
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise RelayTypeError(f"{what} must be an integer or a list of integers, got {value!r}", op_name=op_name)
    return tuple(items)


# --------------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------------


def expect_arity(arg_types: Sequence[Type], count: int, op_name: str) -> None:
    if len(arg_types) != count:
        plural = "s" if count != 1 else ""
        raise RelayTypeError(f"expects {count} argument{plural}, got {len(arg_types)}", op_name=op_name)


def expect_tensor(ty: Type, op_name: str, what: str = "argument") -> TensorType:
    if not isinstance(ty, TensorType):
        raise RelayTypeError(f"{what} must be a tensor, got {ty}", op_name=op_name)
    return ty


def expect_tensor_tuple(ty: Type, op_name: str) -> tuple[TensorType, ...]:
    """The single tuple argument of concatenate/stack: a non-empty tuple of tensors."""
    if not isinstance(ty, TupleType):
        raise RelayTypeError(f"expects a tuple of tensors as its argument, got {ty}", op_name=op_name)
    if not ty.fields:
        raise RelayTypeError("expects a non-empty tuple of tensors, got ()", op_name=op_name)
    return tuple(expect_tensor(f, op_name, f"tuple field {i}") for i, f in enumerate(ty.fields))


def same_dtype(types: Sequence[TensorType], op_name: str) -> str:
    """All operands share one dtype (Relay never promotes implicitly); the message names them."""
    first = types[0].dtype
    for t in types[1:]:
        if t.dtype != first:
            names = " vs ".join(x.dtype for x in types)
            raise RelayTypeError(f"operand dtypes differ: {names} (no implicit type promotion)", op_name=op_name)
    return first


# --------------------------------------------------------------------------------------------
# data layouts ("NCHW", "NHWC", "NCHW8c", "OIHW8i8o", ...)
# --------------------------------------------------------------------------------------------

_LAYOUT_TOKEN = re.compile(r"(\d*)([A-Za-z])")


@dataclass(frozen=True, slots=True)
class LayoutAxis:
    """One axis of a layout: a primal axis `C` (factor None) or a subordinate `8c` (factor 8)."""

    name: str  # always the upper-case primal letter
    factor: int | None = None

    @property
    def is_primal(self) -> bool:
        return self.factor is None

    def __str__(self) -> str:
        return self.name if self.factor is None else f"{self.factor}{self.name.lower()}"


@dataclass(frozen=True, slots=True)
class Layout:
    """A parsed layout string.

    Upper-case letters are primal axes; `<factor><lower-case letter>` is a subordinate axis that
    splits its primal axis into blocks of `factor` (the primal axis then counts blocks). So
    "NCHW8c" holds logical channel `c` at `[.., c // 8, .., .., c % 8]`.
    """

    axes: tuple[LayoutAxis, ...]

    @staticmethod
    def parse(text: str, op_name: str | None = None) -> Layout:
        if not isinstance(text, str) or not text:
            raise RelayTypeError(f"invalid layout {text!r}: expected a non-empty string like 'NCHW'", op_name=op_name)
        axes: list[LayoutAxis] = []
        pos = 0
        for m in _LAYOUT_TOKEN.finditer(text):
            if m.start() != pos:
                break
            pos = m.end()
            digits, letter = m.group(1), m.group(2)
            if letter.isupper():
                if digits:
                    raise RelayTypeError(
                        f"invalid layout {text!r}: primal axis {letter} cannot have a factor", op_name=op_name
                    )
                axes.append(LayoutAxis(letter))
            else:
                if not digits or int(digits) <= 0:
                    raise RelayTypeError(
                        f"invalid layout {text!r}: subordinate axis {letter} needs a positive factor (e.g. 8{letter})",
                        op_name=op_name,
                    )
                axes.append(LayoutAxis(letter.upper(), int(digits)))
        if pos != len(text):
            raise RelayTypeError(f"invalid layout {text!r}: unexpected character at position {pos}", op_name=op_name)
        primal_seen: set[str] = set()
        sub_seen: set[str] = set()
        for ax in axes:
            seen = primal_seen if ax.is_primal else sub_seen
            if ax.name in seen:
                raise RelayTypeError(f"invalid layout {text!r}: axis {ax} appears twice", op_name=op_name)
            seen.add(ax.name)
        orphans = sorted(sub_seen - primal_seen)
        if orphans:
            raise RelayTypeError(
                f"invalid layout {text!r}: subordinate axis without its primal axis ({', '.join(orphans)})",
                op_name=op_name,
            )
        return Layout(tuple(axes))

    def __str__(self) -> str:
        return "".join(str(a) for a in self.axes)

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def primal_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes if a.is_primal)

    def primal_index(self, name: str) -> int:
        """Position of primal axis `name`; ValueError if absent."""
        for i, a in enumerate(self.axes):
            if a.is_primal and a.name == name:
                return i
        raise ValueError(f"layout {self} has no axis {name}")

    def sub_index(self, name: str) -> int | None:
        for i, a in enumerate(self.axes):
            if not a.is_primal and a.name == name:
                return i
        return None

    def factor_of(self, name: str) -> int | None:
        """The block factor of primal axis `name` (None when it is not split)."""
        i = self.sub_index(name)
        return None if i is None else self.axes[i].factor

    def logical_shape(self, shape: Sequence[Dim], op_name: str | None = None) -> dict[str, Dim]:
        """The unblocked extent of each primal axis of a tensor stored in this layout."""
        if len(shape) != self.ndim:
            raise RelayTypeError(
                f"layout {self} has {self.ndim} axes but the tensor has shape {format_shape(shape)}",
                op_name=op_name,
            )
        extents: dict[str, Dim] = {}
        for name in self.primal_names:
            outer = shape[self.primal_index(name)]
            factor = self.factor_of(name)
            if factor is None:
                extents[name] = outer
                continue
            inner = shape[self.sub_index(name)]  # type: ignore[index]
            if isinstance(inner, int) and inner != factor:
                raise RelayTypeError(
                    f"tensor of shape {format_shape(shape)} does not match layout {self}: "
                    f"axis {factor}{name.lower()} has extent {inner}",
                    op_name=op_name,
                )
            extents[name] = prod((outer, factor))
        return extents

    def physical_shape(self, extents: dict[str, Dim], op_name: str | None = None) -> tuple[Dim, ...]:
        """The shape a tensor with these logical extents has in this layout (split axes must divide)."""
        out: list[Dim] = []
        for ax in self.axes:
            if not ax.is_primal:
                out.append(ax.factor)  # type: ignore[arg-type]
                continue
            extent = extents[ax.name]
            factor = self.factor_of(ax.name)
            if factor is None or isinstance(extent, AnyDim):
                out.append(extent)
            elif extent % factor != 0:
                raise RelayTypeError(
                    f"axis {ax.name} of extent {extent} cannot be split into blocks of {factor} for layout {self}",
                    op_name=op_name,
                )
            else:
                out.append(extent // factor)
        return tuple(out)


def layout_transform_shape(
    shape: Sequence[Dim], src: Layout, dst: Layout, op_name: str | None = None
) -> tuple[Dim, ...]:
    """Shape of a tensor of `shape` in layout `src` once re-laid out as `dst`."""
    if sorted(src.primal_names) != sorted(dst.primal_names):
        raise RelayTypeError(
            f"cannot transform layout {src} to {dst}: they do not have the same primal axes", op_name=op_name
        )
    return dst.physical_shape(src.logical_shape(shape, op_name), op_name)
