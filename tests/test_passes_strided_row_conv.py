"""StridedRowConvAsFrames and StridedRowConvAsPhases: one-row convolutions with a long stride (an STFT as a
convolution) become one product of their frames (frames spanning at most `MAX_FRAME_OVERLAP` strides) or stride-1
convolutions over the row's phases; both rewrites, and the compiled model, equal the reference interpreter's direct
convolution (odd lengths, taps not a multiple of the stride, left/right padding, several input channels, random
data, constant and run-time weights, fused bias and activation), and short strides, dilation, groups and two-row maps
are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from conv_pass_checks import assert_compiled_matches, random_arrays, rewritten

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import StridedRowConvAsFrames, StridedRowConvAsPhases
from relay_tune.passes.strided_row_conv import MAX_FRAME_OVERLAP
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types


def row_conv(channels: int, out: int, width: int, taps: int, attrs: str, height: int = 1, groups: int = 1) -> IRModule:
    return parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {height}, {width}), float32],
          %w: Tensor[({out}, {channels // groups}, 1, {taps}), float32], %b: Tensor[({out}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, channels={out}, kernel_size=[1, {taps}], groups={groups}{attrs}), %b))
}}""")


def conv_inputs(mod: IRModule) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(data shape, strides) of every convolution."""
    typed = infer_types(mod)["main"]
    return [(tuple(int(d) for d in n.args[0].checked_type.shape), tuple(int(s) for s in n.attrs["strides"]))
            for n in post_order(typed) if isinstance(n, Call) and n.op_name == "nn.conv2d"]


# (input channels, output channels, width, taps, attrs): openwakeword's mel STFT (smaller: 64 taps every 20),
# Silero's (taps twice the stride), taps shorter than the stride, a length that leaves a partial frame, padding,
# two input channels
SHAPES = [
    (1, 33, 1000, 64, ", strides=[1, 20]"),
    (1, 18, 517, 32, ", strides=[1, 16]"),
    (1, 5, 203, 9, ", strides=[1, 12]"),
    (1, 7, 331, 50, ", strides=[1, 8], padding=[0, 3, 0, 5]"),
    (2, 6, 150, 21, ", strides=[1, 10]"),
]


@pytest.mark.parametrize("channels,out,width,taps,attrs", SHAPES)
def test_a_long_stride_becomes_a_stride_1_convolution_of_phases(channels: int, out: int, width: int, taps: int,
                                                                attrs: str) -> None:
    stride = int(attrs.split("strides=[1, ")[1].split("]")[0])
    (shape, strides), = conv_inputs(rewritten(row_conv(channels, out, width, taps, attrs), StridedRowConvAsPhases()))
    assert strides == (1, 1) and shape[:3] == (1, channels * stride, 1)


@pytest.mark.parametrize("channels,out,width,taps,attrs", SHAPES)
@pytest.mark.parametrize("constant_weight", [True, False])
def test_compiled_matches_the_direct_convolution(channels: int, out: int, width: int, taps: int, attrs: str,
                                                 constant_weight: bool) -> None:
    mod = row_conv(channels, out, width, taps, attrs)
    assert_compiled_matches(mod, width + taps, constant_weight)


@pytest.mark.parametrize("attrs,height,groups", [
    (", strides=[1, 4]", 1, 1),                      # a short stride: strided loads handle it
    (", strides=[1, 16], dilation=[1, 2]", 1, 1),
    (", strides=[1, 16]", 1, 2),
    (", strides=[1, 16]", 2, 1),                     # two rows
])


def test_other_convolutions_are_left_alone(attrs: str, height: int, groups: int) -> None:
    mod = row_conv(2, 4, 200, 32, attrs, height=height, groups=groups)
    assert conv_inputs(rewritten(mod, StridedRowConvAsPhases())) == conv_inputs(mod)


@pytest.mark.parametrize("channels,out,width,taps,attrs", SHAPES)
def test_frames_spanning_few_strides_become_one_product(channels: int, out: int, width: int, taps: int,
                                                        attrs: str) -> None:
    stride = int(attrs.split("strides=[1, ")[1].split("]")[0])
    mod = row_conv(channels, out, width, taps, attrs)
    after = rewritten(mod, StridedRowConvAsFrames())
    products = [n.op_name for n in post_order(infer_types(after)["main"])
                if isinstance(n, Call) and n.op_name in ("nn.conv2d", "nn.dense")]
    assert products == (["nn.dense"] if -(-taps // stride) <= MAX_FRAME_OVERLAP else ["nn.conv2d"])
    arrays = random_arrays(mod, width)
    np.testing.assert_allclose(np.asarray(Interpreter(after).run(arrays)), np.asarray(Interpreter(mod).run(arrays)),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,height,groups", [
    (", strides=[1, 4]", 1, 1),
    (", strides=[1, 16], dilation=[1, 2]", 1, 1),
    (", strides=[1, 16]", 1, 2),
    (", strides=[1, 16]", 2, 1),
])
def test_frames_leave_other_convolutions_alone(attrs: str, height: int, groups: int) -> None:
    mod = row_conv(2, 4, 200, 32, attrs, height=height, groups=groups)
    assert conv_inputs(rewritten(mod, StridedRowConvAsFrames())) == conv_inputs(mod)


@pytest.mark.parametrize("width,taps,stride,pads,window", [
    (1003, 64, 20, (0, 0), (7, 55)),   # a window inside the taps: frames start 7 samples in
    (517, 50, 8, (3, 5), (1, 30)),     # left padding longer than the leading zeros; 4 strides once trimmed
    (331, 50, 16, (9, 2), (12, 41)),   # leading zeros longer than the left padding
    (203, 21, 10, (0, 4), (0, 13)),    # only trailing zeros
])
def test_frames_leave_out_taps_whose_weights_are_all_zero(width: int, taps: int, stride: int,
                                                          pads: tuple[int, int], window: tuple[int, int]) -> None:
    rng = np.random.default_rng(width)
    weight = (rng.standard_normal((9, 2, 1, taps)) + 0.5).astype(np.float32)
    weight[..., :window[0]] = 0
    weight[..., window[1]:] = 0
    mod = parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(2, 2, 1, {width}), float32]) {{
  nn.conv2d(%x, meta[relay.Constant][0], channels=9, kernel_size=[1, {taps}], strides=[1, {stride}],
            padding=[0, {pads[0]}, 0, {pads[1]}])
}}""", constants=[weight])
    after = rewritten(mod, StridedRowConvAsFrames())
    dense, = [n for n in post_order(infer_types(after)["main"]) if isinstance(n, Call) and n.op_name == "nn.dense"]
    assert tuple(int(d) for d in dense.args[1].checked_type.shape) == (9, 2 * (window[1] - window[0]))
    x = {"x": (rng.standard_normal((2, 2, 1, width)) + 0.25).astype(np.float32)}
    want = np.asarray(Interpreter(mod).run(x))
    np.testing.assert_allclose(np.asarray(Interpreter(after).run(x)), want, rtol=1e-4, atol=1e-4)
    got = relay_tune.build(mod).run(**x)
    np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, (list, tuple)) else got), want,
                               rtol=1e-4, atol=1e-4)
