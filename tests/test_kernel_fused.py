"""Fused primitive functions built into kernels (compute -> default schedule -> LLVM) agree with the interpreter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Expr, Function, IRModule, TensorType, Var, op
from relay_tune.kernel.build import build_primitive, lower_primitive
from relay_tune.op.registry import get_op
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(3)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def var(name: str, *shape: int, dtype: str = "float32") -> Var:
    return Var(name, TensorType(shape, dtype))


def primitive(params: Sequence[Var], body: Expr) -> tuple[Function, IRModule]:
    mod = infer_types(IRModule({"main": Function(tuple(params), body)}))
    return mod["main"].with_attrs(Primitive=1), mod


def random_inputs(params: Sequence[Var]) -> list[np.ndarray]:
    return [RNG.standard_normal(p.type_annotation.shape).astype(p.type_annotation.dtype)  # type: ignore[union-attr]
            for p in params]


def check_against_interpreter(params: Sequence[Var], body: Expr, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    func, mod = primitive(params, body)
    inputs = random_inputs(params)
    kernel = build_primitive(func)
    got = kernel(*inputs)
    want = evaluate(mod, inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def test_broadcast_add_relu() -> None:
    x, y = var("x", 3, 5, 7), var("y", 5, 1)
    check_against_interpreter([x, y], call("nn.relu", call("add", x, y)))


@pytest.mark.parametrize("shape", [(37, 29, 53), (1, 64, 10), (16, 7, 64)])
def test_dense_bias_relu(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    a, w, b = var("a", m, k), var("w", n, k), var("b", n)
    check_against_interpreter([a, w, b], call("nn.relu", call("nn.bias_add", call("nn.dense", a, w), b)))


@pytest.mark.parametrize("geometry", [(1, 6, 13, 11, 10, 3, 1, 1), (2, 3, 9, 20, 17, 3, 0, 2)])
def test_conv2d_bias_relu(geometry: tuple[int, ...]) -> None:
    n, c, h, w, f, k, pad, stride = geometry
    d, wt, b = var("d", n, c, h, w), var("w", f, c, k, k), var("b", f)
    conv = call("nn.conv2d", d, wt, padding=(pad, pad), strides=(stride, stride))
    check_against_interpreter([d, wt, b], call("nn.relu", call("nn.bias_add", conv, b)))


def test_dense_weights_are_packed_ahead() -> None:
    a, w = var("a", 8, 16), var("w", 40, 16)
    func, _ = primitive([a, w], call("nn.dense", a, w))
    prim_func, packing = lower_primitive(func)
    assert packing.packed_inputs == (1,)
    assert [p.role for p in packing.params] == ["input", "input", "output"]
    assert prim_func.params[1].shape != (40, 16)
