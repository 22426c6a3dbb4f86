"""Immutable attribute dictionaries for operator calls and functions.

Attribute values are plain data: int, float, bool, str, None, an `AnyDim`, or (nested) tuples of
those. Lists given by callers are frozen into tuples so that attributes hash and compare by value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from relay_tune.ir.types import AnyDim

AttrValue = Any  # int | float | bool | str | None | AnyDim | tuple[AttrValue, ...]


def freeze_attr_value(value: Any) -> AttrValue:
    """Turn lists (possibly nested) into tuples and numpy scalars into Python scalars."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr_value(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str, AnyDim)):
        return value
    # numpy scalars and 0-d arrays
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"unsupported attribute value {value!r} of type {type(value).__name__}")


def _typed_key(value: AttrValue) -> Any:
    """A comparison key that keeps `1`, `1.0` and `True` apart (they print differently)."""
    if isinstance(value, tuple):
        return ("tuple", tuple(_typed_key(v) for v in value))
    return (type(value).__name__, value)


class Attrs(Mapping[str, AttrValue]):
    """A frozen, hashable mapping of attribute names to values."""

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(items or {})
        merged.update(kwargs)
        self._items: dict[str, AttrValue] = {k: freeze_attr_value(v) for k, v in merged.items()}
        self._hash: int | None = None

    def __getitem__(self, key: str) -> AttrValue:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def _key(self) -> tuple[Any, ...]:
        return tuple(sorted((k, _typed_key(v)) for k, v in self._items.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Attrs):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._key())
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items.items())
        return f"Attrs({inner})"

    def with_updates(self, **updates: Any) -> Attrs:
        merged = dict(self._items)
        merged.update(updates)
        return Attrs(merged)

    def as_dict(self) -> dict[str, AttrValue]:
        return dict(self._items)


EMPTY_ATTRS = Attrs()
