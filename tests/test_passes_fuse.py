"""FuseOps: golden groupings on small programs built in the test, the rewrite's shape, barriers and options."""

from __future__ import annotations

import numpy as np
import pytest

from relay_tune.interpreter import evaluate
from relay_tune.ir import (
    Call,
    Constant,
    Expr,
    Function,
    If,
    IRModule,
    Let,
    TensorType,
    Tuple,
    TupleGetItem,
    Var,
    const,
    op,
    post_order,
)
from relay_tune.op.registry import get_op
from relay_tune.passes import FuseOps, PassConfig, fused_groups
from relay_tune.passes.fuse_ops import IndexedGraph, post_dominator_tree
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(7)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def tensor(*shape: int, dtype: str = "float32") -> TensorType:
    return TensorType(shape, dtype)


def weight(*shape: int) -> Constant:
    return const(RNG.standard_normal(shape).astype("float32"))


def module(params: list[Var], body: Expr) -> IRModule:
    return infer_types(IRModule({"main": Function(tuple(params), body)}))


def fuse(mod: IRModule, opt_level: int = 3, **options: object) -> IRModule:
    """Fuse, and check on random inputs that the fused program computes exactly what the original did."""
    fused = FuseOps(**options).run(mod, PassConfig(opt_level=opt_level))  # type: ignore[arg-type]
    inputs = [RNG.standard_normal(p.checked_type.shape).astype("float32") for p in mod["main"].params]  # type: ignore[attr-defined]
    expected, actual = evaluate(mod, inputs), evaluate(fused, inputs)
    for e, a in zip(expected if isinstance(expected, tuple) else (expected,),
                    actual if isinstance(actual, tuple) else (actual,)):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)
    return fused


def primitives(mod: IRModule) -> list[Function]:
    return [
        n.op
        for n in post_order(mod["main"])
        if isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive
    ]


def conv(x: Expr, channels_in: int, channels_out: int) -> Call:
    return call("nn.conv2d", x, weight(channels_out, channels_in, 3, 3), padding=(1, 1), channels=channels_out,
                kernel_size=(3, 3))


# ---------------------------------------------------------------------------------------------------------------------
# Golden groupings
# ---------------------------------------------------------------------------------------------------------------------


def test_conv_bias_relu_is_one_group() -> None:
    x = Var("x", tensor(1, 3, 8, 8))
    body = call("nn.relu", call("nn.bias_add", conv(x, 3, 4), weight(4)))
    assert fused_groups(fuse(module([x], body))) == [("nn.conv2d", "nn.bias_add", "nn.relu")]


def test_conv_residual_add_relu_is_one_group_with_the_shortcut_as_parameter() -> None:
    x = Var("x", tensor(1, 4, 8, 8))
    y = Var("y", tensor(1, 4, 8, 8))
    body = call("nn.relu", call("add", conv(x, 4, 4), y))
    fused = fuse(module([x, y], body))
    assert fused_groups(fused) == [("nn.conv2d", "add", "nn.relu")]
    (func,) = primitives(fused)
    assert [p.name_hint for p in func.params] == ["p0", "p1", "p2"]
    outer_call = fused["main"].body
    assert isinstance(outer_call, Call)
    assert outer_call.args[0] is fused["main"].params[0]
    assert outer_call.args[2] is fused["main"].params[1]  # the shortcut is passed in by the caller


def test_resnet_basic_block_after_simplification() -> None:
    x = Var("x", tensor(1, 4, 8, 8))
    scale, shift = weight(4, 1, 1), weight(4, 1, 1)
    y = call("nn.relu", call("add", call("multiply", conv(x, 4, 4), scale), shift))
    z = call("add", call("multiply", conv(y, 4, 4), weight(4, 1, 1)), weight(4, 1, 1))
    body = call("nn.relu", call("add", z, x))
    groups = fused_groups(fuse(module([x], body)))
    assert groups == [
        ("nn.conv2d", "multiply", "add", "nn.relu"),
        ("nn.conv2d", "multiply", "add", "add", "nn.relu"),
    ]


