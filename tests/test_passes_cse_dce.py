"""EliminateCommonSubexpr and DeadCodeElimination."""

from __future__ import annotations

import numpy as np

from relay_tune.interpreter import evaluate
from relay_tune.ir import (
    Call,
    Expr,
    Function,
    GlobalVar,
    IRModule,
    Let,
    TensorType,
    Tuple,
    TupleGetItem,
    Var,
    const,
    op,
)
from relay_tune.op.registry import get_op
from relay_tune.passes import DeadCodeElimination, EliminateCommonSubexpr
from relay_tune.passes.base import dataflow_post_order
from relay_tune.type_infer import infer_types

T = TensorType((2, 3), "float32")
RNG = np.random.default_rng(5)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def module(params: list[Var], body: Expr, **others: Function) -> IRModule:
    return infer_types(IRModule({"main": Function(tuple(params), body), **others}))


def count(mod: IRModule, name: str) -> int:
    return sum(1 for n in dataflow_post_order(mod["main"]) if isinstance(n, Call) and n.op_name == name)


# ---------------------------------------------------------------------------------------------------------------------
# CSE
# ---------------------------------------------------------------------------------------------------------------------


def test_identical_calls_are_computed_once() -> None:
    x = Var("x", T)
    body = call("add", call("exp", x), call("exp", x))
    mod = module([x], body)
    out = EliminateCommonSubexpr().run(mod)
    assert count(out, "exp") == 1
    add = out["main"].body
    assert isinstance(add, Call) and add.args[0] is add.args[1]
    data = RNG.standard_normal((2, 3)).astype("float32")
    np.testing.assert_allclose(evaluate(out, [data]), evaluate(mod, [data]))


def test_merging_cascades_up_the_graph() -> None:
    x = Var("x", T)
    chain_a = call("nn.relu", call("add", x, const(1.0)))
    chain_b = call("nn.relu", call("add", x, const(1.0)))  # equal scalar constants, distinct nodes
    out = EliminateCommonSubexpr().run(module([x], Tuple((chain_a, chain_b))))
    assert count(out, "nn.relu") == 1 and count(out, "add") == 1


def test_different_attributes_or_constants_are_not_merged() -> None:
    x = Var("x", TensorType((4, 6), "float32"))
    body = Tuple((
        call("sum", x, axis=(0,)), call("sum", x, axis=(1,)),
        call("add", x, const(1.0)), call("add", x, const(2.0)),
    ))
    out = EliminateCommonSubexpr().run(module([x], body))
    assert count(out, "sum") == 2 and count(out, "add") == 2


def test_tuples_and_projections_are_merged() -> None:
    x = Var("x", T)
    body = call("add", TupleGetItem(Tuple((x, x)), 1), TupleGetItem(Tuple((x, x)), 1))
    out = EliminateCommonSubexpr().run(module([x], body))
    add = out["main"].body
    assert isinstance(add, Call) and add.args[0] is add.args[1]


def test_constants_themselves_are_not_shared() -> None:
    x = Var("x", T)
    one_a, one_b = const(1.0), const(1.0)
    body = Tuple((call("multiply", x, one_a), call("add", x, one_b)))
    out = EliminateCommonSubexpr().run(module([x], body))
    tup = out["main"].body
    assert isinstance(tup, Tuple)
    assert tup.fields[0].args[1] is one_a and tup.fields[1].args[1] is one_b  # type: ignore[attr-defined]


def test_no_duplicates_returns_the_same_module() -> None:
    x = Var("x", T)
    mod = module([x], call("exp", x))
    assert EliminateCommonSubexpr().run(mod) is mod


# ---------------------------------------------------------------------------------------------------------------------
# DCE
# ---------------------------------------------------------------------------------------------------------------------


def test_unused_let_is_removed_and_used_let_kept() -> None:
    x = Var("x", T)
    unused, used = Var("unused"), Var("used")
    body = Let(unused, call("exp", x), Let(used, call("negative", x), call("add", used, x)))
    mod = module([x], body)
    out = DeadCodeElimination().run(mod)
    main_body = out["main"].body
    assert isinstance(main_body, Let) and main_body.var is used
    assert count(out, "exp") == 0
    data = RNG.standard_normal((2, 3)).astype("float32")
    np.testing.assert_allclose(evaluate(out, [data]), evaluate(mod, [data]))


def test_chain_of_dead_lets_goes_in_one_run() -> None:
    x = Var("x", T)
    a, b, c = Var("a"), Var("b"), Var("c")
    body = Let(a, call("exp", x), Let(b, call("negative", a), Let(c, call("abs", b), x)))
    out = DeadCodeElimination().run(module([x], body))
    assert out["main"].body is out["main"].params[0]


def test_long_let_chain_without_recursion() -> None:
    x = Var("x", T)
    body: Expr = x
    for i in range(5000):
        v = Var(f"v{i}")
        body = Let(v, call("add", x, const(float(i))), body)
    out = DeadCodeElimination().run(module([x], body))
    assert out["main"].body is out["main"].params[0]


def test_unused_globals_removed_only_on_request() -> None:
    x = Var("x", T)
    y, z = Var("y", T), Var("z", T)
    helper = Function((y,), call("exp", y))
    unused = Function((z,), call("abs", z))
    mod = module([x], Call(GlobalVar("helper"), (x,)), helper=helper, unused=unused)
    assert set(DeadCodeElimination().run(mod)) == {"main", "helper", "unused"}
    assert set(DeadCodeElimination(remove_unused_globals=True).run(mod)) == {"main", "helper"}
