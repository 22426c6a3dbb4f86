"""Source locations carried by IR nodes, for error messages."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """A position in a source file: 1-based line and column of the first character."""

    source_name: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.source_name}:{self.line}:{self.column}"
