"""SimplifyInference: batch_norm becomes scale/shift arithmetic, dropout disappears, other ops stay."""

from __future__ import annotations

import numpy as np
import pytest

from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, Tuple, TupleGetItem, Var, op, post_order
from relay_tune.op.registry import get_op
from relay_tune.passes import SimplifyInference
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(3)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def module(params: list[Var], body: Expr) -> IRModule:
    return infer_types(IRModule({"main": Function(tuple(params), body)}))


def op_names(mod: IRModule) -> list[str]:
    return [n.op_name for n in post_order(mod["main"]) if isinstance(n, Call) and n.op_name is not None]


def batch_norm_reference(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray, axis: int, eps: float,
    center: bool, scale: bool,
) -> np.ndarray:
    """Inference batch norm written directly from its definition: (x - mean) / sqrt(var + eps) * gamma + beta."""
    shape = [1] * x.ndim
    shape[axis] = -1
    out = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if scale:
        out = out * gamma.reshape(shape)
    if center:
        out = out + beta.reshape(shape)
    return out


@pytest.mark.parametrize(
    ("shape", "axis", "center", "scale"),
    [
        ((2, 4, 5, 5), 1, True, True),
        ((2, 5, 5, 4), -1, True, True),  # NHWC
        ((2, 5, 5, 4), 3, False, True),
        ((3, 4), 1, True, False),
        ((4, 3, 2), 0, False, False),
    ],
)
def test_batch_norm_becomes_scale_and_shift(shape: tuple[int, ...], axis: int, center: bool, scale: bool) -> None:
    channels = shape[axis]
    x = Var("x", TensorType(shape, "float32"))
    gamma, beta, mean = (RNG.standard_normal(channels).astype("float32") for _ in range(3))
    var = RNG.uniform(0.5, 2.0, channels).astype("float32")
    bn = call("nn.batch_norm", x, *(Constant(a) for a in (gamma, beta, mean, var)), axis=axis, epsilon=1e-3,
              center=center, scale=scale)
    mod = module([x], call("nn.relu", TupleGetItem(bn, 0)))
    simplified = SimplifyInference().run(mod)
    names = op_names(simplified)
    assert "nn.batch_norm" not in names
    assert names.count("multiply") >= 1 and "nn.relu" in names
    assert simplified["main"].body.checked_type == TensorType(shape, "float32")

    data = RNG.standard_normal(shape).astype("float32")
    expected = np.maximum(batch_norm_reference(data, gamma, beta, mean, var, axis % len(shape), 1e-3, center, scale), 0)
    np.testing.assert_allclose(evaluate(simplified, [data]), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(mod, [data]), expected, rtol=1e-5, atol=1e-5)


def test_batch_norm_scale_is_broadcast_with_expand_dims() -> None:
    x = Var("x", TensorType((1, 4, 3, 3), "float32"))
    vectors = [Constant(np.ones(4, "float32")) for _ in range(4)]
    mod = module([x], TupleGetItem(call("nn.batch_norm", x, *vectors), 0))
    simplified = SimplifyInference().run(mod)
    body = simplified["main"].body
    assert isinstance(body, Call) and body.op_name == "add"
    mul = body.args[0]
    assert isinstance(mul, Call) and mul.op_name == "multiply" and mul.args[0] is simplified["main"].params[0]
    assert mul.args[1].checked_type == TensorType((4, 1, 1), "float32")


def test_dropout_becomes_identity() -> None:
    x = Var("x", TensorType((2, 3), "float32"))
    mod = module([x], call("nn.relu", TupleGetItem(call("nn.dropout", x, rate=0.3), 0)))
    simplified = SimplifyInference().run(mod)
    assert op_names(simplified) == ["nn.relu"]
    relu = simplified["main"].body
    assert isinstance(relu, Call) and relu.args[0] is simplified["main"].params[0]


def test_softmax_and_batch_statistics_are_left_alone() -> None:
    x = Var("x", TensorType((2, 3), "float32"))
    vectors = [Constant(np.ones(3, "float32")) for _ in range(4)]
    bn = call("nn.batch_norm", x, *vectors)
    mod = module([x], Tuple((call("nn.softmax", TupleGetItem(bn, 0)), TupleGetItem(bn, 1))))
    simplified = SimplifyInference().run(mod)
    names = op_names(simplified)
    assert "nn.softmax" in names
    assert names.count("nn.batch_norm") == 1  # still needed for `.1`


def test_nothing_to_simplify_returns_the_same_module() -> None:
    x = Var("x", TensorType((2, 3), "float32"))
    mod = module([x], call("nn.softmax", x))
    assert SimplifyInference().run(mod) is mod
