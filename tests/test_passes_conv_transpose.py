"""ConvTransposeAsConv: transposed convolutions whose taps do not overlap become a 1x1 convolution and a pixel
shuffle; the compiled model equals the reference interpreter's direct transposed convolution (odd shapes, random
data, constant and run-time weights), and other transposed convolutions are left alone."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import ConvTransposeAsConv, PassConfig, Sequential
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types


def transposed(channels: int, out: int, h: int, w: int, kernel: tuple[int, int], strides: tuple[int, int],
               extra: str = "") -> IRModule:
    kh, kw = kernel
    return parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {h}, {w}), float32], %w: Tensor[({channels}, {out}, {kh}, {kw}), float32],
          %b: Tensor[({out}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d_transpose(%x, %w, channels={out}, kernel_size=[{kh}, {kw}],
                                          strides=[{strides[0]}, {strides[1]}]{extra}), %b))
}}""")


def op_names(mod: IRModule) -> list[str]:
    return [n.op_name for n in post_order(mod["main"]) if isinstance(n, Call) and n.op_name]


def rewritten(mod: IRModule) -> IRModule:
    return Sequential((ConvTransposeAsConv(),)).run(infer_types(mod), PassConfig(opt_level=3))


def random_arrays(mod: IRModule, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    typed = infer_types(mod)["main"]
    return {p.name_hint: rng.standard_normal(tuple(int(d) for d in p.checked_type.shape)).astype(np.float32)
            for p in typed.params}


# (input channels, output channels, height, width, kernel = strides): DBNet's 2x2 heads (24 -> 24, 24 -> 1) at odd
# sizes, a 3x3 and a non-square kernel
SHAPES = [(24, 24, 15, 20, (2, 2)), (24, 1, 13, 11, (2, 2)), (5, 3, 7, 9, (3, 3)), (7, 4, 5, 6, (1, 2)),
          (3, 10, 1, 1, (4, 4))]


@pytest.mark.parametrize("channels,out,h,w,kernel", SHAPES)
def test_non_overlapping_transposed_conv_becomes_a_1x1_conv(channels: int, out: int, h: int, w: int,
                                                             kernel: tuple[int, int]) -> None:
    mod = transposed(channels, out, h, w, kernel, kernel)
    names = op_names(rewritten(mod))
    assert "nn.conv2d_transpose" not in names and "nn.conv2d" in names


@pytest.mark.parametrize("channels,out,h,w,kernel", SHAPES)
@pytest.mark.parametrize("constant_weight", [True, False])
def test_compiled_matches_the_direct_transposed_conv(channels: int, out: int, h: int, w: int,
                                                     kernel: tuple[int, int], constant_weight: bool) -> None:
    mod = transposed(channels, out, h, w, kernel, kernel)
    arrays = random_arrays(mod, seed=channels * 100 + h)
    want = np.asarray(Interpreter(mod).run(arrays))
    params = {"w": arrays["w"], "b": arrays["b"]} if constant_weight else None
    inputs = {"x": arrays["x"]} if constant_weight else arrays
    got = relay_tune.build(mod, params=params).run(**inputs)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strides,extra", [
    ((2, 2), ""),  # 3x3 taps at stride 2 overlap
    ((3, 3), ", padding=[1, 1, 1, 1]"),
    ((3, 3), ", output_padding=[1, 1]"),
])
def test_overlapping_or_cropped_transposed_convs_are_left_alone(strides: tuple[int, int], extra: str) -> None:
    mod = transposed(4, 6, 5, 7, (3, 3), strides, extra)
    assert "nn.conv2d_transpose" in op_names(rewritten(mod))
    arrays = random_arrays(mod, seed=1)
    want = np.asarray(Interpreter(mod).run(arrays))
    got = relay_tune.build(mod, params={"w": arrays["w"], "b": arrays["b"]}).run(x=arrays["x"])
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
