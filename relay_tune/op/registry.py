"""The operator registry: one entry per operator holds everything the compiler knows about it.

An `OpDef` gathers, in one place,
- the attribute schema (names, defaults, the TVM attrs type key used by the text format),
- the pattern kind used by operator fusion,
- the type relation (input types + attrs -> output type),
- the numpy reference implementation (the correctness oracle),
- the tensor-expression compute used by the kernel layer (added by the kernel layer).

Operators are declared with `register_op(...)` in the family modules (`nn.py`, `elemwise.py`,
`reduce.py`, `transform.py`) and their rules attached with the `@type_relation`, `@reference` and
`@compute` decorators next to the declaration. The package `relay_tune.op` imports the family modules, and
Python imports a package before any of its modules, so the registry is complete whenever it is reachable; the
registry itself imports no family (they import it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from relay_tune.errors import RelayTypeError, UnknownOperatorError
from relay_tune.ir.attrs import Attrs, _typed_key, freeze_attr_value
from relay_tune.ir.types import Type


class OpPattern(IntEnum):
    """Operator pattern kinds, ordered so that combining two patterns takes the max."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


TypeRelation = Callable[[Sequence[Type], Attrs], Type]
"""Maps the argument types and the call's attrs to the result type; raises `RelayTypeError`."""

ReferenceImpl = Callable[[Sequence[np.ndarray], Attrs], Any]
"""Maps numpy inputs and attrs to a numpy array (or a tuple of arrays for tuple results)."""


@dataclass
class OpDef:
    name: str
    num_inputs: int | None  # None: variadic
    attr_defaults: dict[str, Any] = field(default_factory=dict)
    attrs_type_key: str | None = None
    pattern: OpPattern = OpPattern.OPAQUE
    description: str = ""
    required_attrs: tuple[str, ...] = ()
    # Attributes added after tuning logs keyed the operator without them: left out of workload keys while at
    # their defaults, so that existing records still match (`passes.extract_tasks.canonical_text`).
    unkeyed_defaults: tuple[str, ...] = ()
    type_relation: TypeRelation | None = None
    reference: ReferenceImpl | None = None
    compute: Callable[..., Any] | None = None

    def make_attrs(self, given: Mapping[str, Any] | None = None) -> Attrs:
        """Attrs with defaults filled in; unknown keys are an error."""
        given = dict(given or {})
        unknown = [k for k in given if k not in self.attr_defaults]
        if unknown:
            known = ", ".join(self.attr_defaults) or "none"
            raise RelayTypeError(
                f"unknown attribute(s) {', '.join(unknown)} (accepted: {known})", op_name=self.name
            )
        missing = [k for k in self.required_attrs if given.get(k) is None]
        if missing:
            raise RelayTypeError(f"missing required attribute(s) {', '.join(missing)}", op_name=self.name)
        values = dict(self.attr_defaults)
        values.update(given)
        return Attrs(values)

    def keyed_attrs(self, attrs: Attrs) -> list[str]:
        """The attribute names a workload key includes: all but `unkeyed_defaults` at their defaults."""
        shown = self.non_default_attrs(attrs)
        return [k for k in attrs if k not in self.unkeyed_defaults or k in shown]

    def non_default_attrs(self, attrs: Attrs) -> dict[str, Any]:
        """The attributes a printer needs to write: those that differ from the defaults."""
        out: dict[str, Any] = {}
        for key, value in attrs.items():
            default = freeze_attr_value(self.attr_defaults.get(key, _MISSING))
            if key not in self.attr_defaults or _typed_key(value) != _typed_key(default):
                out[key] = value
        return out


_MISSING = "<missing>"

_REGISTRY: dict[str, OpDef] = {}


def register_op(
    name: str,
    num_inputs: int | None,
    pattern: OpPattern,
    attrs: Mapping[str, Any] | None = None,
    attrs_type_key: str | None = None,
    required: Sequence[str] = (),
    description: str = "",
    unkeyed_defaults: Sequence[str] = (),
) -> OpDef:
    if name in _REGISTRY:
        raise ValueError(f"operator {name} registered twice")
    opdef = OpDef(
        name=name,
        num_inputs=num_inputs,
        attr_defaults={k: freeze_attr_value(v) for k, v in (attrs or {}).items()},
        attrs_type_key=attrs_type_key,
        pattern=pattern,
        description=description,
        required_attrs=tuple(required),
        unkeyed_defaults=tuple(unkeyed_defaults),
    )
    _REGISTRY[name] = opdef
    return opdef


def _attach(kind: str, names: Sequence[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in names:
            opdef = get_op(n)
            if getattr(opdef, kind) is not None:
                raise ValueError(f"{kind} of {n} given twice")
            setattr(opdef, kind, fn)
        return fn

    return decorator


def type_relation(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return _attach("type_relation", names)


def reference(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return _attach("reference", names)


def compute(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return _attach("compute", names)


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownOperatorError(name) from None


def has_op(name: str) -> bool:
    return name in _REGISTRY


def all_ops() -> list[OpDef]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]
