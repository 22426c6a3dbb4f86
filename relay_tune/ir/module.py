"""A module: an ordered, immutable collection of global functions (`def @name ...`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from relay_tune.ir.expr import Function, GlobalVar, structural_equal


class IRModule(Mapping[str, Function]):
    """Global functions by name. Operations return new modules; the original is never changed."""

    __slots__ = ("_functions",)

    def __init__(self, functions: Mapping[str, Function] | None = None) -> None:
        self._functions: dict[str, Function] = dict(functions or {})

    @staticmethod
    def from_expr(func: Function, name: str = "main") -> IRModule:
        return IRModule({name: func})

    def __getitem__(self, name: str | GlobalVar) -> Function:
        key = name.name if isinstance(name, GlobalVar) else name
        try:
            return self._functions[key]
        except KeyError:
            raise KeyError(f"module has no global function @{key}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)

    @property
    def main(self) -> Function:
        return self["main"]

    def with_function(self, name: str, func: Function) -> IRModule:
        functions = dict(self._functions)
        functions[name] = func
        return IRModule(functions)

    def map_functions(self, fn: Callable[[str, Function], Function]) -> IRModule:
        return IRModule({name: fn(name, f) for name, f in self._functions.items()})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IRModule):
            return NotImplemented
        if set(self._functions) != set(other._functions):
            return False
        return all(structural_equal(f, other._functions[n]) for n, f in self._functions.items())

    def __hash__(self) -> int:
        return hash(tuple(sorted((n, hash(f)) for n, f in self._functions.items())))

    def __repr__(self) -> str:
        return f"IRModule({', '.join('@' + n for n in self._functions)})"
