"""Relay types: tensors (static or `?` dimensions), tuples, functions, type variables.

Types are small immutable values; dataclass equality is structural and exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay_tune.ir.dtypes import LOW_PRECISION_DTYPES, ml_dtypes_module


class AnyDim:
    """A dynamic dimension, written `?` in the text format.

    There is exactly one instance, `ANY`. Two `?` dimensions compare equal (they are the same
    unknown-size marker), which is the structural notion the printer/parser round trip needs.
    """

    _instance: AnyDim | None = None

    def __new__(cls) -> AnyDim:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (AnyDim, ())


ANY = AnyDim()

Dim = int | AnyDim


class Type:
    """Base class of all Relay types."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class TensorType(Type):
    """`Tensor[(d0, d1, ...), dtype]`; a scalar has shape `()`."""

    shape: tuple[Dim, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.dtype in LOW_PRECISION_DTYPES:  # arrays of this type are ml_dtypes arrays
            ml_dtypes_module()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape as integers; only defined for static shapes."""
        dims = tuple(d for d in self.shape if isinstance(d, int))
        if len(dims) != len(self.shape):
            raise ValueError(f"static shape of a tensor type with a dynamic dimension: {self}")
        return dims

    @property
    def size(self) -> int:
        """Number of elements; only defined for static shapes."""
        n = 1
        for d in self.shape:
            if not isinstance(d, int):
                raise ValueError(f"size of a tensor type with a dynamic dimension: {self}")
            n *= d
        return n

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype
        dims = ", ".join("?" if isinstance(d, AnyDim) else str(d) for d in self.shape)
        return f"Tensor[({dims}), {self.dtype}]"


@dataclass(frozen=True, slots=True)
class TupleType(Type):
    fields: tuple[Type, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    def __str__(self) -> str:
        if len(self.fields) == 1:
            return f"({self.fields[0]},)"
        return "(" + ", ".join(str(f) for f in self.fields) + ")"


@dataclass(frozen=True, slots=True)
class TypeVar(Type):
    """A type parameter of a polymorphic function (`def @id[A](%x: A) -> A`)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class FuncType(Type):
    arg_types: tuple[Type, ...]
    ret_type: Type
    type_params: tuple[TypeVar, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "arg_types", tuple(self.arg_types))
        object.__setattr__(self, "type_params", tuple(self.type_params))

    def __str__(self) -> str:
        args = ", ".join(str(a) for a in self.arg_types)
        return f"fn ({args}) -> {self.ret_type}"


@dataclass(frozen=True, slots=True)
class DataType(Type):
    """An algebraic data type applied to its type arguments (`List[float32]`); its constructors are in the
    `TypeDef` of the same name (`relay_tune.ir.expr.TypeDef`), which every `Constructor` node carries."""

    name: str
    args: tuple[Type, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))

    def __str__(self) -> str:
        return f"{self.name}[{', '.join(str(a) for a in self.args)}]" if self.args else self.name


@dataclass(frozen=True, slots=True, eq=False)
class IncompleteType(Type):
    """`_`: a placeholder that type inference must resolve. Each instance is a distinct unknown."""

    hint: str = field(default="")

    def __str__(self) -> str:
        return "_"


def scalar_type(dtype: str) -> TensorType:
    return TensorType((), dtype)


def tuple_type_of(*fields: Type) -> TupleType:
    return TupleType(tuple(fields))
