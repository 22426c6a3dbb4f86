"""Storage planning while the graph is walked: values (typed views), the storages that hold them (model inputs,
constants, intermediates) and the first and last step that touches each storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay_tune.runtime.model import Value


@dataclass
class StorageDraft:
    """A storage before placement: what it holds, its size, and the steps it is live between."""

    kind: str  # "input" | "constant" | "intermediate" (arena or output, decided at the end)
    index: int
    nbytes: int
    first: int = -1
    last: int = -1


@dataclass(kw_only=True)
class StoragePlan:
    """Values and storages recorded so far, with constants kept once per (constant, packing)."""

    values: list[Value] = field(default_factory=list)
    storages: list[StorageDraft] = field(default_factory=list)
    constants: list[np.ndarray] = field(default_factory=list)
    constant_ids: dict[tuple[int, str], int] = field(default_factory=dict)  # (id(Constant), packing) -> value
    keep: list[Any] = field(default_factory=list)  # constants whose ids are keys of constant_ids

    def new_value(self, shape: tuple[int, ...], dtype: str, storage: int) -> int:
        self.values.append(Value(tuple(int(d) for d in shape), dtype, storage))
        return len(self.values) - 1

    def new_storage(self, kind: str, index: int, nbytes: int) -> int:
        self.storages.append(StorageDraft(kind, index, nbytes))
        return len(self.storages) - 1

    def constant(self, array: np.ndarray, key: tuple[int, str]) -> int:
        """The value of constant `array` (one per `key`: the constant's id and how it is packed)."""
        found = self.constant_ids.get(key)
        if found is not None:
            return found
        array = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes a scalar 1-D
        storage = self.new_storage("constant", len(self.constants), array.nbytes)
        self.constants.append(array)
        value = self.new_value(array.shape, str(array.dtype), storage)
        self.constant_ids[key] = value
        return value

    def intermediate(self, shape: tuple[int, ...], dtype: str) -> int:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        storage = self.new_storage("intermediate", -1, nbytes)
        return self.new_value(shape, dtype, storage)

    def read(self, value: int, step: int) -> None:
        draft = self.storages[self.values[value].storage]
        draft.last = max(draft.last, step)

    def wrote(self, value: int, step: int) -> None:
        draft = self.storages[self.values[value].storage]
        draft.first = step if draft.first < 0 else min(draft.first, step)
        draft.last = max(draft.last, step)