def test_two_convolutions_in_sequence_are_two_groups() -> None:
    x = Var("x", tensor(1, 3, 8, 8))
    body = conv(call("nn.relu", conv(x, 3, 4)), 4, 4)
    assert fused_groups(fuse(module([x], body))) == [("nn.conv2d", "nn.relu"), ("nn.conv2d",)]


def test_reshape_transpose_reshape_is_one_injective_group() -> None:
    x = Var("x", tensor(2, 3, 4))
    body = call("reshape", call("transpose", call("reshape", x, newshape=(6, 4)), axes=(1, 0)), newshape=(2, 12))
    fused = fuse(module([x], body))
    assert fused_groups(fused) == [("reshape", "transpose", "reshape")]
    assert "relay.reshape_only" not in primitives(fused)[0].attrs  # transpose moves data


def test_reshape_only_group_is_marked() -> None:
    x = Var("x", tensor(2, 3, 4))
    fused = fuse(module([x], call("reshape", call("squeeze", call("expand_dims", x, axis=0)), newshape=(6, 4))))
    (func,) = primitives(fused)
    assert func.attrs["relay.reshape_only"] == 1


def test_dense_then_softmax_are_separate_groups() -> None:
    x = Var("x", tensor(2, 16))
    body = call("nn.softmax", call("add", call("nn.dense", x, weight(10, 16), units=10), weight(10)))
    assert fused_groups(fuse(module([x], body))) == [("nn.dense", "add"), ("nn.softmax",)]


def test_softmax_absorbs_following_elementwise_ops() -> None:
    x = Var("x", tensor(2, 16))
    body = call("multiply", call("nn.softmax", x), const(2.0))
    assert fused_groups(fuse(module([x], body))) == [("nn.softmax", "multiply")]


def test_exp_fuses_into_sum() -> None:
    x = Var("x", tensor(4, 8))
    body = call("sum", call("exp", x), axis=(1,))
    assert fused_groups(fuse(module([x], body))) == [("exp", "sum")]


def test_mean_does_not_absorb_the_following_subtract() -> None:
    x = Var("x", tensor(4, 8))
    body = call("subtract", x, call("mean", x, axis=(1,), keepdims=True))
    assert fused_groups(fuse(module([x], body))) == [("mean",), ("subtract",)]


def test_split_outputs_fuse_into_injective_consumers() -> None:
    x = Var("x", tensor(2, 8, 3))
    parts = call("split", x, indices_or_sections=2, axis=1)
    body = call("add", call("transpose", TupleGetItem(parts, 0)), call("transpose", TupleGetItem(parts, 1)))
    groups = fused_groups(fuse(module([x], body)))
    assert groups == [("split", "transpose", "transpose", "add")]


def test_split_fields_concatenated_form_one_group() -> None:
    x = Var("x", tensor(2, 8))
    parts = call("split", x, indices_or_sections=2, axis=1)
    body = call("concatenate", Tuple((TupleGetItem(parts, 1), TupleGetItem(parts, 0))), axis=1)
    assert fused_groups(fuse(module([x], body))) == [("split", "concatenate")]


def test_concatenate_of_two_convolutions_is_its_own_group() -> None:
    x = Var("x", tensor(1, 3, 8, 8))
    body = call("concatenate", Tuple((conv(x, 3, 4), conv(x, 3, 4))), axis=1)
    fused = fuse(module([x], body))
    assert fused_groups(fused) == [("nn.conv2d",), ("nn.conv2d",), ("concatenate",)]
    concat_fn = primitives(fused)[-1]
    assert isinstance(concat_fn.body, Call) and isinstance(concat_fn.body.args[0], Tuple)  # tuple built inside


def test_injective_producers_fuse_into_concatenate() -> None:
    a, b = Var("a", tensor(2, 3)), Var("b", tensor(3, 2))
    body = call("concatenate", Tuple((call("reshape", a, newshape=(6,)), call("reshape", b, newshape=(6,)))))
    assert fused_groups(fuse(module([a, b], body))) == [("reshape", "reshape", "concatenate")]


