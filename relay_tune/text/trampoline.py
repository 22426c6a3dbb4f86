"""Run generator-based recursive routines on an explicit stack.

Both the parser and the printer walk structures whose depth is controlled by the input (nested
parentheses, chains of nested calls). Writing those walks as generators that *yield* the sub-walk
they need and receive its result keeps the code shaped like ordinary recursive descent while the
depth lives in a Python list, so it is limited by memory instead of the interpreter's recursion limit.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")

Steps = Generator[Any, Any, T]
"""A routine for `drive`: it yields sub-routines and is sent back each one's return value."""


def drive(root: Steps[T]) -> T:
    """Run `root` to completion, running every sub-routine it yields first."""
    stack: list[Steps[Any]] = [root]
    value: Any = None
    while True:
        try:
            request = stack[-1].send(value)
        except StopIteration as done:
            stack.pop()
            if not stack:
                return done.value
            value = done.value
            continue
        stack.append(request)
        value = None
