"""FoldScaleShift: chains of constant multiplies and adds become one multiply and one add; results never change."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import evaluate
from relay_tune.ir import (
    Call,
    Constant,
    Expr,
    Function,
    IRModule,
    TensorType,
    Tuple,
    TupleGetItem,
    Var,
    const,
    op,
    post_order,
)
from relay_tune.op.registry import get_op
from relay_tune.passes import FoldScaleShift, PassConfig, SimplifyInference, extract_tasks, optimize
from relay_tune.target import Target
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(5)
CONFIG = PassConfig(opt_level=3)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def rand(*shape: int, dtype: str = "float32") -> Constant:
    return const(RNG.uniform(0.5, 1.5, shape).astype(dtype) * RNG.choice([-1, 1], shape).astype(dtype))


def module(params: list[Var], body: Expr) -> IRModule:
    return infer_types(IRModule({"main": Function(tuple(params), body)}))


def op_names(mod: IRModule) -> list[str]:
    return [n.op_name for n in post_order(mod["main"]) if isinstance(n, Call) and n.op_name is not None]


def same_outputs(before: IRModule, after: IRModule, inputs: list[np.ndarray]) -> None:
    expected, actual = evaluate(before, inputs), evaluate(after, inputs)
    if isinstance(expected, tuple):
        for e, a in zip(expected, actual):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def data(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def test_two_scale_shifts_become_one() -> None:
    """A batch norm's scale and shift followed by a second per-channel scale and shift (DenseNet-121's
    `BatchNormalization`, `Mul`, `Add`), 7 channels, scalar and per-channel constants mixed."""
    x = Var("x", TensorType((1, 7, 5, 3), "float32"))
    chain = call("add", call("multiply", call("add", call("multiply", x, rand(7, 1, 1)), rand(7, 1, 1)), rand(7, 1, 1)),
                 const(np.float32(0.25)))
    mod = module([x], call("nn.relu", chain))
    folded = FoldScaleShift().run(mod, CONFIG)
    assert op_names(folded) == ["multiply", "add", "nn.relu"]
    same_outputs(mod, folded, [data(1, 7, 5, 3)])


@pytest.mark.parametrize("order", ["constant_first", "subtract_value", "subtract_constant", "three_multiplies"])
def test_operand_orders_and_subtractions(order: str) -> None:
    x = Var("x", TensorType((2, 5, 3), "float32"))
    scaled = call("multiply", rand(5, 1), x)
    body = {
        "constant_first": call("add", rand(5, 1), call("multiply", rand(1, 3), call("add", rand(5, 1), scaled))),
        "subtract_value": call("subtract", rand(5, 1), call("subtract", scaled, rand(1, 1, 3))),
        "subtract_constant": call("subtract", call("subtract", rand(3), x), rand(5, 1)),
        "three_multiplies": call("multiply", call("multiply", scaled, rand(3)), const(np.float32(-2.0))),
    }[order]
    mod = module([x], body)
    folded = FoldScaleShift().run(mod, CONFIG)
    names = op_names(folded)
    assert len(names) <= 2 and names.count("multiply") <= 1 and names.count("add") <= 1
    same_outputs(mod, folded, [data(2, 5, 3)])


def test_single_steps_and_shared_intermediates_stay() -> None:
    x = Var("x", TensorType((1, 4, 3, 3), "float32"))
    single = module([x], call("add", call("nn.relu", x), rand(4, 1, 1)))
    assert FoldScaleShift().run(single, CONFIG)["main"] is single["main"]
    inner = call("multiply", x, rand(4, 1, 1))  # read by the chain and by the tuple: computed once, kept
    shared = module([x], Tuple((call("add", inner, rand(4, 1, 1)), inner)))
    assert op_names(FoldScaleShift().run(shared, CONFIG)) == ["multiply", "add"]


def test_no_merge_that_would_enlarge_or_change_integers() -> None:
    x = Var("x", TensorType((3, 1), "float32"))
    enlarging = module([x], call("add", call("multiply", x, rand(3, 4)), rand(3, 4)))  # the multiply broadcasts
    folded = FoldScaleShift().run(enlarging, CONFIG)
    assert folded["main"] is enlarging["main"]
    i = Var("i", TensorType((3, 4), "int32"))
    integers = module([i], call("add", call("multiply", i, const(np.full((3, 4), 3, np.int32))),
                                const(np.full((3, 4), 2, np.int32))))
    assert FoldScaleShift().run(integers, CONFIG)["main"] is integers["main"]
    v = Var("v", TensorType((3, 1), "float32"))
    runtime_scale = module([x, v], call("add", call("multiply", x, v), rand(3, 1)))
    assert FoldScaleShift().run(runtime_scale, CONFIG)["main"] is runtime_scale["main"]


def _requantized(q: Var, zero: float, scale: float, out_scale: float) -> Expr:
    """QuantizeLinear(DequantizeLinear(q) * 1.7 + 0.3): a dequantize, a float scale-shift, a requantize to uint8."""
    dequantized = call("multiply", call("subtract", call("cast", q, dtype="float32"), const(np.float32(zero))),
                       const(np.float32(scale)))
    shifted = call("add", call("multiply", dequantized, const(np.float32(1.7))), const(np.float32(0.3)))
    rounded = call("round", call("divide", shifted, const(np.float32(out_scale))))
    clipped = call("clip", call("add", rounded, const(np.float32(3.0))), a_min=0.0, a_max=255.0)
    return call("cast", clipped, dtype="uint8")


def test_a_dequantize_is_never_merged() -> None:
    """`(q - zp) * s` rounds once on exact integers; merged into `q * s + (-zp * s)` it rounds twice, and the
    requantize after it moves by a whole step at ties: the dequantize's steps stay out of every chain."""
    q = Var("q", TensorType((1, 256), "uint8"))
    zero, scale, out_scale = 131.0, 0.0784493, 0.0642922
    mod = module([q], _requantized(q, zero, scale, out_scale))
    folded = FoldScaleShift().run(mod, CONFIG)
    names = op_names(folded)
    assert names[:3] == ["cast", "subtract", "multiply"]  # the dequantize as it was
    assert names.count("multiply") == 2 and names.count("add") == 2  # the float scale-shift after it is one step
    every = np.arange(256, dtype=np.uint8).reshape(1, 256)
    np.testing.assert_array_equal(evaluate(folded, [every]), evaluate(mod, [every]))
    # what a merge would do to these 256 values: some land a step away
    merged = np.float32(1.7) * (every.astype(np.float32) * np.float32(scale) + np.float32(-zero * scale))
    exact = np.float32(1.7) * ((every.astype(np.float32) - np.float32(zero)) * np.float32(scale))
    assert not np.array_equal(merged, exact)