def test_pooling_stands_alone_but_absorbs_following_elementwise() -> None:
    x = Var("x", tensor(1, 4, 8, 8))
    y = call("nn.relu", conv(x, 4, 4))
    body = call("add", call("nn.max_pool2d", y, pool_size=(2, 2), strides=(2, 2)), const(1.0))
    assert fused_groups(fuse(module([x], body))) == [("nn.conv2d", "nn.relu"), ("nn.max_pool2d", "add")]


def test_global_pool_then_flatten_are_separate() -> None:
    x = Var("x", tensor(1, 4, 8, 8))
    body = call("nn.batch_flatten", call("nn.global_avg_pool2d", x))
    assert fused_groups(fuse(module([x], body))) == [("nn.global_avg_pool2d",), ("nn.batch_flatten",)]


def test_diamond_fuses_into_the_join() -> None:
    # x -> exp -> (sqrt, abs) -> add: the join post-dominates exp, so all four ops are one group
    x = Var("x", tensor(4, 4))
    e = call("exp", x)
    body = call("add", call("sqrt", e), call("abs", e))
    assert fused_groups(fuse(module([x], body))) == [("exp", "sqrt", "abs", "add")]


def test_a_value_with_an_outside_use_ends_its_group() -> None:
    x = Var("x", tensor(4, 4))
    e = call("exp", x)
    body = Tuple((call("nn.relu", e), e))  # e is also an output of the function
    fused = fuse(module([x], body))
    assert sorted(fused_groups(fused)) == [("exp",), ("nn.relu",)]


# ---------------------------------------------------------------------------------------------------------------------
# Parameters and constants
# ---------------------------------------------------------------------------------------------------------------------


def test_tensor_constants_become_parameters_and_scalars_stay_inline() -> None:
    x = Var("x", tensor(2, 4))
    body = call("multiply", call("add", x, weight(2, 4)), const(3.0))
    fused = fuse(module([x], body))
    (func,) = primitives(fused)
    assert len(func.params) == 2
    consts = [n for n in post_order(func.body) if isinstance(n, Constant)]
    assert len(consts) == 1 and consts[0].data.ndim == 0
    outer = fused["main"].body
    assert isinstance(outer, Call) and isinstance(outer.args[1], Constant)
    assert outer.args[1].data.shape == (2, 4)


def test_one_outside_value_used_twice_is_one_parameter() -> None:
    x = Var("x", tensor(4,))
    body = call("add", call("exp", x), call("negative", x))
    (func,) = primitives(fuse(module([x], body)))
    assert len(func.params) == 1


def test_fused_functions_are_typed_and_annotated() -> None:
    x = Var("x", tensor(1, 3, 8, 8))
    fused = fuse(module([x], call("nn.relu", conv(x, 3, 4))))
    (func,) = primitives(fused)
    assert func.params[0].type_annotation == tensor(1, 3, 8, 8)
    assert func.ret_type == tensor(1, 4, 8, 8)
    assert fused["main"].body.checked_type == tensor(1, 4, 8, 8)


# ---------------------------------------------------------------------------------------------------------------------
# Barriers, options, existing primitives
# ---------------------------------------------------------------------------------------------------------------------


def test_let_is_a_fusion_barrier() -> None:
    x = Var("x", tensor(4,))
    v = Var("v")
    body = Let(v, call("exp", x), call("nn.relu", v))
    fused = fuse(module([x], body))
    assert fused_groups(fused) == [("exp",), ("nn.relu",)]
    assert isinstance(fused["main"].body, Let)


def test_if_is_a_fusion_barrier_and_branches_fuse_inside() -> None:
    x = Var("x", tensor(4,))
    cond = Var("c", TensorType((), "bool"))
    e = call("exp", x)
    body = call("negative", If(cond, call("nn.relu", call("abs", x)), e))
    fused = FuseOps().run(module([cond, x], body), PassConfig(opt_level=3))
    assert sorted(fused_groups(fused)) == [("abs", "nn.relu"), ("exp",), ("negative",)]
    for flag in (True, False):
        data = RNG.standard_normal(4).astype("float32")
        expected = -np.maximum(np.abs(data), 0) if flag else -np.exp(data)
        np.testing.assert_allclose(evaluate(fused, [np.asarray(flag), data]), expected, rtol=1e-6)


