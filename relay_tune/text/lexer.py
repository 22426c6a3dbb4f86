"""Tokenizer for the Relay text format.

The lexer turns the whole source into a list of `Token`s up front (the parser needs two tokens of
lookahead and random access for error positions). Whitespace and `//` comments are dropped; block
comments (`/* ... */`, which nest) are dropped too, except that those of the form `/* ty=... */`
are remembered, keyed by the index of the token that follows them, because the printer writes the
inferred type of a bound expression that way and callers may want those annotations back.

Positions are character offsets; `SourceText.location` turns them into 1-based line/column pairs.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from relay_tune.errors import ParseError

# Token kinds. Plain strings keep token dumps readable in test failures.
IDENT = "ident"  # plain or dotted identifier: `add`, `nn.conv2d`, `Tensor`, `relay.reshape_only`
LOCAL = "local"  # `%x`        (value: the name without `%`)
GRAPH = "graph"  # `%12`       (value: the number as int)
GLOBAL = "global"  # `@main`   (value: the name without `@`)
NUMBER = "number"  # `1`, `2i64`, `1e-05f`, `inff` (value: the literal text; the parser interprets it)
STRING = "string"  # `"NCHW"`  (value: the text between the quotes, no escapes)
BOOL = "bool"  # `True` / `False` (value: bool)
META = "meta"  # `meta[relay.Constant][3]` (value: (type_key, index))
KEYWORD = "keyword"  # value: the keyword text
VERSION = "version"  # `#[version = "0.0.5"]` (value: the text after `=`, quotes included)
METADATA = "metadata"  # `#[metadata]` (value: the rest of the file)
PUNCT = "punct"  # value: the punctuation text, e.g. `(`, `->`, `<=`
EOF = "eof"

KEYWORDS = frozenset(
    {"let", "fn", "def", "if", "else", "type", "match", "extern", "free_var", "ref", "ref_read", "ref_write"}
)

_IDENT_PART = r"[A-Za-z_][A-Za-z0-9_/]*"

# One alternative per token class; the first that matches at the current position wins, so the
# order matters: `meta[` before identifiers, `%digits` before `%name`, two-char operators first.
_TOKEN_RE = re.compile(
    rf"""
    (?P<ws>(?:[ \t\n]|\r\n)+)
  | (?P<lcomment>//[^\n]*)
  | (?P<bcomment>/\*)
  | (?P<graph>%[0-9]+)
  | (?P<local>%{_IDENT_PART})
  | (?P<global>@{_IDENT_PART})
  | (?P<meta>meta\[)
  | (?P<ident>{_IDENT_PART}(?:\.{_IDENT_PART})*)
  | (?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?(?:[fi][0-9]*)?)
  | (?P<string>"[^"]*")
  | (?P<hash>\#\[)
  | (?P<punct>->|<=|>=|==|!=|=>|[()\[\]{{}},;:.=?*/+\-<>])
    """,
    re.VERBOSE,
)
_INT_RE = re.compile(r"[0-9]+")
_META_RE = re.compile(r"meta\[([A-Za-z_][A-Za-z0-9_.]*)\]\[([0-9]{1,18})\]")
_VERSION_RE = re.compile(r"\#\[[ \t]*version[ \t]*=[ \t]*([^\]\n]*?)[ \t]*\]")
_METADATA_RE = re.compile(r"\#\[[ \t]*metadata[ \t]*\]")
_COMMENT_DELIM_RE = re.compile(r"/\*|\*/")
_SPECIAL_FLOAT_RE = re.compile(r"(?:inf|nan)f(?:16|32|64)?")
_IDENT_CHAR_RE = re.compile(r"[A-Za-z0-9_]")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    value: Any  # depends on `kind`; see the kind constants above
    start: int  # offset of the first character
    end: int  # offset one past the last character

    def describe(self) -> str:
        """How the token is named in error messages."""
        if self.kind == EOF:
            return "end of input"
        if self.kind == METADATA:
            return "`#[metadata]`"
        if self.kind == VERSION:
            return "the version header"
        if self.kind == LOCAL:
            return f"`%{self.value}`"
        if self.kind == GRAPH:
            return f"`%{self.value}`"
        if self.kind == GLOBAL:
            return f"`@{self.value}`"
        if self.kind == STRING:
            return f'string "{self.value}"'
        if self.kind == META:
            key, index = self.value
            return f"`meta[{key}][{index}]`"
        if self.kind == BOOL:
            return f"`{self.value}`"
        return f"`{self.value}`"


class SourceText:
    """The text being parsed plus the line table used to report positions."""

    def __init__(self, text: str, source_name: str) -> None:
        self.text = text
        self.source_name = source_name
        self._line_starts = [0]
        self._line_starts.extend(m.end() for m in re.finditer("\n", text))

    def location(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        line_index = bisect.bisect_right(self._line_starts, offset) - 1
        return line_index + 1, offset - self._line_starts[line_index] + 1

    def line_text(self, line: int) -> str:
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]

    def error(self, message: str, offset: int) -> ParseError:
        line, column = self.location(offset)
        return ParseError(message, self.source_name, line, column, self.line_text(line))

    def fail(self, message: str, offset: int) -> NoReturn:
        raise self.error(message, offset)


@dataclass(frozen=True, slots=True)
class TypeComment:
    """A `/* ty=... */` comment: the text after `ty=` and where that text starts."""

    text: str
    offset: int


def tokenize(source: SourceText) -> tuple[list[Token], dict[int, TypeComment]]:
    """All tokens of `source` (ending with an EOF token) and the `ty=` comments by following token."""
    text = source.text
    tokens: list[Token] = []
    type_comments: dict[int, TypeComment] = {}
    pos = 0
    length = len(text)
    match_token = _TOKEN_RE.match
    while pos < length:
        # A `.` makes the next number a tuple index, so `%t.0.1` is two projections, not `%t` `.` `0.1`.
        if tokens and tokens[-1].kind == PUNCT and tokens[-1].value == "." and "0" <= text[pos] <= "9":
            m = _INT_RE.match(text, pos)
            assert m is not None
            tokens.append(Token(NUMBER, m.group(), pos, m.end()))
            pos = m.end()
            continue
        m = match_token(text, pos)
        if m is None:
            _bad_character(source, pos)
        kind = m.lastgroup
        end = m.end()
        if kind == "ws" or kind == "lcomment":
            pos = end
            continue
        if kind == "bcomment":
            pos = _skip_block_comment(source, pos, len(tokens), type_comments)
            continue
        word = m.group()
        if kind == "ident":
            if word in KEYWORDS:
                tokens.append(Token(KEYWORD, word, pos, end))
            elif word == "True" or word == "False":
                tokens.append(Token(BOOL, word == "True", pos, end))
            elif _SPECIAL_FLOAT_RE.fullmatch(word):
                tokens.append(Token(NUMBER, word, pos, end))
            else:
                tokens.append(Token(IDENT, word, pos, end))
        elif kind == "punct":
            tokens.append(Token(PUNCT, word, pos, end))
        elif kind == "local":
            tokens.append(Token(LOCAL, word[1:], pos, end))
        elif kind == "graph":
            digits = word[1:]
            if len(digits) > 18:
                source.fail(f"graph variable number `{word}` is too large", pos)
            tokens.append(Token(GRAPH, int(digits), pos, end))
        elif kind == "global":
            tokens.append(Token(GLOBAL, word[1:], pos, end))
        elif kind == "number":
            if end < length and _IDENT_CHAR_RE.match(text, end):
                tail = re.match(r"[A-Za-z0-9_.]*", text[end:])
                bad = word + (tail.group() if tail else "")
                source.fail(f"invalid number literal `{bad}`", pos)
            tokens.append(Token(NUMBER, word, pos, end))
        elif kind == "string":
            tokens.append(Token(STRING, word[1:-1], pos, end))
        elif kind == "meta":
            mm = _META_RE.match(text, pos)
            if mm is None:
                source.fail("malformed meta reference: expected `meta[TypeKey][index]`", pos)
            end = mm.end()
            tokens.append(Token(META, (mm.group(1), int(mm.group(2))), pos, end))
        elif kind == "hash":
            vm = _VERSION_RE.match(text, pos)
            if vm is not None:
                end = vm.end()
                tokens.append(Token(VERSION, vm.group(1), pos, end))
            elif _METADATA_RE.match(text, pos):
                # Everything after `#[metadata]` is an opaque object-graph blob, not Relay text.
                tokens.append(Token(METADATA, text[pos:], pos, length))
                end = length
            else:
                source.fail('unsupported file attribute: only `#[version = "0.0.5"]` and `#[metadata]` exist', pos)
        else:  # pragma: no cover - every group of _TOKEN_RE is handled above
            raise AssertionError(kind)
        pos = end
    tokens.append(Token(EOF, None, length, length))
    return tokens, type_comments


def _skip_block_comment(source: SourceText, start: int, next_token: int, type_comments: dict[int, TypeComment]) -> int:
    """Skip a (nested) block comment starting at `start`; return the offset after it."""
    text = source.text
    depth = 0
    pos = start
    while True:
        m = _COMMENT_DELIM_RE.search(text, pos)
        if m is None:
            source.fail("unterminated block comment (missing `*/`)", start)
        depth += 1 if m.group() == "/*" else -1
        pos = m.end()
        if depth == 0:
            break
    body_start = start + 2
    body = text[body_start : pos - 2]
    stripped = body.lstrip()
    if stripped.startswith("ty="):
        offset = body_start + (len(body) - len(stripped)) + 3
        type_comments[next_token] = TypeComment(stripped[3:], offset)
    return pos


def _bad_character(source: SourceText, pos: int) -> NoReturn:
    text = source.text
    ch = text[pos]
    if ch == "\r":
        source.fail("a carriage return must be followed by a newline", pos)
    if ch == '"':
        source.fail('unterminated string literal (missing closing `"`)', pos)
    if ch == "%":
        source.fail("expected a variable name or number after `%`", pos)
    if ch == "@":
        source.fail("expected a global name after `@`", pos)
    if ch == "#":
        source.fail("`#` must start a file attribute such as `#[version = \"0.0.5\"]`", pos)
    if ch == "!":
        source.fail("unexpected `!` (did you mean `!=`?)", pos)
    if ch.isprintable() and not ch.isspace():
        source.fail(f"unexpected character `{ch}`", pos)
    source.fail(f"unexpected character U+{ord(ch):04X}", pos)
