"""Parser for the Relay text format (TVM's `0.0.5` dialect) into `relay_tune.ir`.

Design notes:
- Expressions are parsed by generator functions run on an explicit stack (`trampoline.drive`): a parsing
  routine that needs a sub-expression *yields* the sub-parser and receives its result. Nesting depth
  is therefore bounded by memory, not by Python's recursion limit, so `((((...` ten thousand deep
  or long chains of nested calls parse (or fail with a ParseError) without a RecursionError.
- Types and attribute values are parsed by plain recursion with a small depth limit: their IR
  classes compare and hash recursively, so absurdly deep ones are rejected with a clear message.
- Sequences of bindings (`%3 = ...;`, `let %x = ...;`) are consumed by a loop and the `Let` nodes
  are assembled afterwards, so a 10,000-binding body costs no stack either.
- Local variables live in one dictionary with an undo log (`bind` / `restore`) so lookups are
  O(1) however many `let`s shadow each other.
- Graph variables (`%3`) are one flat table for the whole parse, as in TVM: they name expressions
  (DAG sharing), are never scoped, and a later `%3 = ...;` replaces an earlier one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from relay_tune.errors import ParseError, RelayTypeError, UnknownOperatorError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES
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
)
from relay_tune.ir.module import IRModule
from relay_tune.ir.span import Span
from relay_tune.ir.types import ANY, DataType, FuncType, IncompleteType, TensorType, TupleType, Type
from relay_tune.ir.types import TypeVar as RelayTypeVar
from relay_tune.op.registry import OpDef, get_op
from relay_tune.text.lexer import (
    BOOL,
    EOF,
    GLOBAL,
    GRAPH,
    IDENT,
    KEYWORD,
    LOCAL,
    META,
    METADATA,
    NUMBER,
    PUNCT,
    STRING,
    VERSION,
    SourceText,
    Token,
    TypeComment,
    tokenize,
)
from relay_tune.text.trampoline import Steps, drive

SUPPORTED_VERSION = '"0.0.5"'
MAX_TYPE_DEPTH = 64
# Nesting is parsed without recursion, so this only bounds the memory an adversarial input can take.
MAX_EXPR_DEPTH = 100_000
MAX_ATTR_DEPTH = 32

ConstantTable = Sequence[np.ndarray] | Mapping[str, Sequence[np.ndarray]] | None
Annotations = list[tuple[Expr, Type]]

# Infix operators: token -> (operator name, precedence). All are left associative.
BINARY_OPERATORS: dict[str, tuple[str, int]] = {
    "*": ("multiply", 12),
    "/": ("divide", 12),
    "+": ("add", 10),
    "-": ("subtract", 10),
    "<": ("less", 8),
    "<=": ("less_equal", 8),
    ">": ("greater", 8),
    ">=": ("greater_equal", 8),
    "==": ("equal", 7),
    "!=": ("not_equal", 7),
}

_NUMBER_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)(?:([fi])([0-9]*))?")
_DTYPE_RE = re.compile(r"(bool)|(uint|int|float|bfloat)([0-9]*)((?:x[0-9]+)?)")
_INT_BITS = {"": 32, "8": 8, "16": 16, "32": 32, "64": 64}
_FLOAT_BITS = {"": 32, "16": 16, "32": 32, "64": 64}
_DTYPE_BITS = {"int": {1, 2, 4, 8, 16, 32, 64}, "uint": {1, 2, 4, 8, 16, 32, 64}, "float": {16, 32, 64}, "bfloat": {16}}
_MISSING = object()

def normalize_dtype(name: str) -> str | None:
    """The canonical dtype for a type name (`int` -> `int32`), or None if `name` is not a dtype."""
    if name in LOW_PRECISION_FLOAT_DTYPES:  # float8_e4m3fn, ...: ml_dtypes' names, written as they are
        return name
    m = _DTYPE_RE.fullmatch(name)
    if m is None:
        return None
    if m.group(1):
        return "bool"
    base, bits, lanes = m.group(2), m.group(3), m.group(4)
    if not bits:
        bits = "16" if base == "bfloat" else "32"
    if len(bits) > 3 or int(bits) not in _DTYPE_BITS[base]:
        return None
    if lanes and (len(lanes) > 6 or int(lanes[1:]) < 1):
        return None
    return f"{base}{bits}{lanes}"


def constant_list(constants: ConstantTable) -> list[np.ndarray] | None:
    """The `meta[relay.Constant]` table from the forms `parse_module` accepts."""
    if constants is None:
        return None
    if isinstance(constants, Mapping):
        unknown = [k for k in constants if k != "relay.Constant"]
        if unknown:
            raise ValueError(f"only 'relay.Constant' meta tables are supported, got {unknown}")
        constants = constants.get("relay.Constant", [])
    return [np.asarray(c) for c in constants]


class Parser:
    """One parse of one source text. Use the module-level functions rather than this class."""

    def __init__(
        self,
        source: SourceText,
        constants: list[np.ndarray] | None,
        annotations: Annotations | None = None,
        type_scopes: list[dict[str, RelayTypeVar]] | None = None,
    ) -> None:
        self.src = source
        self.tokens, self.type_comments = tokenize(source)
        self.pos = 0
        self.constants = constants
        self.constant_nodes: dict[int, Constant] = {}
        # Locals: current binding per name plus an undo log so scopes can be closed.
        self.env: dict[str, Var] = {}
        self.undo: list[tuple[str, Any]] = []
        self.free_vars: dict[str, Var] = {}
        self.graph: dict[int, Expr] = {}
        self.type_scopes: list[dict[str, RelayTypeVar]] = type_scopes if type_scopes is not None else []
        self.global_uses: dict[str, Token] = {}
        self.annotations = annotations
        self.binop_attrs: dict[str, Attrs] = {}
        self.depth = 0  # current nesting of sequences (parentheses, bodies, arguments)
        self.type_defs: dict[str, TypeDef] = {}  # algebraic data types defined so far, by name
        self.constructors: dict[str, Constructor] = {}

    # ------------------------------------------------------------------ tokens and errors
    def peek(self, ahead: int = 0) -> Token:
        index = self.pos + ahead
        tokens = self.tokens
        return tokens[index] if index < len(tokens) else tokens[-1]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind != EOF:
            self.pos += 1
        return tok

    def at_punct(self, text: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind == PUNCT and tok.value == text

    def accept_punct(self, text: str) -> bool:
        tok = self.tokens[self.pos]
        if tok.kind == PUNCT and tok.value == text:
            self.pos += 1
            return True
        return False

    def expect_punct(self, text: str, context: str) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind == PUNCT and tok.value == text:
            self.pos += 1
            return tok
        self.fail(f"expected `{text}` {context}, found {tok.describe()}", tok)

    def fail(self, message: str, tok: Token) -> NoReturn:
        raise self.src.error(message, tok.start)

    def span(self, tok: Token) -> Span:
        line, column = self.src.location(tok.start)
        return Span(self.src.source_name, line, column)

    def unsupported(self, tok: Token, what: str) -> NoReturn:
        self.fail(f"relay-tune does not support {what}", tok)

    # ------------------------------------------------------------------ scopes
    def bind(self, name: str, var: Var) -> None:
        self.undo.append((name, self.env.get(name, _MISSING)))
        self.env[name] = var

    def scope_mark(self) -> int:
        return len(self.undo)

    def restore(self, mark: int) -> None:
        undo, env = self.undo, self.env
        while len(undo) > mark:
            name, previous = undo.pop()
            if previous is _MISSING:
                del env[name]
            else:
                env[name] = previous

    def lookup_type_var(self, name: str) -> RelayTypeVar | None:
        for scope in reversed(self.type_scopes):
            tv = scope.get(name)
            if tv is not None:
                return tv
        return None

    # ------------------------------------------------------------------ entry points
    def parse_version(self, required: bool) -> None:
        tok = self.peek()
        if tok.kind != VERSION:
            if required:
                self.fail('missing version header: a module must start with `#[version = "0.0.5"]`', tok)
            return
        if tok.value != SUPPORTED_VERSION:
            self.fail(f"unsupported text format version {tok.value}; relay-tune reads version {SUPPORTED_VERSION}", tok)
        self.advance()

    def parse_module(self) -> IRModule:
        self.parse_version(required=True)
        functions: dict[str, Function] = {}
        while True:
            tok = self.peek()
            if tok.kind == EOF:
                break
            if tok.kind == KEYWORD and tok.value == "def":
                self.advance()
                name_tok = self.advance()
                if name_tok.kind != GLOBAL:
                    self.fail(f"expected a global name `@name` after `def`, found {name_tok.describe()}", name_tok)
                if name_tok.value in functions:
                    self.fail(f"duplicate definition of global function @{name_tok.value}", name_tok)
                functions[name_tok.value] = self.parse_function_rest(tok)
                continue
            if tok.kind == KEYWORD and tok.value == "type":
                self.parse_type_def()
                continue
            self.reject_top_level(tok)
            self.fail(f"expected a definition `def @name(...) {{ ... }}`, found {tok.describe()}", tok)
        for name, use in self.global_uses.items():
            if name not in functions:
                self.fail(f"undefined global function @{name}", use)
        return IRModule(functions)

    def parse_expression(self) -> Expr:
        self.parse_version(required=False)
        expr = drive(self.g_seq())
        tok = self.peek()
        if tok.kind != EOF:
            self.reject_top_level(tok)
            self.fail(f"expected end of input after the expression, found {tok.describe()}", tok)
        return expr

    def parse_type_only(self) -> Type:
        ty = self.parse_type()
        tok = self.peek()
        if tok.kind != EOF:
            self.fail(f"expected end of input after the type, found {tok.describe()}", tok)
        return ty

    def reject_top_level(self, tok: Token) -> None:
        if tok.kind == METADATA:
            self.fail(
                "the `#[metadata]` section is not supported; pass constants with `constants=` "
                "(a list of arrays for meta[relay.Constant][i]) instead",
                tok,
            )
        if tok.kind == KEYWORD and tok.value == "extern":
            self.unsupported(tok, "algebraic data types defined elsewhere (`extern type`)")
        if tok.kind == KEYWORD and tok.value == "type":
            self.fail("algebraic data types are defined at the top level of a module", tok)
        if tok.kind == VERSION:
            self.fail("the version header must be the first thing in the file", tok)

    # ------------------------------------------------------------------ algebraic data types
    def parse_type_def(self) -> None:
        """`type Name[A, ...] { Ctor(T, ...), Ctor, ... }` (after `type`): defines the type and its constructors,
        usable from here on (the constructors' fields may be of the type itself)."""
        self.advance()  # `type`
        name_tok = self.advance()
        if name_tok.kind != IDENT or "." in name_tok.value or name_tok.value == "_":
            self.fail(f"expected a type name after `type`, found {name_tok.describe()}", name_tok)
        name: str = name_tok.value
        if name in self.type_defs or name == "Tensor" or normalize_dtype(name) is not None:
            self.fail(f"type `{name}` is already defined", name_tok)
        type_params = self.parse_type_params()
        # Registered before its constructors are read: a field may be of this very type (`List[A]`).
        self.type_defs[name] = TypeDef(name, type_params, ())
        self.expect_punct("{", "to open the constructors of the type")
        constructors: list[tuple[str, tuple[Type, ...]]] = []
        tokens: list[Token] = []
        while not self.accept_punct("}"):
            ctor_tok = self.advance()
            if ctor_tok.kind != IDENT or "." in ctor_tok.value or ctor_tok.value == "_":
                self.fail(f"expected a constructor name, found {ctor_tok.describe()}", ctor_tok)
            if ctor_tok.value in self.constructors or any(c == ctor_tok.value for c, _f in constructors):
                self.fail(f"constructor `{ctor_tok.value}` is already defined", ctor_tok)
            fields: list[Type] = []
            if self.accept_punct("("):
                while not self.accept_punct(")"):
                    fields.append(self.parse_type())
                    if not self.accept_punct(","):
                        self.expect_punct(")", "to close the constructor's fields")
                        break
            constructors.append((ctor_tok.value, tuple(fields)))
            tokens.append(ctor_tok)
            if not self.accept_punct(","):
                self.expect_punct("}", "to close the constructors of the type")
                break
        if type_params:
            self.type_scopes.pop()
        if not constructors:
            self.fail(f"type `{name}` has no constructors", name_tok)
        type_def = TypeDef(name, type_params, tuple(constructors))
        self.type_defs[name] = type_def
        for tag, tok in enumerate(tokens):
            self.constructors[tok.value] = Constructor(type_def, tag, self.span(tok))

    def parse_data_type(self, tok: Token, depth: int) -> DataType:
        """`Name` or `Name[T, ...]` of a defined algebraic data type (after its name `tok`)."""
        type_def = self.type_defs[tok.value]
        args: list[Type] = []
        if self.accept_punct("["):
            while not self.accept_punct("]"):
                args.append(self.parse_type(depth + 1))
                if not self.accept_punct(","):
                    self.expect_punct("]", "to close the type arguments")
                    break
        if len(args) != len(type_def.type_params):
            self.fail(f"type `{tok.value}` takes {len(type_def.type_params)} type argument(s), got {len(args)}", tok)
        return DataType(tok.value, tuple(args))

    def g_match(self, start: Token) -> Steps[Expr]:
        """`match (data) { pattern => body, ... }` (after `match`)."""
        self.expect_punct("(", "after `match` (the matched value must be parenthesised)")
        data = yield self.g_seq()
        self.expect_punct(")", "to close the matched value")
        self.expect_punct("{", "to open the clauses of `match`")
        clauses: list[tuple[Pattern, Expr]] = []
        while not self.accept_punct("}"):
            mark = self.scope_mark()
            pattern = self.parse_pattern(0)
            self.expect_punct("=>", "after a pattern")
            braced = self.accept_punct("{")
            body = yield self.g_seq()
            if braced:
                self.expect_punct("}", "to close the clause's body")
            self.restore(mark)
            clauses.append((pattern, body))
            if not self.accept_punct(","):
                self.expect_punct("}", "to close the clauses of `match`")
                break
        if not clauses:
            self.fail("`match` needs at least one clause", start)
        return Match(data, tuple(clauses), self.span(start))

    def parse_pattern(self, depth: int) -> Pattern:
        """`_`, `%x[: T]`, `Ctor[(p, ...)]` or `(p, ...)`; variables are bound in the current scope."""
        tok = self.advance()
        if depth >= MAX_TYPE_DEPTH:
            self.fail(f"pattern nested more than {MAX_TYPE_DEPTH} levels deep", tok)
        if tok.kind == IDENT and tok.value == "_":
            return PatternWildcard()
        if tok.kind == LOCAL:
            var = Var(tok.value, self.parse_optional_annotation(), self.span(tok))
            self.bind(tok.value, var)
            return PatternVar(var)
        if tok.kind == PUNCT and tok.value == "(":
            fields: list[Pattern] = []
            while not self.accept_punct(")"):
                fields.append(self.parse_pattern(depth + 1))
                if not self.accept_punct(","):
                    self.expect_punct(")", "to close the tuple pattern")
                    break
            return PatternTuple(tuple(fields))
        if tok.kind == IDENT and tok.value in self.constructors:
            ctor = self.constructors[tok.value]
            subs: list[Pattern] = []
            if self.accept_punct("("):
                while not self.accept_punct(")"):
                    subs.append(self.parse_pattern(depth + 1))
                    if not self.accept_punct(","):
                        self.expect_punct(")", "to close the constructor pattern")
                        break
            if len(subs) != len(ctor.field_types):
                self.fail(f"constructor `{ctor.name}` has {len(ctor.field_types)} field(s), the pattern "
                          f"{len(subs)}", tok)
            return PatternConstructor(ctor, tuple(subs))
        self.fail(f"expected a pattern (`_`, `%name`, a constructor or a tuple), found {tok.describe()}", tok)

    # ------------------------------------------------------------------ functions
    def parse_function_rest(self, start: Token) -> Function:
        """`[A, ...](params) -> ret { body }` after `def @name` (the body parsed iteratively)."""
        mark = self.scope_mark()
        type_params = self.parse_type_params()
        params, attrs = self.parse_params()
        ret_type = self.parse_type() if self.accept_punct("->") else None
        self.expect_punct("{", "to open the function body")
        body = drive(self.g_seq())
        self.expect_punct("}", "to close the function body")
        self.restore(mark)
        if type_params:
            self.type_scopes.pop()
        return Function(tuple(params), body, ret_type, Attrs(attrs), type_params, self.span(start))

    def parse_type_params(self) -> tuple[RelayTypeVar, ...]:
        """Optional `[A, B]`; when present, opens a type scope the caller must pop."""
        if not self.at_punct("["):
            return ()
        self.advance()
        scope: dict[str, RelayTypeVar] = {}
        params: list[RelayTypeVar] = []
        while not self.accept_punct("]"):
            tok = self.advance()
            if tok.kind != IDENT or "." in tok.value or tok.value == "_":
                self.fail(f"expected a type parameter name, found {tok.describe()}", tok)
            if tok.value in scope:
                self.fail(f"duplicate type parameter `{tok.value}`", tok)
            tv = RelayTypeVar(tok.value)
            scope[tok.value] = tv
            params.append(tv)
            if not self.accept_punct(","):
                self.expect_punct("]", "to close the type parameter list")
                break
        self.type_scopes.append(scope)
        return tuple(params)

    def parse_params(self) -> tuple[list[Var], dict[str, Any]]:
        """`(%a: T, %b, Key=value, ...)`: parameters (bound in the current scope) and function attrs."""
        self.expect_punct("(", "to open the parameter list")
        params: list[Var] = []
        attrs: dict[str, Any] = {}
        seen: set[str] = set()
        while not self.accept_punct(")"):
            tok = self.peek()
            if tok.kind == IDENT and self.at_punct("=", 1):
                attrs = self.parse_attr_list(")")[0]
                self.expect_punct(")", "to close the parameter list")
                break
            if tok.kind != LOCAL:
                self.fail(f"expected a parameter `%name` or an attribute `key=value`, found {tok.describe()}", tok)
            self.advance()
            if self.at_punct("{"):
                self.unsupported(self.peek(), "parameter attributes such as `{virtual_device=...}`")
            if tok.value in seen:
                self.fail(f"duplicate parameter %{tok.value}", tok)
            seen.add(tok.value)
            var = Var(tok.value, self.parse_optional_annotation(), self.span(tok))
            params.append(var)
            self.bind(tok.value, var)
            if not self.accept_punct(","):
                self.expect_punct(")", "to close the parameter list")
                break
        return params, attrs

    def parse_optional_annotation(self) -> Type | None:
        if not self.accept_punct(":"):
            return None
        ty = self.parse_type()
        # A top-level `_` means "infer me", which is exactly what no annotation means.
        return None if isinstance(ty, IncompleteType) else ty

    # ------------------------------------------------------------------ expressions
    def g_seq(self) -> Steps[Expr]:
        """A `;`-separated sequence: graph bindings, lets, anonymous lets, then a final expression."""
        self.depth += 1
        if self.depth > MAX_EXPR_DEPTH:
            self.fail(f"expression nested more than {MAX_EXPR_DEPTH} levels deep", self.tokens[self.pos])
        bindings: list[tuple[Var, Expr, Span]] = []
        mark = self.scope_mark()
        while True:
            tok = self.tokens[self.pos]
            kind = tok.kind
            if kind == GRAPH and self.at_punct("=", 1):
                self.pos += 2
                value = yield self.g_binop()
                self.expect_punct(";", f"after the binding of %{tok.value}")
                # Graph variables are plain names for expressions (sharing, no Let): one flat table.
                self.graph[tok.value] = value
                continue
            if kind == KEYWORD and tok.value == "let":
                self.advance()
                name_tok = self.advance()
                if name_tok.kind != LOCAL:
                    self.fail(f"expected a local variable `%name` after `let`, found {name_tok.describe()}", name_tok)
                var = Var(name_tok.value, self.parse_optional_annotation(), self.span(name_tok))
                # Bound before its value is parsed, so a let-bound function may call itself.
                self.bind(name_tok.value, var)
                self.expect_punct("=", f"after `let %{name_tok.value}`")
                value = yield self.g_binop()
                self.expect_punct(";", f"after the value of `let %{name_tok.value}`")
                bindings.append((var, value, self.span(tok)))
                continue
            if kind == KEYWORD and tok.value == "free_var":
                self.advance()
                name_tok = self.advance()
                if name_tok.kind != LOCAL:
                    self.fail(
                        f"expected a local variable `%name` after `free_var`, found {name_tok.describe()}", name_tok
                    )
                self.free_vars[name_tok.value] = Var(
                    name_tok.value, self.parse_optional_annotation(), self.span(name_tok)
                )
                self.expect_punct(";", f"after `free_var %{name_tok.value}`")
                continue
            if kind == PUNCT and tok.value == "{":
                self.advance()
                inner_mark = self.scope_mark()
                value = yield self.g_seq()
                self.expect_punct("}", "to close the block")
                self.restore(inner_mark)
            else:
                value = yield self.g_binop()
            if self.accept_punct(";"):
                # `a; b` evaluates `a` for nothing: an anonymous let.
                bindings.append((Var("_", None, self.span(tok)), value, self.span(tok)))
                continue
            break
        self.restore(mark)
        self.depth -= 1
        body = value
        for var, bound, span in reversed(bindings):
            body = Let(var, bound, body, span)
        return body

    def g_binop(self) -> Steps[Expr]:
        """Infix operators by precedence climbing with explicit operand/operator stacks."""
        first = yield self.g_postfix()
        tok = self.tokens[self.pos]
        if not (tok.kind == PUNCT and tok.value in BINARY_OPERATORS):
            self.note_annotation(first)
            return first
        operands: list[Expr] = [first]
        operators: list[tuple[str, int, Token]] = []
        while tok.kind == PUNCT and tok.value in BINARY_OPERATORS:
            name, precedence = BINARY_OPERATORS[tok.value]
            while operators and operators[-1][1] >= precedence:
                self.reduce_binop(operands, operators)
            operators.append((name, precedence, tok))
            self.pos += 1
            operand = yield self.g_postfix()
            operands.append(operand)
            tok = self.tokens[self.pos]
        while operators:
            self.reduce_binop(operands, operators)
        self.note_annotation(operands[0])
        return operands[0]

    def reduce_binop(self, operands: list[Expr], operators: list[tuple[str, int, Token]]) -> None:
        name, _, tok = operators.pop()
        rhs = operands.pop()
        lhs = operands.pop()
        attrs = self.binop_attrs.get(name)
        if attrs is None:
            attrs = self.binop_attrs[name] = get_op(name).make_attrs({})
        span = self.span(tok)
        operands.append(Call(Op(name, span), (lhs, rhs), attrs, span))

    def g_postfix(self) -> Steps[Expr]:
        """An atom followed by any number of call argument lists and `.N` projections."""
        start = self.tokens[self.pos]
        if (start.kind == PUNCT and start.value == "(") or (start.kind == KEYWORD
                                                             and start.value in ("fn", "if", "match")):
            expr = yield self.g_compound()
        else:
            expr = self.parse_leaf()
        while True:
            tok = self.tokens[self.pos]
            if tok.kind != PUNCT:
                return expr
            if tok.value == "(":
                expr = yield self.g_call(expr, start)
            elif tok.value == ".":
                self.advance()
                index_tok = self.advance()
                if index_tok.kind != NUMBER or not str(index_tok.value).isdigit():
                    self.fail(f"expected a tuple index after `.`, found {index_tok.describe()}", index_tok)
                if len(index_tok.value) > 9:
                    self.fail("tuple index is too large", index_tok)
                expr = TupleGetItem(expr, int(index_tok.value), self.span(start))
            else:
                return expr

    def g_compound(self) -> Steps[Expr]:
        """Parenthesised expressions and tuples, function literals, `if`, `match`."""
        start = self.advance()
        if start.kind == KEYWORD and start.value == "match":
            matched = yield self.g_match(start)
            return matched
        if start.kind == PUNCT:  # `(`
            if self.accept_punct(")"):
                return Tuple((), self.span(start))
            first = yield self.g_seq()
            if not self.accept_punct(","):
                self.expect_punct(")", "to close the parenthesis")
                return first
            fields = [first]
            while not self.accept_punct(")"):
                field = yield self.g_seq()
                fields.append(field)
                if not self.accept_punct(","):
                    self.expect_punct(")", "to close the tuple")
                    break
            return Tuple(tuple(fields), self.span(start))
        if start.value == "fn":
            mark = self.scope_mark()
            type_params = self.parse_type_params()
            params, attrs = self.parse_params()
            ret_type = self.parse_type() if self.accept_punct("->") else None
            self.expect_punct("{", "to open the function body")
            body = yield self.g_seq()
            self.expect_punct("}", "to close the function body")
            self.restore(mark)
            if type_params:
                self.type_scopes.pop()
            return Function(tuple(params), body, ret_type, Attrs(attrs), type_params, self.span(start))
        # `if (cond) { then } else { else }`
        self.expect_punct("(", "after `if` (the condition must be parenthesised)")
        cond = yield self.g_seq()
        self.expect_punct(")", "to close the condition")
        self.expect_punct("{", "to open the then-branch")
        mark = self.scope_mark()
        then_branch = yield self.g_seq()
        self.restore(mark)
        self.expect_punct("}", "to close the then-branch")
        else_tok = self.advance()
        if not (else_tok.kind == KEYWORD and else_tok.value == "else"):
            self.fail(f"expected `else` after the then-branch, found {else_tok.describe()}", else_tok)
        self.expect_punct("{", "to open the else-branch")
        else_branch = yield self.g_seq()
        self.restore(mark)
        self.expect_punct("}", "to close the else-branch")
        return If(cond, then_branch, else_branch, self.span(start))

    def g_call(self, callee: Expr, start: Token) -> Steps[Expr]:
        """`(args..., key=value...)` applied to `callee`."""
        self.advance()  # `(`
        args: list[Expr] = []
        attrs: dict[str, Any] = {}
        key_tokens: dict[str, Token] = {}
        while not self.accept_punct(")"):
            tok = self.tokens[self.pos]
            if tok.kind == IDENT and self.at_punct("=", 1):
                attrs, key_tokens = self.parse_attr_list(")")
                self.expect_punct(")", "to close the argument list")
                break
            if tok.kind == META and tok.value[0] != "relay.Constant" and self.at_punct(")", 1):
                self.unsupported(tok, "attribute objects given as meta references")
            arg = yield self.g_seq()
            args.append(arg)
            if not self.accept_punct(","):
                self.expect_punct(")", "to close the argument list")
                break
        span = self.span(start)
        if isinstance(callee, Op):
            return Call(callee, tuple(args), self.make_op_attrs(callee, attrs, key_tokens, start), span)
        return Call(callee, tuple(args), Attrs(attrs), span)

    def make_op_attrs(self, callee: Op, attrs: dict[str, Any], key_tokens: dict[str, Token], start: Token) -> Attrs:
        opdef: OpDef = get_op(callee.name)
        try:
            return opdef.make_attrs(attrs)
        except RelayTypeError as err:
            unknown = [k for k in attrs if k not in opdef.attr_defaults]
            where = key_tokens[unknown[0]] if unknown else start
            self.fail(f"in call to `{callee.name}`: {err.message}", where)
            raise  # pragma: no cover - fail() always raises

    def parse_leaf(self) -> Expr:
        tok = self.tokens[self.pos]
        kind = tok.kind
        if kind == LOCAL:
            self.pos += 1
            var = self.env.get(tok.value)
            if var is None:
                var = self.free_vars.get(tok.value)
            if var is None:
                self.fail(f"undefined variable %{tok.value}", tok)
            return var
        if kind == GRAPH:
            self.pos += 1
            expr = self.graph.get(tok.value)
            if expr is None:
                self.fail(f"undefined graph variable %{tok.value} (bind it with `%{tok.value} = ...;` first)", tok)
            return expr
        if kind == GLOBAL:
            self.pos += 1
            self.global_uses.setdefault(tok.value, tok)
            return GlobalVar(tok.value, self.span(tok))
        if kind == IDENT:
            self.pos += 1
            ctor = self.constructors.get(tok.value)
            if ctor is not None:
                # A constructor without fields is its value (`Nil`), one with fields is called (`Cons(x, l)`).
                return ctor if ctor.field_types or self.at_punct("(") else Call(ctor, (), span=self.span(tok))
            return self.parse_operator(tok)
        if kind == NUMBER or (kind == PUNCT and tok.value == "-"):
            value, dtype, first = self.parse_number_literal()
            return Constant(np.array(value, dtype=dtype), self.span(first))
        if kind == BOOL:
            self.pos += 1
            return Constant(np.array(tok.value, dtype="bool"), self.span(tok))
        if kind == META:
            self.pos += 1
            return self.meta_constant(tok)
        if kind == KEYWORD:
            if tok.value in ("ref", "ref_read", "ref_write"):
                self.unsupported(tok, f"references (`{tok.value}`)")
        self.fail(f"expected an expression, found {tok.describe()}", tok)

    def parse_operator(self, tok: Token) -> Op:
        name: str = tok.value
        if name == "_":
            self.fail("`_` is not an expression", tok)
        try:
            get_op(name)
        except UnknownOperatorError:
            self.fail(f"operator `{name}` not found, perhaps you forgot to register it?", tok)
        return Op(name, self.span(tok))

    def parse_number_literal(self) -> tuple[int | float, str, Token]:
        """A number token with any directly attached leading `-` signs: (value, dtype, first token)."""
        first = self.tokens[self.pos]
        negative = False
        tok = first
        while tok.kind == PUNCT and tok.value == "-":
            nxt = self.tokens[self.pos + 1]
            if nxt.start != tok.end or not (nxt.kind == NUMBER or (nxt.kind == PUNCT and nxt.value == "-")):
                self.fail("a `-` sign must be directly followed by a number literal (there is no unary minus)", tok)
            negative = not negative
            self.pos += 1
            tok = nxt
        self.pos += 1
        value, dtype = self.interpret_number(tok, negative)
        return value, dtype, first

    def interpret_number(self, tok: Token, negative: bool) -> tuple[int | float, str]:
        text: str = tok.value
        if text.startswith(("inf", "nan")):
            bits = text[4:] or "32"
            value = math.inf if text.startswith("inf") else math.nan
            return (-value if negative else value), f"float{bits}"
        m = _NUMBER_RE.fullmatch(text)
        if m is None:
            self.fail(f"invalid number literal `{text}`", tok)
        body, suffix, bits = m.group(1), m.group(2), m.group(3)
        is_integral = "." not in body and "e" not in body and "E" not in body
        if suffix == "f":
            if bits not in _FLOAT_BITS:
                self.fail(f"invalid float literal `{text}`: the width must be 16, 32 or 64", tok)
            dtype = f"float{_FLOAT_BITS[bits]}"
            value = float(body)
            if negative:
                value = -value
            if math.isinf(value) or abs(value) > float(np.finfo(dtype).max):
                self.fail(f"float literal `{text}` is out of range for {dtype}", tok)
            return value, dtype
        if not is_integral:
            self.fail(
                f"invalid integer literal `{text}`: a number with a decimal point or exponent needs a float "
                f"suffix, e.g. `{text}f`",
                tok,
            )
        if suffix == "i" and bits not in _INT_BITS:
            self.fail(f"invalid integer literal `{text}`: the width must be 8, 16, 32 or 64", tok)
        if len(body) > 24:
            self.fail(f"integer literal `{text}` is out of range", tok)
        ivalue = -int(body) if negative else int(body)
        if suffix == "i":
            dtype = f"int{_INT_BITS[bits]}"
        elif -(2**31) <= ivalue < 2**31:
            dtype = "int32"
        else:
            dtype = "int64"
        info = np.iinfo(dtype)
        if not info.min <= ivalue <= info.max:
            self.fail(f"integer literal `{text}` is out of range for {dtype}", tok)
        return ivalue, dtype

    def meta_constant(self, tok: Token) -> Constant:
        key, index = tok.value
        if key != "relay.Constant":
            self.unsupported(tok, f"meta references of kind `{key}` (only meta[relay.Constant][i])")
        if self.constants is None:
            self.fail(
                f"meta[relay.Constant][{index}] needs a constant table, but none was given "
                "(pass constants=[...] or use load_module with a .consts.json sidecar)",
                tok,
            )
        if index >= len(self.constants):
            self.fail(
                f"meta[relay.Constant][{index}] is out of range: {len(self.constants)} constant(s) were given", tok
            )
        node = self.constant_nodes.get(index)
        if node is None:
            # One node per table entry: every mention of meta[relay.Constant][i] is the same constant.
            node = self.constant_nodes[index] = Constant(self.constants[index], self.span(tok))
        return node

    def note_annotation(self, expr: Expr) -> None:
        """Record a `/* ty=T */` comment that directly follows the expression just parsed."""
        if self.annotations is None:
            return
        comment = self.type_comments.pop(self.pos, None)
        if comment is None:
            return
        ty = self.parse_comment_type(comment)
        if ty is not None:
            self.annotations.append((expr, ty))

    def parse_comment_type(self, comment: TypeComment) -> Type | None:
        # The comment may go on after the type (e.g. `span=...`); anything unreadable is ignored,
        # because a comment must never make a program fail to parse.
        depth = len(self.type_scopes)
        try:
            sub = Parser(SourceText(comment.text, self.src.source_name), None, None, self.type_scopes)
            return sub.parse_type()
        except ParseError:
            return None
        finally:
            del self.type_scopes[depth:]  # a half-read `fn [A](...` must not leave `A` in scope

    # ------------------------------------------------------------------ attributes
    def parse_attr_list(self, closer: str) -> tuple[dict[str, Any], dict[str, Token]]:
        """`key=value, ...` up to (not including) `closer`; a trailing comma is allowed."""
        attrs: dict[str, Any] = {}
        key_tokens: dict[str, Token] = {}
        while True:
            key_tok = self.advance()
            if key_tok.kind != IDENT:
                self.fail(f"expected an attribute name, found {key_tok.describe()}", key_tok)
            key: str = key_tok.value
            self.expect_punct("=", f"after attribute name `{key}`")
            if key in attrs:
                self.fail(f"attribute `{key}` is given twice", key_tok)
            attrs[key] = self.parse_attr_value(0)
            key_tokens[key] = key_tok
            if not self.accept_punct(","):
                return attrs, key_tokens
            if self.at_punct(closer):
                return attrs, key_tokens
            nxt = self.peek()
            if not (nxt.kind == IDENT and self.at_punct("=", 1)):
                self.fail(
                    f"expected another attribute `key=value` (positional arguments cannot follow attributes), "
                    f"found {nxt.describe()}",
                    nxt,
                )

    def parse_attr_value(self, depth: int) -> Any:
        tok = self.peek()
        kind = tok.kind
        if kind == NUMBER or (kind == PUNCT and tok.value == "-"):
            value, dtype, _ = self.parse_number_literal()
            return float(value) if dtype.startswith("float") else int(value)
        self.advance()
        if kind == BOOL or kind == STRING:
            return tok.value
        if kind == IDENT and tok.value in ("None", "nullptr"):
            return None
        if kind == PUNCT:
            if tok.value == "?":
                return ANY
            if tok.value in ("[", "("):
                if depth >= MAX_ATTR_DEPTH:
                    self.fail(f"attribute value nested more than {MAX_ATTR_DEPTH} levels deep", tok)
                if tok.value == "(":
                    value = self.parse_attr_value(depth + 1)
                    self.expect_punct(")", "to close the parenthesised attribute value")
                    return value
                items: list[Any] = []
                while not self.accept_punct("]"):
                    items.append(self.parse_attr_value(depth + 1))
                    if not self.accept_punct(","):
                        self.expect_punct("]", "to close the attribute list")
                        break
                return tuple(items)
        if kind == META:
            self.unsupported(tok, "meta references as attribute values")
        self.fail(f"expected an attribute value (number, string, bool, list, None or `?`), found {tok.describe()}", tok)

    # ------------------------------------------------------------------ types
    def parse_type(self, depth: int = 0) -> Type:
        tok = self.advance()
        if depth >= MAX_TYPE_DEPTH:
            self.fail(f"type nested more than {MAX_TYPE_DEPTH} levels deep", tok)
        kind = tok.kind
        if kind == PUNCT and tok.value == "(":
            fields: list[Type] = []
            while not self.accept_punct(")"):
                fields.append(self.parse_type(depth + 1))
                if not self.accept_punct(","):
                    self.expect_punct(")", "to close the tuple type")
                    break
            return TupleType(tuple(fields))
        if kind == KEYWORD and tok.value == "fn":
            type_params = self.parse_type_params()
            self.expect_punct("(", "to open the argument types of a function type")
            args: list[Type] = []
            while not self.accept_punct(")"):
                args.append(self.parse_type(depth + 1))
                if not self.accept_punct(","):
                    self.expect_punct(")", "to close the argument types")
                    break
            self.expect_punct("->", "before the result type of a function type")
            ret = self.parse_type(depth + 1)
            if type_params:
                self.type_scopes.pop()
            return FuncType(tuple(args), ret, type_params)
        if kind == IDENT:
            name: str = tok.value
            if name == "Tensor":
                return self.parse_tensor_type()
            if name == "_":
                return IncompleteType()
            dtype = normalize_dtype(name)
            if dtype is not None:
                return TensorType((), dtype)
            tv = self.lookup_type_var(name)
            if tv is not None:
                return tv
            if name in self.type_defs:
                return self.parse_data_type(tok, depth)
            if self.at_punct("["):
                self.fail(f"unknown algebraic data type `{name}` (define it with `type {name}[...] {{ ... }}` "
                          "before its use)", tok)
            self.fail(
                f"unknown type `{name}` (expected Tensor[...], a dtype, a tuple, fn (...) -> T or a type parameter)",
                tok,
            )
        self.fail(f"expected a type, found {tok.describe()}", tok)

    def parse_tensor_type(self) -> TensorType:
        self.expect_punct("[", "after `Tensor`")
        self.expect_punct("(", "to open the shape of a tensor type")
        dims: list[int | Any] = []
        while not self.accept_punct(")"):
            tok = self.advance()
            if tok.kind == PUNCT and tok.value == "?":
                dims.append(ANY)
            elif tok.kind == NUMBER:
                m = _NUMBER_RE.fullmatch(tok.value)
                if m is None or not m.group(1).isdigit() or m.group(2) == "f" or len(m.group(1)) > 18:
                    self.fail(f"invalid tensor dimension {tok.describe()}: expected a non-negative integer or `?`", tok)
                dims.append(int(m.group(1)))
            elif tok.kind == META:
                self.unsupported(tok, "symbolic dimensions (meta[tir.SizeVar][i])")
            else:
                self.fail(f"expected a dimension (integer or `?`), found {tok.describe()}", tok)
            if not self.accept_punct(","):
                self.expect_punct(")", "to close the shape")
                break
        self.expect_punct(",", "between the shape and the dtype of a tensor type")
        dtype_tok = self.advance()
        dtype = normalize_dtype(dtype_tok.value) if dtype_tok.kind == IDENT else None
        if dtype is None:
            self.fail(f"expected a dtype such as float32 or int64, found {dtype_tok.describe()}", dtype_tok)
        self.expect_punct("]", "to close the tensor type")
        return TensorType(tuple(dims), dtype)


# ---------------------------------------------------------------------- public functions
def parse_module(text: str, source_name: str = "from_string", constants: ConstantTable = None) -> IRModule:
    """Parse a module (`#[version = "0.0.5"]` then `def`s). Does not run type inference."""
    return Parser(SourceText(text, source_name), constant_list(constants)).parse_module()


def parse_module_with_annotations(
    text: str, source_name: str = "from_string", constants: ConstantTable = None
) -> tuple[IRModule, Annotations]:
    """Like `parse_module`, also returning `(expr, type)` for each expression followed by `/* ty=T */`."""
    annotations: Annotations = []
    module = Parser(SourceText(text, source_name), constant_list(constants), annotations).parse_module()
    return module, annotations


def parse_expr(text: str, source_name: str = "from_string", constants: ConstantTable = None) -> Expr:
    """Parse a bare expression (the version header is optional; `free_var %x: T;` declares free vars)."""
    return Parser(SourceText(text, source_name), constant_list(constants)).parse_expression()


def parse_type(text: str, source_name: str = "from_string") -> Type:
    """Parse a type such as `Tensor[(1, ?), float32]`, `(int32, float32)` or `fn (int32) -> int32`."""
    return Parser(SourceText(text, source_name), None).parse_type_only()


def decode_source(data: bytes, source_name: str) -> str:
    """UTF-8 text of a source file; invalid bytes are a ParseError at their position."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        good = data[: err.start].decode("utf-8")
        shown = SourceText(good + data[err.start :].decode("utf-8", errors="replace"), source_name)
        raise shown.error(f"invalid UTF-8 byte 0x{data[err.start]:02x} in source file", len(good)) from None
    return text[1:] if text.startswith("\ufeff") else text


def parse_module_bytes(data: bytes, source_name: str = "from_bytes", constants: ConstantTable = None) -> IRModule:
    """`parse_module` for raw file contents (UTF-8, an optional byte-order mark is skipped)."""
    return parse_module(decode_source(data, source_name), source_name, constants)
