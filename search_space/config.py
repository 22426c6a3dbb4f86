"""`Config`: one point of a search space, as plain JSON-able data.

A config maps knob names to values (ints, floats, strings, bools, None, or tuples of those). It is frozen and
hashable, and its `key` is a stable digest of its canonical JSON text, so the same point gets the same key in every
process, on every machine and in every tuning log (Python's own `hash()` is salted per process and cannot be used).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, TypeAlias

from relay_tune.errors import RelayTuneError

# A knob value as stored in a config: JSON scalars and (nested) tuples of them.
ConfigValue: TypeAlias = "bool | int | float | str | tuple[ConfigValue, ...] | None"
# The same value as it appears in JSON (tuples become lists).
JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | None"


class InvalidConfigError(RelayTuneError):
    """A config that is not a point of its space, or that a schedule template rejects before compiling."""


def freeze_value(value: Any) -> ConfigValue:
    """Normalise a JSON-like value to its frozen form (lists become tuples); reject anything not JSON-able."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidConfigError(f"config values must be finite numbers, got {value!r}")
        return value
    if isinstance(value, list | tuple):
        return tuple(freeze_value(item) for item in value)
    # numpy scalars sneak in from samplers; accept them as their Python equivalents.
    item = getattr(value, "item", None)
    if callable(item):
        return freeze_value(item())
    raise InvalidConfigError(f"config values must be JSON scalars or lists, got {type(value).__name__}: {value!r}")


def thaw_value(value: ConfigValue) -> JSONValue:
    """The JSON form of a frozen value (tuples become lists)."""
    if isinstance(value, tuple):
        return [thaw_value(item) for item in value]
    return value


class Config(Mapping[str, ConfigValue]):
    """A frozen mapping knob name -> value, in knob order, with a stable `key`."""

    __slots__ = ("_canonical", "_items", "_key")

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        frozen: dict[str, ConfigValue] = {}
        for name, value in (items or {}).items():
            if not isinstance(name, str):
                raise InvalidConfigError(f"config knob names must be strings, got {name!r}")
            frozen[name] = freeze_value(value)
        self._items = frozen
        self._canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        self._key = hashlib.sha256(self._canonical.encode()).hexdigest()[:20]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        return cls(data)

    def to_dict(self) -> dict[str, JSONValue]:
        """JSON-ready dict (tuples become lists), in knob order."""
        return {name: thaw_value(value) for name, value in self._items.items()}

    @property
    def key(self) -> str:
        """Stable digest of the canonical JSON text: equal configs have equal keys everywhere."""
        return self._key

    @property
    def canonical_json(self) -> str:
        return self._canonical

    def replace(self, **changes: Any) -> Config:
        items: dict[str, Any] = dict(self._items)
        items.update(changes)
        return Config(items)

    def __getitem__(self, name: str) -> ConfigValue:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self._canonical == other._canonical

    def __hash__(self) -> int:
        return hash(self._canonical)

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={value!r}" for name, value in self._items.items())
        return f"Config({body})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Config, (self.to_dict(),))


def config_key(config: Config | Mapping[str, Any]) -> str:
    """The stable key of a config (or of a plain dict describing one)."""
    if not isinstance(config, Config):
        config = Config(config)
    return config.key
