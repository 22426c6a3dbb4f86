"""CombineSiblingProducts: dense layers and plain convolutions that read the same input with the same attributes
become one product and slices of it; the result equals the reference interpreter's (random non-zero data, odd
shapes, compiled too), and products that differ in strides, padding, dilation, groups, kernel size, output dtype,
weight dtype, input, or that have run-time weights, blocked layouts or an elementwise epilogue, are left alone."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import CombineSiblingProducts, PassConfig, PlanLayouts, Sequential, optimize
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types

HEADER = '#[version = "0.0.5"]\n'


def products(mod: IRModule, name: str) -> list[Call]:
    typed = infer_types(mod)["main"]
    return [n for n in post_order(typed) if isinstance(n, Call) and n.op_name == name]


def combined(mod: IRModule, config: PassConfig | None = None) -> IRModule:
    return Sequential((CombineSiblingProducts(),)).run(infer_types(mod), config or PassConfig(opt_level=3))


def weights(rng: np.random.Generator, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [(rng.standard_normal(s) + 0.5).astype(np.float32) for s in shapes]


def assert_same_values(before: IRModule, after: IRModule, seed: int, compiled: bool = True) -> None:
    rng = np.random.default_rng(seed)
    params = infer_types(before)["main"].params
    inputs = {p.name_hint: (rng.standard_normal(tuple(int(d) for d in p.checked_type.shape)) + 0.25)
              .astype(p.checked_type.dtype) for p in params}
    want = Interpreter(before).run(inputs)
    got = Interpreter(after).run(inputs)
    for w, g in zip(*(v if isinstance(v, (list, tuple)) else [v] for v in (want, got))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    if compiled:
        out = relay_tune.build(before).run(**inputs)
        for w, g in zip(*(v if isinstance(v, (list, tuple)) else [v] for v in (want, out))):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)


def qkv(rows: int, k: int, units: tuple[int, ...], seed: int, bias: bool = False) -> IRModule:
    """Dense projections of one input, each reshaped (as attention heads are), or with a bias and an activation."""
    rng = np.random.default_rng(seed)
    body = []
    outs = []
    for i, u in enumerate(units):
        product = f"nn.dense(%x, meta[relay.Constant][{2 * i}], units={u})"
        if bias:
            body.append(f"  %{10 + i} = nn.relu(nn.bias_add({product}, meta[relay.Constant][{2 * i + 1}], axis=1));")
        else:
            body.append(f"  %{10 + i} = reshape({product}, newshape=[{rows * u}]);")
        outs.append(f"%{10 + i}")
    consts = []
    for u in units:
        consts += weights(rng, (u, k), (u,))
    text = (HEADER + f"def @main(%x: Tensor[({rows}, {k}), float32]) {{\n" + "\n".join(body)
            + f"\n  ({', '.join(outs)})\n}}")
    return parse_module(text, constants=consts)


@pytest.mark.parametrize("rows,k,units", [(7, 13, (5, 11, 3)), (1, 9, (4, 4)), (17, 33, (31, 2, 9, 6))])
def test_sibling_dense_layers_become_one_product(rows: int, k: int, units: tuple[int, ...]) -> None:
    mod = qkv(rows, k, units, seed=rows)
    after = combined(mod)
    dense, = products(after, "nn.dense")
    assert int(dense.attrs["units"]) == sum(units)
    assert len(products(after, "strided_slice")) == len(units)
    assert_same_values(mod, after, seed=k)


def test_dense_layers_with_an_epilogue_are_left_alone() -> None:
    mod = qkv(7, 13, (5, 11, 3), seed=2, bias=True)
    after = combined(mod)
    assert len(products(after, "nn.dense")) == 3 and not products(after, "strided_slice")


def conv_pair(attrs_a: str, attrs_b: str, channels: tuple[int, int] = (5, 7), taps: tuple[int, int] = (3, 3),
              in_channels: int = 3, groups_b: int = 1, seed: int = 0, epilogue: bool = False) -> IRModule:
    """Two convolutions of one input, their results flattened and transposed, or with activations."""
    rng = np.random.default_rng(seed)
    consts = weights(rng, (channels[0], in_channels, taps[0], taps[0]),
                     (channels[1], in_channels // groups_b, taps[1], taps[1]))
    text = HEADER + f"""def @main(%x: Tensor[(2, {in_channels}, 11, 9), float32]) {{
  %0 = nn.conv2d(%x, meta[relay.Constant][0], channels={channels[0]}, kernel_size=[{taps[0]}, {taps[0]}]{attrs_a});
  %1 = nn.conv2d(%x, meta[relay.Constant][1], channels={channels[1]}, kernel_size=[{taps[1]}, {taps[1]}],
                 groups={groups_b}{attrs_b});
  {"(nn.relu(%0), sigmoid(%1))" if epilogue else "(reshape(%0, newshape=[-1]), transpose(%1, axes=[0, 2, 3, 1]))"}
}}"""
    return parse_module(text, constants=consts)


@pytest.mark.parametrize("attrs", ["", ", strides=[2, 1], padding=[1, 2, 0, 1]", ", dilation=[2, 1], padding=[1, 1]"])
def test_sibling_convolutions_become_one_product(attrs: str) -> None:
    mod = conv_pair(attrs, attrs, seed=len(attrs))
    after = combined(mod)
    conv, = products(after, "nn.conv2d")
    assert int(conv.attrs["channels"]) == 12
    assert_same_values(mod, after, seed=3)


@pytest.mark.parametrize("attrs_b,taps_b,groups_b", [
    (", strides=[2, 2]", 3, 1),
    (", padding=[1, 1]", 3, 1),
    (", dilation=[2, 2]", 3, 1),
    ("", 1, 1),                       # another kernel size
    ("", 3, 3),                       # groups
    (', out_dtype="float64"', 3, 1),  # one consumer in another dtype
])
def test_convolutions_that_differ_are_left_alone(attrs_b: str, taps_b: int, groups_b: int) -> None:
    mod = conv_pair("", attrs_b, channels=(5, 6), taps=(3, taps_b), groups_b=groups_b)
    after = combined(mod)
    assert len(products(after, "nn.conv2d")) == 2 and not products(after, "strided_slice")
    assert_same_values(mod, after, seed=5, compiled=False)


def test_convolutions_with_an_epilogue_are_left_alone() -> None:
    after = combined(conv_pair("", "", epilogue=True))
    assert len(products(after, "nn.conv2d")) == 2 and not products(after, "strided_slice")


def test_run_time_weights_other_inputs_and_weight_dtypes_are_left_alone() -> None:
    rng = np.random.default_rng(4)
    w16 = (rng.standard_normal((4, 6)) + 0.5).astype(np.float16)
    text = HEADER + """def @main(%x: Tensor[(3, 6), float32], %y: Tensor[(3, 6), float32],
          %w: Tensor[(5, 6), float32]) {
  %0 = nn.dense(%x, meta[relay.Constant][0], units=4);
  %1 = nn.dense(%x, %w, units=5);
  %2 = nn.dense(%y, meta[relay.Constant][1], units=4);
  %5 = cast(%x, dtype="float16");
  %3 = nn.dense(%5, meta[relay.Constant][2], units=4);
  %4 = nn.dense(%5, meta[relay.Constant][2], units=4, out_dtype="float32");
  (reshape(%0, newshape=[-1]), reshape(%1, newshape=[-1]), reshape(%2, newshape=[-1]), reshape(%3, newshape=[-1]),
   reshape(%4, newshape=[-1]))
}"""
    mod = parse_module(text, constants=[*weights(rng, (4, 6), (4, 6)), w16])
    after = combined(mod)
    assert len(products(after, "nn.dense")) == 5 and not products(after, "strided_slice")


def test_blocked_convolutions_are_left_alone() -> None:
    block = 8
    mod = conv_pair("", "", channels=(16, 16), in_channels=16)
    config = PassConfig(opt_level=3, layout_block=block)
    planned = Sequential((PlanLayouts(),)).run(infer_types(mod), config)
    assert len(products(planned, "nn.contrib_conv2d_NCHWc")) == 2
    after = combined(planned, config)
    assert len(products(after, "nn.contrib_conv2d_NCHWc")) == 2 and not products(after, "strided_slice")


def test_an_stft_as_two_convolutions_is_one_product_in_the_pipeline() -> None:
    """openwakeword's mel spectrogram in small: real and imaginary strided convolutions of one row, squared and
    summed; the default pipeline leaves one product over the frames."""
    rng = np.random.default_rng(6)
    text = HEADER + """def @main(%x: Tensor[(1, 1003), float32]) {
  %0 = expand_dims(%x, axis=1);
  %1 = nn.conv1d(%0, meta[relay.Constant][0], strides=[20], channels=33, kernel_size=[64]);
  %2 = nn.conv1d(%0, meta[relay.Constant][1], strides=[20], channels=33, kernel_size=[64]);
  add(power(%1, 2f), power(%2, 2f))
}"""
    mod = parse_module(text, constants=weights(rng, (33, 1, 64), (33, 1, 64)))
    fused = optimize(infer_types(mod), opt_level=3)
    primitive_products = [n for f in [fused["main"]] for n in post_order(f)
                          if isinstance(n, Call) and n.op_name in ("nn.dense", "nn.conv2d")]
    assert [(n.op_name, int(n.attrs["units"])) for n in primitive_products] == [("nn.dense", 66)]
    assert_same_values(mod, mod, seed=7)  # the build (the whole pipeline) against the interpreter
