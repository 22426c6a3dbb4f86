"""User-facing errors. The CLI prints these as one clear message (never a traceback).

Every error a user can cause with their input derives from `RelayTuneError`.
"""

from __future__ import annotations

from relay_tune.ir.span import Span

SHOWN_LINE_CHARS = 160  # longest source line a ParseError prints whole


class RelayTuneError(Exception):
    """Base class of errors caused by the user's input or environment."""


class ParseError(RelayTuneError):
    """A syntax error in Relay text, located by file, line and column.

    `str(err)` shows the message, the offending source line and a caret under the column.
    """

    def __init__(
        self, message: str, source_name: str, line: int, column: int, source_line: str | None = None
    ) -> None:
        self.message = message
        self.source_name = source_name
        self.line = line
        self.column = column
        self.source_line = source_line
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.source_name}:{self.line}:{self.column}: error: {self.message}"
        if self.source_line is not None:
            line = self.source_line.rstrip("\n").replace("\t", " ")
            column = max(self.column - 1, 0)
            if len(line) > SHOWN_LINE_CHARS:  # a minified or binary "line": show a window around the column
                start = max(0, min(column - SHOWN_LINE_CHARS // 2, len(line) - SHOWN_LINE_CHARS))
                shown = line[start : start + SHOWN_LINE_CHARS]
                line = ("..." if start else "") + shown + ("..." if start + SHOWN_LINE_CHARS < len(line) else "")
                column = column - start + (3 if start else 0)
            line = "".join(c if c.isprintable() else "?" for c in line)  # control bytes would garble the terminal
            gutter = f"{self.line} | "
            caret_pad = " " * (len(gutter) + column)
            text += f"\n{gutter}{line}\n{caret_pad}^"
        return text


class RelayTypeError(RelayTuneError):
    """A shape/dtype error found by type inference; names the call and where it is."""

    def __init__(self, message: str, span: Span | None = None, op_name: str | None = None) -> None:
        self.message = message
        self.span = span
        self.op_name = op_name
        where = f"{span}: " if span is not None else ""
        call = f"in call to `{op_name}`: " if op_name else ""
        super().__init__(f"{where}type error: {call}{message}")


class UnknownOperatorError(RelayTuneError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"operator `{name}` is not registered (unknown operator)")


class UnsupportedError(RelayTuneError):
    """A valid program that uses a feature relay-tune does not support (yet)."""


class CompileError(RelayTuneError):
    """Code generation failed for a kernel or model."""


def raised_by_interrupt(err: BaseException) -> bool:
    """Whether `err` was raised while a KeyboardInterrupt was being handled (a library's clean-up that failed
    half-way through, as Optuna's journal lock did): then the user's Ctrl-C, not this error, is what happened."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
