"""Relay text parser: literals, operators, bindings and scoping, types, attributes, errors, loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from relay_tune.errors import ParseError, RelayTuneError
from relay_tune.ir import (
    ANY,
    Call,
    Constant,
    Expr,
    Function,
    FuncType,
    GlobalVar,
    If,
    Let,
    Op,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    TypeVar,
    Var,
    structural_equal,
)
from relay_tune.text import (
    load_constants_sidecar,
    load_module,
    parse_expr,
    parse_module,
    parse_module_bytes,
    parse_module_with_annotations,
    parse_type,
)

HEADER = '#[version = "0.0.5"]\n'
F32 = TensorType((), "float32")


def scalar(expr: Expr) -> tuple[object, str]:
    assert isinstance(expr, Constant) and expr.data.ndim == 0
    return expr.data.item(), str(expr.data.dtype)


def parse_error(text: str, *, module: bool = True, **kwargs: object) -> ParseError:
    with pytest.raises(ParseError) as info:
        if module:
            parse_module(text, **kwargs)  # type: ignore[arg-type]
        else:
            parse_expr(text, **kwargs)  # type: ignore[arg-type]
    return info.value


# ---------------------------------------------------------------------- literals
@pytest.mark.parametrize(
    ("text", "value", "dtype"),
    [
        ("1", 1, "int32"),
        ("0", 0, "int32"),
        ("-100", -100, "int32"),
        ("-05", -5, "int32"),
        ("2147483647", 2147483647, "int32"),
        ("2147483648", 2147483648, "int64"),
        ("-2147483648", -2147483648, "int32"),
        ("9223372036854775807", 9223372036854775807, "int64"),
        ("-42i", -42, "int32"),
        ("-42i16", -42, "int16"),
        ("-42i32", -42, "int32"),
        ("-42i64", -42, "int64"),
        ("7i8", 7, "int8"),
        ("--10", 10, "int32"),
        ("---10", -10, "int32"),
        ("1.0f", 1.0, "float32"),
        ("0.5f", 0.5, "float32"),
        ("-10.0f", -10.0, "float32"),
        ("1e-05f", np.float32(1e-05).item(), "float32"),
        ("1E-1f", np.float32(0.1).item(), "float32"),
        ("1.0e+1f", 10.0, "float32"),
        ("3f16", 3.0, "float16"),
        ("3f32", 3.0, "float32"),
        ("3f", 3.0, "float32"),
        ("3f64", 3.0, "float64"),
        ("2.5f64", 2.5, "float64"),
        ("inff", float("inf"), "float32"),
        ("-inff", float("-inf"), "float32"),
        ("True", True, "bool"),
        ("False", False, "bool"),
    ],
)
def test_scalar_literals(text: str, value: object, dtype: str) -> None:
    assert scalar(parse_expr(text)) == (value, dtype)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.5", "needs a float suffix"),
        ("1e-5", "needs a float suffix"),
        ("2147483648i32", "out of range for int32"),
        ("32768i16", "out of range for int16"),
        ("3.40283e+38f32", "out of range for float32"),
        ("65505f16", "out of range for float16"),
        ("3f8", "width must be 16, 32 or 64"),
        ("3i7", "width must be 8, 16, 32 or 64"),
        ("1" * 40, "out of range"),
        ("0x10", "invalid number literal `0x10`"),
        ("- 1", "no unary minus"),
    ],
)
def test_bad_literals(text: str, message: str) -> None:
    assert message in parse_error(text, module=False).message


def test_nan_literal() -> None:
    value, dtype = scalar(parse_expr("nanf"))
    assert dtype == "float32" and np.isnan(value)


# ---------------------------------------------------------------------- operators
@pytest.mark.parametrize(
    ("symbol", "name"),
    [
        ("*", "multiply"), ("/", "divide"), ("+", "add"), ("-", "subtract"), ("<", "less"),
        ("<=", "less_equal"), (">", "greater"), (">=", "greater_equal"), ("==", "equal"), ("!=", "not_equal"),
    ],
)
def test_binary_operators(symbol: str, name: str) -> None:
    expr = parse_expr(f"1 {symbol} 2")
    assert isinstance(expr, Call) and expr.op_name == name
    assert [scalar(a)[0] for a in expr.args] == [1, 2]


def test_operator_precedence_and_associativity() -> None:
    assert parse_expr("1 * 1 + 1") == parse_expr("(1 * 1) + 1")
    assert parse_expr("1 * 1 + 1") != parse_expr("1 * (1 + 1)")
    assert parse_expr("1 * 1 + 1 < 1 == 1") == parse_expr("(((1 * 1) + 1) < 1) == 1")
    assert parse_expr("1 == 1 < 1 + 1 * 1") == parse_expr("1 == (1 < (1 + (1 * 1)))")
    assert parse_expr("1 - 2 - 3") == parse_expr("(1 - 2) - 3")  # left associative
    assert parse_expr("8 / 4 * 2") == parse_expr("(8 / 4) * 2")
    # a call binds tighter than `*`; a `-` glued to a number after an operator is a sign
    assert structural_equal(
        parse_expr("free_var %id: fn (int32) -> int32; 10 * %id(10)"),
        parse_expr("free_var %id: fn (int32) -> int32; 10 * (%id(10))"),
        map_free_vars=True,
    )
    minus = parse_expr("1 - -1")
    assert isinstance(minus, Call) and scalar(minus.args[1]) == (-1, "int32")


# ---------------------------------------------------------------------- bindings and scoping
def test_let_and_sequences() -> None:
    let = parse_expr("let %x = 1; ()")
    assert isinstance(let, Let) and let.var.name_hint == "x" and let.body == Tuple(())
    two = parse_expr("let %x = 1; let %y = %x; %y")
    assert isinstance(two, Let) and isinstance(two.body, Let)
    assert two.body.value is two.var and two.body.body is two.body.var
    seq = parse_expr("(); ()")  # anonymous let
    assert isinstance(seq, Let) and seq.value == Tuple(()) and seq.body == Tuple(())
    annotated = parse_expr("let %x: float32 = 1f; %x")
    assert isinstance(annotated, Let) and annotated.var.type_annotation == F32
    incomplete = parse_expr("let %_ : _ = 1; %_")
    assert isinstance(incomplete, Let) and incomplete.var.type_annotation is None


def test_let_shadowing_and_self_reference() -> None:
    expr = parse_expr("let %x = 1; let %x = 2; %x")
    assert isinstance(expr, Let) and isinstance(expr.body, Let)
    assert expr.body.body is expr.body.var  # the inner binding wins
    # as in TVM, a let-bound variable is visible in its own value (recursive functions)
    rec = parse_expr("let %f = fn (%n: int32) { %f(%n) }; %f")
    assert isinstance(rec, Let) and isinstance(rec.value, Function)
    body = rec.value.body
    assert isinstance(body, Call) and body.op is rec.var


def test_graph_bindings_share_nodes() -> None:
    expr = parse_expr("%0 = (); %1 = 1; (%0, %0, %1)")
    assert isinstance(expr, Tuple)
    assert expr.fields[0] is expr.fields[1]
    assert expr == Tuple((Tuple(()), Tuple(()), Constant(np.array(1, "int32"))))
    assert parse_expr("%1 = (); %1") == Tuple(())  # numbers need not start at 0
    no_lets = parse_expr("free_var %x: float32; %5 = add(%x, %x); %6 = nn.relu(%5); multiply(%6, %5)")
    assert isinstance(no_lets, Call) and no_lets.args[1] is no_lets.args[0].args[0]  # type: ignore[attr-defined]


def test_if_scopes() -> None:
    expr = parse_expr("if (True) { 0 } else { 1 }")
    assert isinstance(expr, If) and scalar(expr.true_branch) == (0, "int32")
    err = parse_error("if (True) { let %x = (); () } else { %x }", module=False)
    assert err.message == "undefined variable %x" and (err.line, err.column) == (1, 38)
    graph = parse_expr("free_var %b: bool; %0 = if (%b) { 1 } else { 0 }; %0")
    assert isinstance(graph, If)


def test_bad_let_binders() -> None:
    assert "expected a local variable" in parse_error("let @x = 1; ()", module=False).message
    assert "expected a local variable" in parse_error("let x = 1; ()", module=False).message


def test_tuples_and_projections() -> None:
    assert parse_expr("()") == Tuple(())
    assert parse_expr("(0,)") == Tuple((Constant(np.array(0, "int32")),))
    assert parse_expr("(0)") == Constant(np.array(0, "int32"))
    assert len(parse_expr("(0, 1, 2,)").fields) == 3  # type: ignore[attr-defined]
    proj = parse_expr("free_var %x: float32; (%x,).0")
    assert isinstance(proj, TupleGetItem) and proj.index == 0 and isinstance(proj.tuple_value, Tuple)
    chained = parse_expr("free_var %t: ((int32, int32), int32); %t.0.1")
    assert isinstance(chained, TupleGetItem) and chained.index == 1
    assert isinstance(chained.tuple_value, TupleGetItem) and chained.tuple_value.index == 0


def test_functions_and_calls() -> None:
    f0 = parse_expr("fn () { 0 }")
    assert isinstance(f0, Function) and f0.params == () and f0.ret_type is None
    f2 = parse_expr("fn (%x: int32, %y) -> int32 { %x }")
    assert isinstance(f2, Function) and len(f2.params) == 2
    assert f2.params[0].type_annotation == TensorType((), "int32") and f2.params[1].type_annotation is None
    assert f2.ret_type == TensorType((), "int32") and f2.body is f2.params[0]
    anon = parse_expr("(fn (%x) { %x })(0)")
    assert isinstance(anon, Call) and isinstance(anon.op, Function)
    curried = parse_expr("free_var %f: fn (int32) -> fn (int32) -> int32; %f(0)(1)")
    assert isinstance(curried, Call) and isinstance(curried.op, Call) and isinstance(curried.op.op, Var)
    zero_arg = parse_expr("free_var %c: fn () -> int32; %c()")
    assert isinstance(zero_arg, Call) and zero_arg.args == ()
    nested = parse_expr(
        'free_var %x: Tensor[(1, 3, 8, 8), int32]; cast(nn.max_pool2d(%x, pool_size=[3, 3]), dtype="int8")'
    )
    assert isinstance(nested, Call) and nested.attrs["dtype"] == "int8"
    assert isinstance(nested.args[0], Call) and nested.args[0].attrs["pool_size"] == (3, 3)


def test_operator_attributes() -> None:
    call = parse_expr(
        "free_var %x: Tensor[(1, 3, 8, 8), float32]; free_var %w: Tensor[(4, 3, 3, 3), float32];"
        "nn.conv2d(%x, %w, padding=[1, 1], channels=4, kernel_size=(3), data_layout=\"NCHW\", out_dtype=\"float32\",)"
    )
    assert isinstance(call, Call) and isinstance(call.op, Op) and call.op.name == "nn.conv2d"
    assert call.attrs["padding"] == (1, 1) and call.attrs["channels"] == 4 and call.attrs["kernel_size"] == 3
    assert call.attrs["strides"] == (1, 1)  # defaults are filled in
    assert call.attrs["out_dtype"] == "float32"
    softmax = parse_expr("free_var %x: float32; nn.softmax(%x)")
    assert softmax.attrs["axis"] == -1  # type: ignore[attr-defined]
    values = parse_expr(
        "free_var %x: float32; strided_slice(%x, begin=[0, -1], end=[?, 2i64], strides=None, axes=nullptr)"
    )
    assert values.attrs["begin"] == (0, -1) and values.attrs["end"] == (ANY, 2)  # type: ignore[attr-defined]
    assert values.attrs["strides"] is None and values.attrs["axes"] is None  # type: ignore[attr-defined]
    clip = parse_expr("free_var %x: float32; clip(%x, a_min=-inff, a_max=1e-05f)")
    assert clip.attrs["a_min"] == float("-inf") and clip.attrs["a_max"] == 1e-05  # type: ignore[attr-defined]
    leaky = parse_expr("free_var %x: float32; nn.leaky_relu(%x, alpha=True)")
    assert leaky.attrs["alpha"] is True  # type: ignore[attr-defined]


def test_function_attributes_and_type_params() -> None:
    func = parse_expr(
        'fn (%x: Tensor[(2, 3), float32], Primitive=1, relay.reshape_only=1, hash="9f0b", Note=None) '
        "{ reshape(%x, newshape=[-1]) }"
    )
    assert isinstance(func, Function) and func.is_primitive
    assert dict(func.attrs) == {"Primitive": 1, "relay.reshape_only": 1, "hash": "9f0b", "Note": None}
    mod = parse_module(HEADER + "def @id[A](%x: A) -> A { %x }\ndef @main(%f: float32) -> float32 { @id(%f) }")
    ident = mod["id"]
    assert ident.type_params == (TypeVar("A"),) and ident.params[0].type_annotation == TypeVar("A")
    assert ident.ret_type == TypeVar("A")
    assert "unknown type `A`" in parse_error(HEADER + "def @f(%x: A) { %x }").message


def test_free_vars_and_slash_names() -> None:
    expr = parse_expr("free_var %base/x: float32; add(%base/x, %base/x)")
    assert isinstance(expr, Call) and expr.args[0] is expr.args[1]
    assert isinstance(expr.args[0], Var) and expr.args[0].name_hint == "base/x"


# ---------------------------------------------------------------------- types
@pytest.mark.parametrize(
    "dtype",
    ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
     "bool", "int8x4", "uint1x4", "float16x4"],
)
def test_scalar_dtypes(dtype: str) -> None:
    assert parse_type(dtype) == TensorType((), dtype)


def test_types() -> None:
    assert parse_type("int") == TensorType((), "int32")
    assert parse_type("Tensor[(), float32]") == F32
    assert parse_type("Tensor[(1), float32]") == TensorType((1,), "float32")
    assert parse_type("Tensor[(1,), float32]") == TensorType((1,), "float32")
    assert parse_type("Tensor[(1, 1), float32]") == TensorType((1, 1), "float32")
    assert parse_type("Tensor[(?, 1), float32]") == TensorType((ANY, 1), "float32")
    assert parse_type("Tensor[(2, 3), bfloat16]") == TensorType((2, 3), "bfloat16")
    assert parse_type("fn () -> int32") == FuncType((), TensorType((), "int32"))
    assert parse_type("fn (int32, int32) -> int32") == FuncType((TensorType((), "int32"),) * 2, TensorType((), "int32"))
    assert parse_type("()") == TupleType(())
    assert parse_type("(int32,)") == TupleType((TensorType((), "int32"),))
    assert parse_type("(int32, (float32, bool))") == TupleType(
        (TensorType((), "int32"), TupleType((F32, TensorType((), "bool"))))
    )
    assert parse_type("fn [A](A) -> A") == FuncType((TypeVar("A"),), TypeVar("A"), (TypeVar("A"),))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Tensor[(-1), float32]", "expected a dimension"),
        ("Tensor[(1.5f), float32]", "invalid tensor dimension"),
        ("Tensor[(1), float33]", "expected a dtype"),
        ("Tensor[(meta[tir.SizeVar][0]), float32]", "symbolic dimensions"),
        ("List[int32]", "unknown algebraic data type `List`"),
        ("Foo", "unknown type `Foo`"),
        ("(" * 70 + ")" * 70, "nested more than 64 levels"),
    ],
)
def test_bad_types(text: str, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_type(text)
    assert message in info.value.message


# ---------------------------------------------------------------------- comments, modules, globals
def test_comments() -> None:
    plain = parse_expr("()")
    assert parse_expr("// a line comment\n()") == plain
    assert parse_expr("/* a block\n comment */ ()") == plain
    assert parse_expr("/* nested /* block */ comment */ ()") == plain
    assert parse_expr("() /* trailing */ // and a line comment") == plain
    assert parse_expr("()\r\n") == plain


def test_module_structure_and_forward_references() -> None:
    mod = parse_module(
        HEADER + "def @main(%x: float32) -> float32 {\n  @helper(%x) * 2f\n}\n\n"
        "def @helper(%y: float32) -> float32 { %y }\n"
    )
    assert list(mod) == ["main", "helper"]  # source order; the printer sorts
    body = mod["main"].body
    assert isinstance(body, Call) and body.op_name == "multiply"
    assert isinstance(body.args[0], Call) and body.args[0].op == GlobalVar("helper")
    recursive = parse_module(HEADER + "def @id(%x: int32) -> int32 { @id(%x) }")
    assert recursive["id"].body == Call(GlobalVar("id"), (recursive["id"].params[0],))


def test_spans_are_recorded() -> None:
    mod = parse_module(HEADER + "def @main(%x: float32) {\n  %0 = add(%x, 1f);\n  (%0,)\n}", source_name="m.relay")
    func = mod["main"]
    assert func.span is not None and (func.span.source_name, func.span.line, func.span.column) == ("m.relay", 2, 1)
    assert func.params[0].span is not None and (func.params[0].span.line, func.params[0].span.column) == (2, 11)
    tup = func.body
    assert isinstance(tup, Tuple) and tup.span is not None and (tup.span.line, tup.span.column) == (4, 3)
    add = tup.fields[0]
    assert isinstance(add, Call) and add.span is not None and (add.span.line, add.span.column) == (3, 8)
    assert add.op.span is not None and add.args[1].span is not None  # type: ignore[attr-defined]
    assert (add.args[1].span.line, add.args[1].span.column) == (3, 16)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- constants
def test_meta_constants() -> None:
    weights = [np.arange(6, dtype="float32").reshape(2, 3), np.ones(3, "int64")]
    text = HEADER + "def @main(%x: Tensor[(2, 3), float32]) {\n  %0 = add(%x, meta[relay.Constant][0]);\n" \
        "  (%0, meta[relay.Constant][0], meta[relay.Constant][1])\n}"
    mod = parse_module(text, constants=weights)
    body = mod["main"].body
    assert isinstance(body, Tuple)
    first = body.fields[1]
    assert isinstance(first, Constant) and np.array_equal(first.data, weights[0])
    assert body.fields[0].args[1] is first  # type: ignore[attr-defined]  # one node per table entry
    assert parse_module(text, constants={"relay.Constant": weights}) == mod
    assert "out of range: 1 constant(s)" in parse_error(text, constants=weights[:1]).message
    assert "needs a constant table" in parse_error(text).message


# ---------------------------------------------------------------------- annotations
def test_type_annotations_are_recorded() -> None:
    text = HEADER + (
        "def @main(%x: Tensor[(2), float32]) -> Tensor[(2), float32] {\n"
        "  %0 = add(%x, 1f /* ty=float32 */) /* ty=Tensor[(2), float32] */;\n"
        "  %1 = (%0, %0) /* ty=(Tensor[(2), float32], Tensor[(2), float32]) */;\n"
        "  %2 = %1.1 /* ty=Tensor[(2), float32] span=from_string:4:3 */;\n"
        "  nn.relu(%2) /* not a type */\n"
        "}\n"
    )
    mod, annotations = parse_module_with_annotations(text)
    assert mod == parse_module(text)
    t2 = TensorType((2,), "float32")
    body = mod["main"].body
    assert isinstance(body, Call)
    get = body.args[0]
    assert isinstance(get, TupleGetItem) and isinstance(get.tuple_value, Tuple)
    add = get.tuple_value.fields[0]
    assert isinstance(add, Call)
    expected = [(add.args[1], F32), (add, t2), (get.tuple_value, TupleType((t2, t2))), (get, t2)]
    assert len(annotations) == len(expected)
    for (node, ty), (want_node, want_ty) in zip(annotations, expected):
        assert node is want_node and ty == want_ty
    # an unreadable annotation is ignored rather than failing the parse
    _, none = parse_module_with_annotations(HEADER + "def @f() { 1 /* ty=Tensor[( */ }")
    assert none == []


# ---------------------------------------------------------------------- errors with locations
def check_location(err: ParseError, source: str, line: int, column: int, token: str) -> None:
    """The error names source:line:col and draws a caret under the first character of `token`."""
    assert (err.source_name, err.line, err.column) == (source, line, column)
    rendered = str(err).splitlines()
    assert rendered[0].startswith(f"{source}:{line}:{column}: error: ")
    gutter = f"{line} | "
    assert rendered[1].startswith(gutter)
    caret = rendered[2].index("^")
    assert rendered[1][caret:].startswith(token)
    assert caret == len(gutter) + column - 1


@pytest.mark.parametrize(
    ("body", "line", "column", "token", "message"),
    [
        ("  foo(%x)", 3, 3, "foo", "operator `foo` not found"),
        ("  add(%x, %y)", 3, 11, "%y", "undefined variable %y"),
        ("  %0 = add(%x, %x);\n  %7", 4, 3, "%7", "undefined graph variable %7"),
        ("  nn.softmax(%x, axes=1)", 3, 18, "axes", "unknown attribute(s) axes"),
        ("  reshape(%x)", 3, 3, "reshape", "missing required attribute(s) newshape"),
        ("  nn.softmax(%x, axis=1, axis=2)", 3, 26, "axis", "given twice"),
        ("  add(%x, 1.5)", 3, 11, "1.5", "needs a float suffix"),
        ("  ref(%x)", 3, 3, "ref", "does not support references"),
        ("  match (%x) { Nope => 1 }", 3, 16, "Nope", "expected a pattern"),
        ("  add(%x, %x", 4, 1, "}", "expected `)` to close the argument list"),
        ("  %x +", 4, 1, "}", "expected an expression"),
        ("  @nowhere(%x)", 3, 3, "@nowhere", "undefined global function @nowhere"),
        ("  add(%x, meta[relay.attrs.Conv2DAttrs][0])", 3, 11, "meta", "does not support attribute objects"),
        ('  "unterminated', 3, 3, '"', "unterminated string"),
        ("  /* never closed", 3, 3, "/*", "unterminated block comment"),
    ],
)
def test_errors_point_at_the_offending_token(body: str, line: int, column: int, token: str, message: str) -> None:
    text = HEADER + "def @main(%x: float32) {\n" + body + "\n}\n"
    with pytest.raises(ParseError) as info:
        parse_module(text, source_name="model.relay")
    assert message in info.value.message
    check_location(info.value, "model.relay", line, column, token)


def test_module_level_errors() -> None:
    err = parse_error("def @main() { 1 }")
    assert "missing version header" in err.message and (err.line, err.column) == (1, 1)
    err = parse_error('#[version = "0.0.4"]\ndef @main() { 1 }')
    assert "unsupported text format version" in err.message
    err = parse_error(HEADER + "def @f() { 1 }\ndef @g() { 2 }\ndef @f() { 3 }")
    assert "duplicate definition of global function @f" in err.message
    check_location(err, "from_string", 4, 5, "@f")
    err = parse_error(HEADER + "type List[A] {\n  Cons(A, List[A]),\n  Cons,\n}")
    assert "constructor `Cons` is already defined" in err.message and (err.line, err.column) == (4, 3)
    err = parse_error(HEADER + "extern type T")
    assert "algebraic data type" in err.message
    err = parse_error(HEADER + "def @f() { 1 }\n#[metadata]\n{\"root\": 1}")
    assert "#[metadata]" in err.message and (err.line, err.column) == (3, 1)
    err = parse_error(HEADER + "def @f(%x, %x) { %x }")
    assert "duplicate parameter %x" in err.message
    err = parse_error(HEADER + "def @f(%x {virtual_device=1}) { %x }")
    assert "parameter attributes" in err.message
    err = parse_error(HEADER + "#[foo]")
    assert "unsupported file attribute" in err.message
    err = parse_error(HEADER + "def @f() { 1 }\n1")
    assert "expected a definition" in err.message and (err.line, err.column) == (3, 1)
    assert isinstance(err, RelayTuneError)


def test_error_locations_count_characters_not_bytes() -> None:
    err = parse_error(HEADER + 'def @f() {\n  cast(1, dtype="é"); foo(1)\n}')
    check_location(err, "from_string", 3, 23, "foo")


# ---------------------------------------------------------------------- bytes, files, sidecars
def test_invalid_utf8_is_a_parse_error(tmp_path: Path) -> None:
    data = (HEADER + "def @f() {\n  1\n}\n").encode()
    broken = data.replace(b"  1", b"  \xff1")
    with pytest.raises(ParseError) as info:
        parse_module_bytes(broken, "bytes.relay")
    assert "invalid UTF-8 byte 0xff" in info.value.message and (info.value.line, info.value.column) == (3, 3)
    path = tmp_path / "broken.relay"
    path.write_bytes(broken)
    with pytest.raises(ParseError):
        load_module(path)
    assert parse_module_bytes(b"\xef\xbb\xbf" + data) == parse_module(HEADER + "def @f() { 1 }")


def test_load_module_with_sidecar(tmp_path: Path) -> None:
    (tmp_path / "tiny.relay").write_text(
        HEADER + "def @main(%x: Tensor[(2, 3), float32]) {\n"
        "  %0 = add(%x, meta[relay.Constant][0]);\n  take(%0, meta[relay.Constant][1])\n}\n"
    )
    sidecar = {"relay.Constant": [{"dtype": "float32", "shape": [2, 3]}, {"dtype": "int64", "shape": [4]}]}
    (tmp_path / "tiny.consts.json").write_text(json.dumps(sidecar))
    mod = load_module(tmp_path / "tiny.relay")
    assert mod == load_module(str(tmp_path / "tiny.relay"))  # seeded: same values again
    take = mod["main"].body
    assert isinstance(take, Call)
    weights, indices = take.args[0].args[1].data, take.args[1].data  # type: ignore[attr-defined]
    assert weights.shape == (2, 3) and weights.dtype == np.float32 and 0 < np.abs(weights).max() < 1
    assert indices.dtype == np.int64 and indices.min() >= 0 and indices.max() < 4
    assert mod != load_module(tmp_path / "tiny.relay", seed=1)
    # an explicit sidecar path wins over the default one
    (tmp_path / "other.json").write_text(json.dumps({"relay.Constant": [sidecar["relay.Constant"][0]] * 2}))
    other = load_module(tmp_path / "tiny.relay", consts=tmp_path / "other.json")
    assert other["main"].body.args[1].data.dtype == np.float32  # type: ignore[attr-defined]
    (tmp_path / "nometa.relay").write_text(HEADER + "def @main() { 1 }")
    assert load_module(tmp_path / "nometa.relay")["main"].body == Constant(np.array(1, "int32"))


def test_sidecar_dtypes_and_errors(tmp_path: Path) -> None:
    entries = [{"dtype": d, "shape": [3]} for d in ("float16", "float64", "uint8", "int32", "bool")]
    path = tmp_path / "c.consts.json"
    path.write_text(json.dumps({"relay.Constant": entries}))
    arrays = load_constants_sidecar(path, seed=3)
    assert [str(a.dtype) for a in arrays] == ["float16", "float64", "uint8", "int32", "bool"]
    assert all(a.shape == (3,) for a in arrays)
    for bad, message in [
        ("{", "invalid JSON"),
        ("[]", '"relay.Constant" list'),
        ('{"relay.Constant": [{"dtype": "float32"}]}', '"shape" list'),
        ('{"relay.Constant": [{"dtype": "float32", "shape": [-1]}]}', "non-negative"),
        ('{"relay.Constant": [{"dtype": "nonsense", "shape": [1]}]}', "unknown dtype"),
    ]:
        path.write_text(bad)
        with pytest.raises(ParseError) as info:
            load_constants_sidecar(path)
        assert message in info.value.message


# ---------------------------------------------------------------------- size and depth
def test_ten_thousand_graph_bindings() -> None:
    n = 10_000
    lines = [HEADER + "def @main(%x: Tensor[(4), float32]) -> Tensor[(4), float32] {", "  %0 = nn.relu(%x);"]
    lines += [f"  %{i} = add(%{i - 1}, %x);" for i in range(1, n)]
    lines += [f"  %{n - 1}", "}"]
    mod = parse_module("\n".join(lines))
    node = mod["main"].body
    depth = 0
    while isinstance(node, Call) and node.op_name == "add":
        node = node.args[0]
        depth += 1
    assert depth == n - 1 and isinstance(node, Call) and node.op_name == "nn.relu"


def test_ten_thousand_let_bindings() -> None:
    n = 10_000
    text = "free_var %x: float32;\n" + "".join(f"let %v{i} = add(%x, 1f);\n" for i in range(n)) + "%v0"
    expr = parse_expr(text)
    lets = 0
    while isinstance(expr, Let):
        expr = expr.body
        lets += 1
    assert lets == n and isinstance(expr, Var) and expr.name_hint == "v0"


def test_deep_nesting_is_not_a_recursion_error() -> None:
    with pytest.raises(ParseError) as info:
        parse_expr("(" * 10_000)
    assert info.value.column == 10_001
    assert structural_equal(parse_expr("(" * 10_000 + "1" + ")" * 10_000), Constant(np.array(1, "int32")))
    calls = parse_expr("nn.relu(" * 10_000 + "1f" + ")" * 10_000)
    assert isinstance(calls, Call)
    with pytest.raises(ParseError):
        parse_expr("fn () {" * 10_000)
    with pytest.raises(ParseError):
        parse_expr("[" * 10_000)
    with pytest.raises(ParseError) as attr_info:
        parse_expr("free_var %x: float32; reshape(%x, newshape=" + "[" * 10_000)
    assert "nested more than" in attr_info.value.message
    with pytest.raises(ParseError) as type_info:
        parse_expr("free_var %x: " + "(" * 10_000)
    assert "nested more than" in type_info.value.message
