"""Type inference: every node typed, annotations checked, holes inferred, clear errors."""

from __future__ import annotations

import pytest

import relay_tune.type_infer as type_infer
from relay_tune.errors import RelayTypeError, UnknownOperatorError, UnsupportedError
from relay_tune.ir import (
    ANY,
    Call,
    Function,
    FuncType,
    GlobalVar,
    If,
    IncompleteType,
    IRModule,
    Let,
    Span,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    TypeVar,
    Var,
    const,
    op,
    post_order,
)
from relay_tune.ir.expr import Op
from relay_tune.op.registry import get_op
from relay_tune.text import parse_expr, parse_module
from relay_tune.type_infer import infer_expr, infer_expr_type, infer_types

F32 = "float32"


def tt(*shape: object, dtype: str = F32) -> TensorType:
    return TensorType(tuple(shape), dtype)  # type: ignore[arg-type]


def assert_all_typed(mod: IRModule) -> None:
    for func in mod.values():
        for node in post_order(func):
            if not isinstance(node, Op):
                assert node.has_type(), f"untyped node {node!r}"


def main_type(text: str) -> FuncType:
    mod = infer_types(parse_module(text, "t.relay"))
    assert_all_typed(mod)
    ty = mod.main.checked_type
    assert isinstance(ty, FuncType)
    return ty


# ------------------------------------------------------------------------------------------------
# Basics
# ------------------------------------------------------------------------------------------------


def test_conv_chain_types_every_node_and_returns_same_module_when_annotated() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 3, 32, 32), float32], %w: Tensor[(8, 3, 3, 3), float32], %b: Tensor[(8), float32]) {
  %0 = nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1], channels=8, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, %b);
  %2 = nn.max_pool2d(%1, pool_size=[2, 2], strides=[2, 2]);
  nn.softmax(%2, axis=1)
}
"""
    mod = parse_module(text, "t.relay")
    typed = infer_types(mod)
    assert_all_typed(typed)
    # The return type was missing, so the function is rebuilt with it filled in.
    assert typed is not mod and typed.main.ret_type == tt(1, 8, 8, 8)
    assert typed.main.checked_type == FuncType((tt(1, 3, 32, 32), tt(8, 3, 3, 3), tt(8)), tt(1, 8, 8, 8))
    again = infer_types(typed)
    assert again is typed  # fully annotated now: nothing to rebuild


def test_let_tuple_projection_and_if() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 3), float32], %c: bool) -> (Tensor[(2, 3), float32], Tensor[(3), float32]) {
  let %t = (%x, meta[relay.Constant][0]);
  let %y: Tensor[(2, 3), float32] = if (%c) { %t.0 } else { nn.softmax(%x) };
  (%y, %t.1)
}
"""
    mod = infer_types(parse_module(text, "t.relay", [const([1.0, 2.0, 3.0]).data]))
    assert_all_typed(mod)
    body = mod.main.body
    assert isinstance(body, Let)
    assert body.var.checked_type == TupleType((tt(2, 3), tt(3)))
    assert body.value.checked_type == body.var.checked_type


def test_dynamic_dims() -> None:
    ty = main_type("""#[version = "0.0.5"]
def @main(%x: Tensor[(?, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32]) -> Tensor[(?, 4, 6, 6), float32] {
  nn.conv2d(%x, %w)
}
""")
    assert ty.ret_type == tt(ANY, 4, 6, 6)
    # A `?` annotation accepts a static value and vice versa.
    main_type("""#[version = "0.0.5"]
def @f(%x: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] { %x }
def @main(%x: Tensor[(5, 3), float32]) -> Tensor[(?, 3), float32] { @f(%x) }
""")


# ------------------------------------------------------------------------------------------------
# Functions: literals, globals, recursion, polymorphism, function types
# ------------------------------------------------------------------------------------------------


