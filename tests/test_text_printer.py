"""Relay text printer: exact output forms, A-normal form, `show_types`, and the parse/print round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_tune.errors import UnsupportedError
from relay_tune.ir import (
    ANY,
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    IRModule,
    Let,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
    op,
    structural_equal,
)
from relay_tune.op import get_op
from relay_tune.text import (
    parse_expr,
    parse_module,
    parse_module_with_annotations,
    parse_type,
    print_expr,
    print_module,
    print_type,
)

HEADER = '#[version = "0.0.5"]\n'
F32 = TensorType((), "float32")
T23 = TensorType((2, 3), "float32")


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def body_text(expr: Expr, **kwargs: object) -> str:
    """`print_expr` without the version header."""
    text = print_expr(expr, **kwargs)  # type: ignore[arg-type]
    assert text.startswith(HEADER)
    return text[len(HEADER) :].rstrip("\n")


def round_trip_module(mod: IRModule) -> IRModule:
    constants: list[np.ndarray] = []
    text = print_module(mod, constants_out=constants)
    again = parse_module(text, constants=constants)
    assert again == mod, text
    assert print_module(again, constants_out=[]) == text  # printing is a fixpoint
    return again


# ---------------------------------------------------------------------- literals and attributes
@pytest.mark.parametrize(
    ("value", "dtype", "text"),
    [
        (42, "int16", "42i16"),
        (42, "int32", "42"),
        (-42, "int64", "-42i64"),
        (7, "int8", "7i8"),
        (3, "float16", "3f16"),
        (3, "float32", "3f"),
        (3, "float64", "3f64"),
        (1e-05, "float32", "1e-05f"),
        (0.797885, "float32", "0.797885f"),
        (1e10, "float32", "1e+10f"),
        (-0.5, "float32", "-0.5f"),
        (float(np.finfo(np.float32).max), "float32", "3.4028234663852886e+38f"),  # shortest form overflows
        (65504, "float16", "6.55e+04f16"),
        (1e-45, "float32", "1e-45f"),
        (float("inf"), "float32", "inff"),
        (float("-inf"), "float16", "-inff16"),
        (float("nan"), "float64", "nanf64"),
        (True, "bool", "True"),
        (False, "bool", "False"),
    ],
)
def test_scalar_constants_print_as_literals(value: object, dtype: str, text: str) -> None:
    const = Constant(np.array(value, dtype=dtype))
    assert body_text(const) == text
    assert structural_equal(parse_expr(print_expr(const)), const)


def test_other_constants_print_as_meta_references() -> None:
    tensor = Constant(np.arange(4, dtype="float32"))
    byte = Constant(np.array(3, dtype="uint8"))
    tup = Tuple((tensor, byte, tensor))
    constants: list[np.ndarray] = []
    assert body_text(tup, constants_out=constants) == (
        "(meta[relay.Constant][0], meta[relay.Constant][1], meta[relay.Constant][0])"
    )
    assert len(constants) == 2 and constants[1].dtype == np.uint8
    assert parse_expr(print_expr(tup), constants=constants) == tup
    assert "meta[relay.Constant][0]" in print_expr(tensor)  # numbering works without a list too


def test_only_non_default_attributes_are_printed() -> None:
    x = Var("x", T23)
    assert body_text(call("nn.softmax", x)) == "free_var %x: Tensor[(2, 3), float32];\nnn.softmax(%x)"
    assert body_text(call("nn.softmax", x, axis=2)).endswith("nn.softmax(%x, axis=2)")
    assert body_text(call("expand_dims", x, axis=2, num_newaxis=2)).endswith("expand_dims(%x, axis=2, num_newaxis=2)")
    conv = call("nn.conv2d", x, x, padding=(1, 1, 1, 1), channels=4, kernel_size=(3, 3), out_dtype="float32")
    assert body_text(conv).endswith(
        'nn.conv2d(%x, %x, padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3], out_dtype="float32")'
    )
    values = call("strided_slice", x, begin=(0, -1), end=(ANY, 2), strides=None)
    assert body_text(values).endswith("strided_slice(%x, begin=[0, -1], end=[?, 2])")
    floats = call("clip", x, a_min=float("-inf"), a_max=1e-05)
    assert body_text(floats).endswith("clip(%x, a_min=-inff, a_max=1e-05f)")
    pad = call("nn.pad", x, Constant(np.array(0, "float32")), pad_width=((0, 0), (1, 1)))
    assert body_text(pad).endswith("nn.pad(%x, 0f, pad_width=[[0, 0], [1, 1]])")


def test_attributes_of_functions_and_non_operator_calls() -> None:
    x = Var("x", T23)
    func = Function((x,), call("reshape", x, newshape=(-1,)), None, {"Primitive": 1, "TestAttribute": None})
    text = body_text(func)
    assert text.startswith("fn (%x: Tensor[(2, 3), float32], Primitive=1, TestAttribute=None) {")
    assert "reshape(%x, newshape=[-1])" in text
    glob = Call(GlobalVar("f"), (x,), {"name": "func_call_attrs", "big": 1e300, "flag": True})
    assert body_text(glob).endswith('@f(%x, name="func_call_attrs", big=1e+300f64, flag=True)')
    assert structural_equal(parse_expr(print_expr(glob)), glob, map_free_vars=True)
    with pytest.raises(UnsupportedError):
        print_expr(Call(GlobalVar("f"), (), {"name": 'has "quotes"'}))


# ---------------------------------------------------------------------- layout
def test_a_normal_form_and_let_printing() -> None:
    tup = Tuple((Constant(np.array(0, "int32")), Constant(np.array(0, "int32"))))
    x = Var("x")
    assert body_text(Let(x, tup, tup)) == "%0 = (0, 0);\nlet %x = %0;\n%0"
    y = Var("y", F32)
    nested = call("nn.relu", call("negative", call("add", y, y)))
    assert body_text(nested) == (
        "free_var %y: float32;\n%0 = add(%y, %y);\n%1 = negative(%0);\nnn.relu(%1)"
    )
    anon = Let(Var(""), tup, Tuple(()))
    assert body_text(anon) == "let %v = (0, 0);\n()"


def test_module_layout_sorted_globals_and_unique_names() -> None:
    x1, x2 = Var("x", F32), Var("x", F32)
    helper = Function((x1,), call("add", x1, x1), F32)
    main = Function((x2,), Call(GlobalVar("helper"), (x2,)), F32)
    text = print_module(IRModule({"main": main, "helper": helper}))
    assert text == (
        HEADER
        + "def @helper(%x: float32) -> float32 {\n  add(%x, %x)\n}\n\n"
        + "def @main(%x1: float32) -> float32 {\n  @helper(%x1)\n}\n"
    )
    odd = [Var(name, F32) for name in ("1x", "a.b", "", "é", "x", "x1", "x")]
    func = Function(tuple(odd), Tuple(tuple(odd)))
    printed = body_text(func).splitlines()[0]
    assert printed.startswith(
        "fn (%v1x: float32, %a_b: float32, %v: float32, %_: float32, %x: float32, %x1: float32, %x2: float32)"
    )
    assert structural_equal(parse_expr(print_expr(func)), func)


def test_fused_function_layout() -> None:
    data, p0 = Var("data", T23), Var("p0", T23)
    fused = Function((p0,), call("nn.relu", p0), T23, {"Primitive": 1})
    mod = IRModule({"main": Function((data,), Call(fused, (data,)), T23)})
    assert print_module(mod) == HEADER + (
        "def @main(%data: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {\n"
        "  %0 = fn (%p0: Tensor[(2, 3), float32], Primitive=1) -> Tensor[(2, 3), float32] {\n"
        "    nn.relu(%p0)\n"
        "  };\n"
        "  %0(%data)\n"
        "}\n"
    )
    round_trip_module(mod)


def test_if_and_shared_let_layout() -> None:
    c, x = Var("c", TensorType((), "bool")), Var("x", F32)
    shared = call("add", x, x)
    inner = Let(Var("z"), x, Var("z"))  # a let used as an operand, twice
    inner = Let(inner.var, x, inner.var)
    cond = If(c, Tuple((shared, shared)), Tuple((inner, inner)))
    text = body_text(cond)
    assert text == (
        "free_var %c: bool;\nfree_var %x: float32;\n"
        "if (%c) {\n  %0 = add(%x, %x);\n  (%0, %0)\n} else {\n  %1 = (\n    let %z = %x;\n    %z\n  );\n  (%1, %1)\n}"
    )
    assert structural_equal(parse_expr(print_expr(cond)), cond, map_free_vars=True)


# ---------------------------------------------------------------------- types
@pytest.mark.parametrize(
    "text",
    [
        "float32", "int8x4", "Tensor[(1), float32]", "Tensor[(?, 3), int64]", "()", "(int32,)",
        "(int32, (bool, float16))", "fn () -> int32", "fn (int32, Tensor[(2), float32]) -> (int32,)",
        "fn [A, B](A, B) -> A", "_",
    ],
)
def test_type_printing_round_trips(text: str) -> None:
    assert print_type(parse_type(text)) == text


def test_show_types() -> None:
    x = Var("x", TensorType((2,), "float32"))
    one = Constant(np.array(1, "float32"))
    add = call("add", x, one)
    relu = call("nn.relu", add)
    tup = Tuple((add, relu))
    t2 = TensorType((2,), "float32")
    typed: list[tuple[Expr, Type]] = [(one, F32), (add, t2), (relu, t2), (tup, TupleType((t2, t2)))]
    for node, ty in typed:
        node.set_checked_type(ty)
    func = Function((x,), tup, TupleType((t2, t2)))
    mod = IRModule({"main": func})
    text = print_module(mod, show_types=True)
    assert "%0 = add(%x, 1f) /* ty=Tensor[(2), float32] */;" in text
    assert "%1 = nn.relu(%0) /* ty=Tensor[(2), float32] */;" in text
    assert "(%0, %1) /* ty=(Tensor[(2), float32], Tensor[(2), float32]) */" in text
    assert "/* ty=" not in print_module(mod)
    parsed, annotations = parse_module_with_annotations(text)
    assert parsed == mod
    got = [(node, ty) for node, ty in annotations]
    assert [ty for _, ty in got] == [t2, t2, TupleType((t2, t2))]
    body = parsed["main"].body
    assert isinstance(body, Tuple)
    assert got[0][0] is body.fields[0] and got[1][0] is body.fields[1] and got[2][0] is body
    # untyped nodes get no comment; a typed let value and a typed final atom do
    v = Var("v")
    let = Let(v, one, v)
    v.set_checked_type(F32)
    assert body_text(let, show_types=True) == "let %v = 1f /* ty=float32 */;\n%v /* ty=float32 */"


# ---------------------------------------------------------------------- size
def test_large_and_deep_programs_print_without_recursion() -> None:
    x = Var("x", F32)
    expr: Expr = x
    for _ in range(10_000):
        expr = call("add", expr, x)
    func = Function((x,), expr)
    text = print_expr(func)
    assert text.count("\n") == 10_000 + 3
    assert structural_equal(parse_expr(text), func)
    lets: Expr = x
    for i in range(10_000):
        lets = Let(Var(f"v{i}"), call("negative", x), lets)
    assert structural_equal(parse_expr(print_expr(Function((x,), lets))), Function((x,), lets))
    nested: Expr = Constant(np.array(1, "int32"))
    for _ in range(3_000):
        nested = Function((), nested)
    assert structural_equal(parse_expr(print_expr(nested)), nested)


# ---------------------------------------------------------------------- round-trip property
TYPES = st.sampled_from(
    [None, F32, T23, TensorType((ANY, 4), "int64"), TensorType((), "bool"), TupleType((F32, T23)), TupleType(())]
)
NAMES = st.sampled_from(["x", "x", "y", "p0", "1a", "", "a.b", "x1", "data"])
SCALARS = st.one_of(
    st.builds(lambda v: Constant(np.array(v, "int32")), st.integers(-(2**31), 2**31 - 1)),
    st.builds(lambda v: Constant(np.array(v, "int64")), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: Constant(np.array(v, "int16")), st.integers(-(2**15), 2**15 - 1)),
    st.builds(lambda v: Constant(np.array(v, "float32")), st.floats(width=32)),
    st.builds(lambda v: Constant(np.array(v, "float16")), st.floats(width=16)),
    st.builds(lambda v: Constant(np.array(v, "float64")), st.floats()),
    st.builds(lambda v: Constant(np.array(v, "bool")), st.booleans()),
    st.builds(lambda v: Constant(np.array(v, "uint8")), st.integers(0, 255)),
    st.builds(lambda n: Constant(np.arange(n, dtype="float32")), st.integers(0, 3)),
)
ATTR_FLOATS = st.floats(allow_nan=False)  # NaN attributes never compare equal, even to themselves


def choose(draw: st.DrawFn, nodes: list[Expr]) -> Expr:
    return nodes[draw(st.integers(0, len(nodes) - 1))]


@st.composite
def programs(draw: st.DrawFn) -> IRModule:
    """Small random modules: DAGs of calls, tuples, lets, ifs, closures and calls between globals."""
    functions: dict[str, Function] = {}
    for name in draw(st.sampled_from([["main"], ["main", "helper"], ["b", "a", "main"]])):
        params = [Var(draw(NAMES), draw(TYPES)) for _ in range(draw(st.integers(0, 3)))]
        nodes: list[Expr] = list(params) or [Constant(np.array(0, "int32"))]
        lets: list[tuple[Var, Expr]] = []
        for _ in range(draw(st.integers(1, 10))):
            kind = draw(st.integers(0, 11))
            if kind == 0:
                node: Expr = draw(SCALARS)
            elif kind == 1:
                op_name = draw(st.sampled_from(["add", "multiply", "less"]))
                node = call(op_name, choose(draw, nodes), choose(draw, nodes))
            elif kind == 2:
                node = call("nn.softmax", choose(draw, nodes), axis=draw(st.integers(-4, 4)))
            elif kind == 3:
                newshape = tuple(draw(st.lists(st.integers(-1, 8), max_size=3)))
                node = call("reshape", choose(draw, nodes), newshape=newshape)
            elif kind == 4:
                node = call("nn.leaky_relu", choose(draw, nodes), alpha=draw(ATTR_FLOATS))
            elif kind == 5:
                node = Tuple(tuple(choose(draw, nodes) for _ in range(draw(st.integers(0, 3)))))
            elif kind == 6:
                node = TupleGetItem(choose(draw, nodes), draw(st.integers(0, 3)))
            elif kind == 7:
                var = Var(draw(NAMES), draw(TYPES))
                lets.append((var, choose(draw, nodes)))
                node = var
            elif kind == 8:
                node = If(choose(draw, nodes), choose(draw, nodes), choose(draw, nodes))
            elif kind == 9:
                inner = Var(draw(NAMES), draw(TYPES))
                body = call("add", inner, choose(draw, nodes))  # closes over an outer node
                attrs = {"Primitive": 1} if draw(st.booleans()) else {}
                node = Call(Function((inner,), body, draw(TYPES), attrs), (choose(draw, nodes),))
            elif kind == 10:
                target = draw(st.sampled_from(sorted(functions) or ["main"]))
                node = Call(GlobalVar(target), (choose(draw, nodes),))
            else:
                node = call("cast", choose(draw, nodes), dtype=draw(st.sampled_from(["int8", "float16", ""])))
            nodes.append(node)
        body = nodes[-1] if draw(st.booleans()) else Tuple(tuple(nodes[-3:]))
        for var, value in reversed(lets):
            body = Let(var, value, body)
        functions[name] = Function(tuple(params), body, draw(TYPES), {"Inline": 1} if draw(st.booleans()) else {})
    return IRModule(functions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_round_trip_property(mod: IRModule) -> None:
    round_trip_module(mod)


def test_round_trip_keeps_sharing() -> None:
    x = Var("x", F32)
    shared = call("nn.relu", x)
    twice = call("add", shared, shared)
    again = round_trip_module(IRModule({"main": Function((x,), twice)}))
    body = again["main"].body
    assert isinstance(body, Call) and body.args[0] is body.args[1]