def test_nested_function_literals_are_fused_inside() -> None:
    x = Var("x", tensor(4,))
    y = Var("y", tensor(4,))
    inner = Function((y,), call("nn.relu", call("exp", y)))
    fused = fuse(module([x], call("negative", Call(inner, (x,)))))
    assert sorted(fused_groups(fused)) == [("exp", "nn.relu"), ("negative",)]


def test_opt_level_zero_puts_every_call_alone() -> None:
    x = Var("x", tensor(1, 3, 8, 8))
    body = call("nn.relu", call("nn.bias_add", conv(x, 3, 4), weight(4)))
    assert fused_groups(fuse(module([x], body), opt_level=0)) == [("nn.conv2d",), ("nn.bias_add",), ("nn.relu",)]


def test_max_depth_limits_group_size() -> None:
    x = Var("x", tensor(8,))
    body: Expr = x
    for _ in range(10):
        body = call("exp", body)
    groups = fused_groups(fuse(module([x], body), max_depth=4))
    assert [len(g) for g in groups] == [4, 4, 2]  # greedy from the producer side, as in TVM
    assert fused_groups(fuse(module([x], body))) == [("exp",) * 10]


def test_max_depth_from_config() -> None:
    x = Var("x", tensor(8,))
    body: Expr = x
    for _ in range(6):
        body = call("exp", body)
    fused = FuseOps().run(module([x], body), PassConfig(opt_level=3, fuse_max_depth=3))
    assert [len(g) for g in fused_groups(fused)] == [3, 3]


def test_existing_primitive_functions_are_untouched() -> None:
    a = Var("a", tensor(5, 7))
    px, py = Var("px", tensor(5, 7)), Var("py", tensor(5, 7))
    prim = Function((px, py), call("add", px, py), tensor(5, 7), {"Primitive": 1})
    body = call("nn.relu", Call(prim, (a, a)))
    fused = fuse(module([a], body))
    funcs = primitives(fused)
    assert any(f is prim for f in funcs)
    assert fused_groups(fused) == [("add",), ("nn.relu",)]


def test_fusion_preserves_sharing_of_group_outputs() -> None:
    x = Var("x", tensor(1, 3, 8, 8))
    y = call("nn.relu", conv(x, 3, 4))
    body = Tuple((conv(y, 4, 4), conv(y, 4, 4)))
    fused = fuse(module([x], body))
    out = fused["main"].body
    assert isinstance(out, Tuple)
    first_args = [f.args[0] for f in out.fields if isinstance(f, Call)]
    assert first_args[0] is first_args[1]  # the relu group is computed once


def test_fusing_a_fused_module_changes_nothing() -> None:
    x = Var("x", tensor(1, 4, 8, 8))
    body = call("nn.relu", call("add", conv(call("nn.relu", conv(x, 4, 4)), 4, 4), x))
    once = fuse(module([x], body))
    twice = fuse(once)
    assert twice == once


def test_post_dominator_tree_of_a_diamond() -> None:
    x = Var("x", tensor(4,))
    e = call("exp", x)
    join = call("add", call("sqrt", e), call("abs", e))
    func = module([x], join)["main"]
    graph = IndexedGraph(func)
    tree = post_dominator_tree(graph)
    node_e = graph.node_of[id(e)]
    dom = tree[node_e.index]
    assert dom.parent is not None and dom.parent.node.expr is join


@pytest.mark.parametrize("depth", [10_000])
def test_deep_chain_fuses_without_recursion(depth: int) -> None:
    x = Var("x", tensor(4,))
    body: Expr = x
    for i in range(depth):
        body = call("add", body, const(float(i % 7)))
    fused = fuse(module([x], body))
    groups = fused_groups(fused)
    assert sum(len(g) for g in groups) == depth
    assert max(len(g) for g in groups) <= 256