def test_primitive_function_literal_called_through_graph_binding() -> None:
    ty = main_type("""#[version = "0.0.5"]
def @main(%a: Tensor[(5, 7), float32]) {
  %0 = fn (%p0: Tensor[(5, 7), float32], Primitive=1) { nn.softmax(%p0) };
  %0(%a)
}
""")
    assert ty.ret_type == tt(5, 7)


def test_untyped_function_literal_params_are_inferred_from_the_call() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 4, 8, 8), float32], %w: Tensor[(6, 4, 3, 3), float32]) {
  %0 = fn (%p, %q, PartitionedFromPattern="nn.conv2d_") {
    nn.conv2d(%p, %q, padding=[1, 1])
  };
  %1 = %0(%x, %w);
  nn.softmax(%1, axis=1)
}
"""
    typed = infer_types(parse_module(text, "t.relay"))
    assert_all_typed(typed)
    literal = next(n for n in post_order(typed.main) if isinstance(n, Function) and n is not typed.main)
    assert [p.type_annotation for p in literal.params] == [tt(1, 4, 8, 8), tt(6, 4, 3, 3)]
    assert literal.ret_type == tt(1, 6, 8, 8)
    assert typed.main.ret_type == tt(1, 6, 8, 8)


def test_let_bound_closure_and_local_recursion() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(3), float32], %c: bool) {
  let %f = fn (%y: Tensor[(3), float32], %k: bool) {
    if (%k) { %f(nn.softmax(%y), False) } else { %y }
  };
  %f(%x, %c)
}
"""
    assert main_type(text).ret_type == tt(3)


def test_forward_reference_and_mutual_recursion() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 2), float32], %c: bool) -> Tensor[(2, 2), float32] {
  @even(%x, %c)
}
def @even(%x: Tensor[(2, 2), float32], %c: bool) -> Tensor[(2, 2), float32] {
  if (%c) { @odd(%x, False) } else { %x }
}
def @odd(%x: Tensor[(2, 2), float32], %c: bool) -> Tensor[(2, 2), float32] {
  if (%c) { %x } else { @even(nn.softmax(%x), True) }
}
"""
    mod = infer_types(parse_module(text, "t.relay"))
    assert_all_typed(mod)


def test_recursive_global_return_type_is_inferred() -> None:
    text = """#[version = "0.0.5"]
def @loop(%x: Tensor[(4), float32], %c: bool) {
  if (%c) { @loop(nn.softmax(%x), False) } else { %x }
}
def @main(%x: Tensor[(4), float32]) { @loop(%x, True) }
"""
    mod = infer_types(parse_module(text, "t.relay"))
    assert mod["loop"].ret_type == tt(4)
    assert mod.main.ret_type == tt(4)


def test_polymorphic_identity_instantiated_per_call() -> None:
    text = """#[version = "0.0.5"]
def @id[A](%x: A) -> A { %x }
def @main(%f: float32, %t: Tensor[(2, 3), int8]) {
  (@id(%f), @id(%t), @id((%f, %t)))
}
"""
    mod = infer_types(parse_module(text, "t.relay"))
    assert mod.main.ret_type == TupleType((tt(), tt(2, 3, dtype="int8"), TupleType((tt(), tt(2, 3, dtype="int8")))))
    a = TypeVar("A")
    assert mod["id"].checked_type == FuncType((a,), a, (a,))


def test_operator_on_polymorphic_value_is_an_error() -> None:
    text = """#[version = "0.0.5"]
def @f[A](%x: A) -> A { nn.softmax(%x) }
"""
    with pytest.raises(RelayTypeError, match="polymorphic type A"):
        infer_types(parse_module(text, "t.relay"))


def test_function_types_and_globals_as_values() -> None:
    text = """#[version = "0.0.5"]
