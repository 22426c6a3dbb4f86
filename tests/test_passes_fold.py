"""FoldConstant and FoldScaleAxis: what is folded, what is not, and that results never change."""

from __future__ import annotations

import numpy as np
import pytest

from relay_tune.interpreter import evaluate
from relay_tune.ir import (
    Call,
    Constant,
    Expr,
    Function,
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
from relay_tune.passes import FoldConstant, FoldScaleAxis, PassConfig, Sequential, SimplifyInference
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(11)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def rand(*shape: int) -> Constant:
    return const(RNG.standard_normal(shape).astype("float32"))


def module(params: list[Var], body: Expr) -> IRModule:
    return infer_types(IRModule({"main": Function(tuple(params), body)}))


def op_names(mod: IRModule) -> list[str]:
    return [n.op_name for n in post_order(mod["main"]) if isinstance(n, Call) and n.op_name is not None]


def same_outputs(before: IRModule, after: IRModule, inputs: list[np.ndarray]) -> None:
    expected = evaluate(before, inputs)
    actual = evaluate(after, inputs)
    if isinstance(expected, tuple):
        for e, a in zip(expected, actual):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# FoldConstant
# ---------------------------------------------------------------------------------------------------------------------


def test_constant_subgraph_is_evaluated() -> None:
    a, b = rand(3, 4), rand(3, 4)
    x = Var("x", TensorType((3, 4), "float32"))
    mod = module([x], call("add", x, call("multiply", call("exp", a), b)))
    folded = FoldConstant().run(mod)
    assert op_names(folded) == ["add"]
    body = folded["main"].body
    assert isinstance(body, Call) and isinstance(body.args[1], Constant)
    np.testing.assert_allclose(body.args[1].data, np.exp(a.data) * b.data, rtol=1e-6)
    same_outputs(mod, folded, [RNG.standard_normal((3, 4)).astype("float32")])


def test_whole_constant_function_body_folds() -> None:
    mod = module([], call("negative", rand(2, 2)))
    folded = FoldConstant().run(mod)
    assert isinstance(folded["main"].body, Constant)


def test_parameters_and_let_bound_values_are_not_constants() -> None:
    x = Var("x", TensorType((2,), "float32"))
    v = Var("v")
    body = Let(v, rand(2), call("add", call("exp", v), x))
    mod = module([x], body)
    folded = FoldConstant().run(mod)
    assert op_names(folded) == ["exp", "add"]


def test_scalar_constants_are_kept_as_they_are() -> None:
    x = Var("x", TensorType((2,), "float32"))
    two = const(2.0)
    mod = module([x], call("multiply", x, two))
    folded = FoldConstant().run(mod)
    assert folded is mod  # nothing to fold: the very same module
    body = folded["main"].body
    assert isinstance(body, Call) and body.args[1] is two


def test_scalar_arithmetic_folds_to_a_scalar() -> None:
    x = Var("x", TensorType((2,), "float32"))
    mod = module([x], call("add", x, call("sqrt", call("add", const(3.0), const(1.0)))))
    body = FoldConstant().run(mod)["main"].body
    assert isinstance(body, Call) and isinstance(body.args[1], Constant)
    assert body.args[1].data.shape == () and float(body.args[1].data) == pytest.approx(2.0)


def test_size_rule_keeps_calls_that_create_large_tensors() -> None:
    x = Var("x", TensorType((1000, 1000), "float32"))
    outer = call("multiply", rand(1000, 1), rand(1, 1000))  # 2,000 inputs -> 1,000,000 outputs: not folded
    small = call("add", rand(32, 1), rand(1, 32))  # 1,024 outputs: under the small-result floor, folded
    mod = module([x], Tuple((call("add", x, outer), small)))
    folded = FoldConstant().run(mod)
    assert op_names(folded).count("multiply") == 1
    out = folded["main"].body
    assert isinstance(out, Tuple) and isinstance(out.fields[1], Constant)
    tight = FoldConstant().run(mod, PassConfig(fold_small_result_elements=16))
    assert op_names(tight).count("add") == 2  # the 32x32 outer sum is now "too big" as well


def test_tuples_and_projections_fold() -> None:
    x = Var("x", TensorType((2, 3), "float32"))
    c = rand(2, 6)
    parts = call("split", c, indices_or_sections=2, axis=1)
    cat = call("concatenate", Tuple((TupleGetItem(parts, 1), rand(2, 3))), axis=0)
    mod = module([x], call("add", call("concatenate", Tuple((x, x)), axis=0), cat))
    folded = FoldConstant().run(mod)
    assert op_names(folded) == ["concatenate", "add"]
    same_outputs(mod, folded, [RNG.standard_normal((2, 3)).astype("float32")])


def test_projection_of_a_tuple_literal_is_its_field() -> None:
    x = Var("x", TensorType((2,), "float32"))
    mod = module([x], call("exp", TupleGetItem(Tuple((x, call("negative", x))), 0)))
    body = FoldConstant().run(mod)["main"].body
    assert isinstance(body, Call) and body.args[0] is mod["main"].params[0]


# ---------------------------------------------------------------------------------------------------------------------
# FoldScaleAxis
# ---------------------------------------------------------------------------------------------------------------------


def conv(x: Expr, cin: int, cout: int, **attrs: object) -> Call:
    return call("nn.conv2d", x, rand(cout, cin, 3, 3), padding=(1, 1), **attrs)


FOLD = Sequential((FoldConstant(), FoldScaleAxis(), FoldConstant()))
CONFIG = PassConfig(opt_level=3)


def test_per_channel_multiply_folds_into_conv_weights() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    body = call("nn.relu", call("add", call("multiply", conv(x, 3, 4), rand(4, 1, 1)), rand(4, 1, 1)))
    mod = module([x], body)
    folded = FOLD.run(mod, CONFIG)
    assert op_names(folded) == ["nn.conv2d", "add", "nn.relu"]
    same_outputs(mod, folded, [RNG.standard_normal((1, 3, 6, 6)).astype("float32")])


def test_scale_on_the_left_and_scalar_scale_fold() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    mod = module([x], call("multiply", rand(1, 4, 1, 1), call("multiply", conv(x, 3, 4), const(0.5))))
    folded = FOLD.run(mod, CONFIG)
    assert op_names(folded) == ["nn.conv2d"]
    same_outputs(mod, folded, [RNG.standard_normal((1, 3, 6, 6)).astype("float32")])


def test_grouped_and_nhwc_convolutions_fold() -> None:
    x = Var("x", TensorType((1, 4, 5, 5), "float32"))
    grouped = call("nn.conv2d", x, rand(4, 1, 3, 3), groups=4, padding=(1, 1))
    y = Var("y", TensorType((1, 5, 5, 3), "float32"))
    nhwc = call("nn.conv2d", y, rand(3, 3, 3, 6), data_layout="NHWC", kernel_layout="HWIO", padding=(1, 1))
    mod = module([x, y], Tuple((call("multiply", grouped, rand(4, 1, 1)), call("multiply", nhwc, rand(6)))))
    folded = FOLD.run(mod, CONFIG)
    assert "multiply" not in op_names(folded)
    same_outputs(mod, folded, [RNG.standard_normal((1, 4, 5, 5)).astype("float32"),
                               RNG.standard_normal((1, 5, 5, 3)).astype("float32")])


def test_dense_scale_folds() -> None:
    x = Var("x", TensorType((2, 8), "float32"))
    mod = module([x], call("multiply", call("add", call("nn.dense", x, rand(5, 8)), rand(5)), rand(1, 5)))
    folded = FOLD.run(mod, CONFIG)
    assert op_names(folded) == ["nn.dense", "add"]
    same_outputs(mod, folded, [RNG.standard_normal((2, 8)).astype("float32")])


def test_scale_distributes_over_a_sum_of_convolutions_and_bias_add() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    total = call("add", call("nn.bias_add", conv(x, 3, 4), rand(4)), conv(x, 3, 4))
    mod = module([x], call("multiply", total, rand(4, 1, 1)))
    folded = FOLD.run(mod, CONFIG)
    assert sorted(op_names(folded)) == ["add", "nn.bias_add", "nn.conv2d", "nn.conv2d"]
    same_outputs(mod, folded, [RNG.standard_normal((1, 3, 6, 6)).astype("float32")])


def test_batch_norm_after_conv_leaves_only_a_bias_add() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    vectors = [rand(4), rand(4), rand(4), const(RNG.uniform(0.5, 2, 4).astype("float32"))]
    body = call("nn.relu", TupleGetItem(call("nn.batch_norm", conv(x, 3, 4), *vectors), 0))
    mod = module([x], body)
    folded = Sequential((SimplifyInference(), FOLD)).run(mod, CONFIG)
    assert op_names(folded) == ["nn.conv2d", "add", "nn.relu"]
    bias = folded["main"].body.args[0].args[1]  # type: ignore[attr-defined]
    assert isinstance(bias, Constant) and bias.data.shape == (4, 1, 1)
    same_outputs(mod, folded, [RNG.standard_normal((1, 3, 6, 6)).astype("float32")])


def test_no_fold_when_the_conv_has_another_user() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    c = conv(x, 3, 4)
    mod = module([x], Tuple((call("multiply", c, rand(4, 1, 1)), c)))
    assert op_names(FOLD.run(mod, CONFIG)).count("multiply") == 1


@pytest.mark.parametrize("scale_shape", [(4, 6, 1), (1, 1, 6), (2, 4, 1, 1)])
def test_no_fold_when_the_scale_is_not_per_channel(scale_shape: tuple[int, ...]) -> None:
    x = Var("x", TensorType((2, 3, 6, 6), "float32"))
    mod = module([x], call("multiply", conv(x, 3, 4), rand(*scale_shape)))
    folded = FOLD.run(mod, CONFIG)
    assert op_names(folded).count("multiply") == 1
    same_outputs(mod, folded, [RNG.standard_normal((2, 3, 6, 6)).astype("float32")])


def test_no_fold_for_a_non_constant_scale() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    s = Var("s", TensorType((4, 1, 1), "float32"))
    mod = module([x, s], call("multiply", conv(x, 3, 4), s))
    assert op_names(FOLD.run(mod, CONFIG)) == ["nn.conv2d", "multiply"]


def test_no_fold_into_weights_that_arrive_at_run_time() -> None:
    x = Var("x", TensorType((1, 16), "float32"))
    w = Var("w", TensorType((1000, 16), "float32"))
    mod = module([x, w], call("multiply", call("nn.dense", x, w), rand(1000)))
    assert op_names(FOLD.run(mod, CONFIG)) == ["nn.dense", "multiply"]


def test_chained_scales_fold_in_rounds() -> None:
    x = Var("x", TensorType((1, 3, 6, 6), "float32"))
    mod = module([x], call("multiply", call("multiply", conv(x, 3, 4), rand(4, 1, 1)), rand(4, 1, 1)))
    folded = FOLD.run(mod, CONFIG)
    assert op_names(folded) == ["nn.conv2d"]
    same_outputs(mod, folded, [RNG.standard_normal((1, 3, 6, 6)).astype("float32")])