def test_pre_activation_batch_norm_on_blocked_layout_compiles_to_one_scale_shift() -> None:
    """A batch norm, scale and shift and ReLU that read a concatenation (no convolution to fold into) between two
    convolutions, 12 channels (blocked as NCHW4c): the default pipeline leaves one multiply and one add in the
    fused function, and the compiled model's output matches the interpreter's on the original program."""
    x = Var("x", TensorType((1, 3, 9, 7), "float32"))
    y = Var("y", TensorType((1, 5, 9, 7), "float32"))
    first = call("nn.conv2d", x, rand(7, 3, 1, 1))
    joined = call("concatenate", Tuple((first, y)), axis=1)
    vectors = [rand(12), rand(12), rand(12), const(RNG.uniform(0.5, 2, 12).astype("float32"))]
    norm = TupleGetItem(call("nn.batch_norm", joined, *vectors), 0)
    scaled = call("add", call("multiply", norm, rand(12, 1, 1)), rand(12, 1, 1))
    body = call("nn.conv2d", call("nn.relu", scaled), rand(4, 12, 1, 1))
    mod = module([x, y], body)
    fused = optimize(mod, 3, layout_block=4)
    scale_shifts = [t for t in extract_tasks(fused) if "relu" in t.description and "conv" not in t.description]
    assert scale_shifts
    for task in scale_shifts:
        names = [n.op_name for n in post_order(task.func.body) if isinstance(n, Call) and n.op_name]
        assert names.count("multiply") <= 1 and names.count("add") <= 1, task.description
    inputs = [data(1, 3, 9, 7), data(1, 5, 9, 7)]
    expected = evaluate(SimplifyInference().run(mod, CONFIG), inputs)
    built = relay_tune.build(mod, target=Target.host().with_cores(2))
    np.testing.assert_allclose(built.run(*inputs), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels, block", [(3, 8), (5, 4), (28, 8)])
def test_blocked_scale_shift_kernel_matches_the_interpreter(channels: int, block: int) -> None:
    """The fused element-wise kernel on NCHW{b}c (odd channel blocks, 7x7 and 14x14 maps) built with its default
    schedule (rows of blocks in vectors of several blocks) against the interpreter."""
    for height in (7, 14):
        x = Var("p0", TensorType((1, channels, height, height, block), "float32"))
        s = Var("p1", TensorType((channels, 1, 1, block), "float32"))
        t = Var("p2", TensorType((channels, 1, 1, block), "float32"))
        body = call("nn.relu", call("add", call("multiply", x, s), t))
        mod = module([x, s, t], body)
        inputs = [data(1, channels, height, height, block), data(channels, 1, 1, block),
                  data(channels, 1, 1, block)]
        built = build_primitive(mod["main"].with_attrs(Primitive=1), Target.host().with_cores(2))
        expected = evaluate(mod, inputs)
        np.testing.assert_allclose(built(*inputs), expected, rtol=1e-5, atol=1e-6)