def @aux(%x: Tensor[(), int32]) -> Tensor[(), int32] { %x }
def @main() -> fn (Tensor[(), int32]) -> Tensor[(), int32] { @aux }
"""
    ty = main_type(text)
    assert ty.ret_type == FuncType((tt(dtype="int32"),), tt(dtype="int32"))
    bad = text.replace("def @main() -> fn (Tensor[(), int32]) -> Tensor[(), int32]",
                       "def @main() -> fn (Tensor[(), int32]) -> Tensor[(), float32]")
    with pytest.raises(RelayTypeError, match="return type"):
        infer_types(parse_module(bad, "t.relay"))


def test_higher_order_parameter_is_inferred() -> None:
    text = """#[version = "0.0.5"]
def @apply(%f, %x: Tensor[(2), float32]) { %f(%x) }
def @main(%x: Tensor[(2), float32]) {
  @apply(fn (%y: Tensor[(2), float32]) { nn.softmax(%y) }, %x)
}
"""
    mod = infer_types(parse_module(text, "t.relay"))
    assert mod["apply"].params[0].type_annotation == FuncType((tt(2),), tt(2))
    assert mod["apply"].ret_type == tt(2)


def test_incomplete_type_annotation_is_filled() -> None:
    x = Var("x", IncompleteType())
    mod = IRModule({"f": Function((x,), x), "main": Function((), Call(GlobalVar("f"), (const([1.0, 2.0]),)))})
    typed = infer_types(mod)
    assert typed["f"].params[0].type_annotation == tt(2)
    assert typed["f"].ret_type == tt(2)


def test_infer_expr_type_and_infer_expr() -> None:
    expr = parse_expr("""fn (%x: Tensor[(1), float32], %y) { (%x, nn.softmax(%y)) }""")
    with pytest.raises(RelayTypeError, match=r"nn\.softmax.*cannot infer the type of argument 0 \(%y\)"):
        infer_expr_type(expr)
    x = Var("x", tt(2, 3))
    call = Call(op("nn.softmax"), (x,))
    assert infer_expr_type(call) == tt(2, 3)
    assert x.checked_type == tt(2, 3)
    y = Var("y")
    fn = Function((y,), y)
    applied = Call(fn, (const([[1.0]]),))
    assert infer_expr_type(applied) == tt(1, 1)
    y2 = Var("y2")
    filled = infer_expr(Function((Var("z", tt(2)),), Call(Function((y2,), y2), (const(1.0),))))
    assert isinstance(filled, Function) and filled.ret_type == tt()
    inner = filled.body
    assert isinstance(inner, Call) and isinstance(inner.op, Function)
    assert inner.op.params[0].type_annotation == tt()


def test_global_function_with_unannotated_params_called_from_main() -> None:
    x, y = Var("x"), Var("y")
    helper = Function((x, y), Call(op("nn.dense"), (x, y)))
    a = Var("a", tt(4, 5))
    w = Var("w", tt(6, 5))
    mod = IRModule({"helper": helper, "main": Function((a, w), Call(GlobalVar("helper"), (a, w)))})
    typed = infer_types(mod)
    assert [p.type_annotation for p in typed["helper"].params] == [tt(4, 5), tt(6, 5)]
    assert typed["helper"].ret_type == tt(4, 6)
    assert typed.main.ret_type == tt(4, 6)
    assert_all_typed(typed)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------


def test_conv_error_names_operator_location_and_shapes() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 64, 56, 56), float32], %w: Tensor[(1, 32, 3, 3), float32]) {
  %0 = nn.relu(%x);
  nn.conv2d(%0, %w, padding=[1, 1])
}
"""
    with pytest.raises(RelayTypeError) as err:
        infer_types(parse_module(text, "model.relay"))
    message = str(err.value)
    assert "nn.conv2d" in message and "model.relay:4:3" in message
    assert "1x64x56x56" in message and "1x32x3x3" in message and "expected 64 input channels" in message
    assert err.value.span is not None and err.value.op_name == "nn.conv2d"


