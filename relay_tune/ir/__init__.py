"""The Relay intermediate representation: types, expressions, modules and traversals."""

from relay_tune.ir.attrs import EMPTY_ATTRS, Attrs
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
    PatternWildcard,
    Tuple,
    TupleGetItem,
    TypeDef,
    Var,
    const,
    op,
    pattern_vars,
    structural_equal,
    structural_hash,
)
from relay_tune.ir.module import IRModule
from relay_tune.ir.span import Span
from relay_tune.ir.traversal import free_vars, post_order, pre_order, rewrite, substitute
from relay_tune.ir.types import (
    ANY,
    AnyDim,
    DataType,
    FuncType,
    IncompleteType,
    TensorType,
    TupleType,
    Type,
    TypeVar,
    scalar_type,
)

__all__ = [
    "ANY", "AnyDim", "Attrs", "Call", "Constant", "Constructor", "DataType", "EMPTY_ATTRS", "Match", "Pattern",
    "PatternConstructor", "PatternTuple", "PatternVar", "PatternWildcard", "TypeDef", "pattern_vars", "Expr",
    "FuncType", "Function",
    "GlobalVar", "IRModule", "If", "IncompleteType", "Let", "Op", "Span", "TensorType", "Tuple",
    "TupleGetItem", "TupleType", "Type", "TypeVar", "Var", "const", "free_vars", "op",
    "post_order", "pre_order", "rewrite", "scalar_type", "structural_equal", "structural_hash",
    "substitute",
]