def test_argument_annotation_mismatch() -> None:
    text = """#[version = "0.0.5"]
def @f(%x: Tensor[(1, 3), float32]) -> Tensor[(1, 3), float32] { %x }
def @main(%y: Tensor[(1, 4), float32]) { @f(%y) }
"""
    with pytest.raises(RelayTypeError) as err:
        infer_types(parse_module(text, "t.relay"))
    message = str(err.value)
    assert "@f" in message and "%x" in message and "Tensor[(1, 3), float32]" in message
    assert "Tensor[(1, 4), float32]" in message and "t.relay:3:" in message


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ("let %y: Tensor[(2), float32] = %x; %y", "let %y is annotated"),
        ("if (%x) { %x } else { %x }", "condition of `if`"),
        ("%x.0", "non-tuple"),
        ("(%x, %x).2", "out of range"),
        ("%x(%x)", "not a function"),
        ("nn.softmax(%x, %x)", "expects 1 argument"),
    ],
)
def test_local_errors(body: str, pattern: str) -> None:
    text = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(3), float32]) {{
  {body}
}}
"""
    with pytest.raises(RelayTypeError, match=pattern):
        infer_types(parse_module(text, "t.relay"))


def test_if_branches_must_agree() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(3), float32], %c: bool) { if (%c) { %x } else { (%x,) } }
"""
    with pytest.raises(RelayTypeError, match="branches of `if`"):
        infer_types(parse_module(text, "t.relay"))


def test_return_annotation_mismatch() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(3), float32]) -> Tensor[(3), float16] { %x }
"""
    with pytest.raises(RelayTypeError, match=r"dtype (float16 is not float32|float32 is not float16)"):
        infer_types(parse_module(text, "t.relay"))


def test_wrong_number_of_call_arguments() -> None:
    text = """#[version = "0.0.5"]
def @f(%x: Tensor[(3), float32]) -> Tensor[(3), float32] { %x }
def @main(%x: Tensor[(3), float32]) { @f(%x, %x) }
"""
    with pytest.raises(RelayTypeError, match="takes 1 argument"):
        infer_types(parse_module(text, "t.relay"))


def test_unconstrained_parameter_is_reported() -> None:
    y = Var("y")
    mod = IRModule({"main": Function((Var("x", tt(2)), y), const(1.0))})
    with pytest.raises(RelayTypeError, match="%y"):
        infer_types(mod)


def test_operator_without_relation_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_op("nn.log_softmax"), "type_relation", None)
    x = Var("x", tt(3))
    call = Call(op("nn.log_softmax"), (x,), span=Span("m.relay", 2, 4))
    with pytest.raises(RelayTypeError, match=r"m.relay:2:4.*nn.log_softmax.*no type relation"):
        infer_types(IRModule({"main": Function((x,), call)}))


def test_unknown_operator_and_operator_as_value() -> None:
    x = Var("x", tt(3))
    with pytest.raises(UnknownOperatorError, match=r"nn\.frobnicate"):
        infer_types(IRModule({"main": Function((x,), Call(op("nn.frobnicate"), (x,)))}))
    with pytest.raises(UnsupportedError, match="used as a value"):
        infer_types(IRModule({"main": Function((x,), Tuple((op("nn.softmax"),)))}))


def test_unknown_attribute_is_reported_at_the_call() -> None:
    x = Var("x", tt(3))
    call = Call(op("nn.softmax"), (x,), {"bogus": 2}, span=Span("m.relay", 7, 2))
    with pytest.raises(RelayTypeError, match=r"m\.relay:7:2.*nn\.softmax.*unknown attribute"):
        infer_types(IRModule({"main": Function((x,), call)}))


def test_unknown_global() -> None:
    x = Var("x", tt(3))
    with pytest.raises(RelayTypeError, match="@nowhere"):
        infer_types(IRModule({"main": Function((x,), Call(GlobalVar("nowhere"), (x,)))}))


def test_relation_crash_on_malformed_attrs_becomes_a_type_error() -> None:
    x = Var("x", tt(1, 3, 8, 8))
    w = Var("w", tt(4, 3, 3, 3))
    call = Call(op("nn.conv2d"), (x, w), {"data_layout": "N@HW"}, span=Span("m.relay", 5, 1))
    with pytest.raises(RelayTypeError, match=r"m\.relay:5:1"):
        infer_types(IRModule({"main": Function((x, w), call)}))


# ------------------------------------------------------------------------------------------------
# Scale: no recursion over expression depth
# ------------------------------------------------------------------------------------------------


def test_deep_let_chain_and_deep_call_chain() -> None:
    depth = 12_000
    x = Var("x", tt(4))
    # let %v1 = softmax(x); let %v2 = softmax(%v1); ... %vN  (nested lets, unannotated vars)
    vars_ = [Var(f"v{i}") for i in range(depth)]
    body: object = vars_[-1]
    for i in reversed(range(depth)):
        prev = x if i == 0 else vars_[i - 1]
        body = Let(vars_[i], Call(op("nn.softmax"), (prev,)), body)  # type: ignore[arg-type]
    mod = infer_types(IRModule({"main": Function((x,), body)}))  # type: ignore[arg-type]
    assert mod.main.ret_type == tt(4)
    assert vars_[depth // 2].checked_type == tt(4)

    y = Var("y", tt(2, 3))
    chain: object = y
    for _ in range(depth):
        chain = Call(op("nn.softmax"), (chain,))  # type: ignore[arg-type]
    assert infer_expr_type(chain) == tt(2, 3)  # type: ignore[arg-type]


def test_if_and_tuple_get_item_nodes_from_constructors() -> None:
    c = Var("c", tt(dtype="bool"))
    x = Var("x", tt(3))
    pair = Tuple((x, const(2.0)))
    expr = If(c, TupleGetItem(pair, 0), Call(op("nn.softmax"), (x,)))
    assert infer_expr_type(expr) == tt(3)
    assert pair.checked_type == TupleType((tt(3), tt()))


# --- calls checked before ------------------------------------------------------------------------


def test_a_call_checked_before_keeps_its_type_without_running_its_relation_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = Var("x", tt(2, 3))
    relu = Call(op("nn.relu"), (x,))
    summed = Call(op("add"), (relu, relu))
    infer_types(IRModule({"main": Function((x,), summed)}))
    relations: list[str] = []
    original = type_infer._Inferencer._try_op

    def counting(self, constraint):  # type: ignore[no-untyped-def]
        relations.append(constraint.opdef.name)
        return original(self, constraint)

    monkeypatch.setattr(type_infer._Inferencer, "_try_op", counting)
    # a pass rebuilt the function around the same calls: their types stand, only the new call is checked
    rebuilt = infer_types(IRModule({"main": Function((x,), Call(op("nn.relu"), (summed,)))}))
    assert relations == ["nn.relu"]
    assert rebuilt["main"].body.checked_type == tt(2, 3) and summed.checked_type == tt(2, 3)


def test_a_call_over_a_rebound_variable_is_checked_again() -> None:
    # `v` has no annotation: its type is the bound value's, so the same call nodes get another type under a
    # binding of another shape, and so does every call above them
    v = Var("v")
    relu = Call(op("nn.relu"), (v,))
    summed = Call(op("add"), (relu, relu))
    x = Var("x", tt(2, 3))
    first = infer_types(IRModule({"main": Function((x,), Let(v, x, summed))}))
    assert first["main"].body.checked_type == tt(2, 3)
    y = Var("y", tt(4, 5))
    # `relu` alone first: its cached type then matches the next binding's, `summed`'s still the old one's
    assert infer_types(IRModule({"main": Function((y,), Let(v, y, relu))}))["main"].body.checked_type == tt(4, 5)
    second = infer_types(IRModule({"main": Function((y,), Let(v, y, summed))}))
    assert second["main"].body.checked_type == tt(4, 5)
    assert summed.checked_type == tt(4, 5) and relu.checked_type == tt(4, 5)
