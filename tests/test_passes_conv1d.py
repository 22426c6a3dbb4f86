"""Conv1dAsConv2d: plain NCW 1-D convolutions become height-1 2-D convolutions; the compiled model equals the
reference interpreter's direct 1-D convolution (odd shapes, strides, dilation, asymmetric padding, random data,
constant and run-time weights, fused bias and activation), and grouped or other-layout convolutions are left
alone."""

from __future__ import annotations

import pytest
from conv_pass_checks import assert_compiled_matches, rewritten

from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import Conv1dAsConv2d
from relay_tune.text import parse_module


def conv1d(channels: int, out: int, width: int, kernel: int, attrs: str, groups: int = 1) -> IRModule:
    return parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {width}), float32], %w: Tensor[({out}, {channels // groups}, {kernel}), float32],
          %b: Tensor[({out}), float32]) {{
  nn.relu(nn.bias_add(nn.conv1d(%x, %w, channels={out}, kernel_size=[{kernel}], groups={groups}{attrs}), %b))
}}""")


def op_names(mod: IRModule) -> list[str]:
    return [n.op_name for n in post_order(mod["main"]) if isinstance(n, Call) and n.op_name]


# (input channels, output channels, width, kernel, attrs): an STFT-like strided filter bank (silero-vad's, smaller),
# padded 3-tap encoders, a strided and a dilated convolution, asymmetric padding, a 1-tap projection
SHAPES = [
    (1, 34, 97, 32, ", strides=[16]"),
    (17, 16, 5, 3, ", padding=[1, 1]"),
    (16, 8, 9, 3, ", strides=[2], padding=[1, 1]"),
    (5, 7, 23, 3, ", dilation=[3], padding=[2, 1]"),
    (6, 3, 11, 4, ", padding=[0, 3]"),
    (13, 1, 1, 1, ""),
]


@pytest.mark.parametrize("channels,out,width,kernel,attrs", SHAPES)
def test_conv1d_becomes_a_height_1_conv2d(channels: int, out: int, width: int, kernel: int, attrs: str) -> None:
    names = op_names(rewritten(conv1d(channels, out, width, kernel, attrs), Conv1dAsConv2d()))
    assert "nn.conv1d" not in names and "nn.conv2d" in names


@pytest.mark.parametrize("channels,out,width,kernel,attrs", SHAPES)
@pytest.mark.parametrize("constant_weight", [True, False])
def test_compiled_matches_the_direct_conv1d(channels: int, out: int, width: int, kernel: int, attrs: str,
                                            constant_weight: bool) -> None:
    mod = conv1d(channels, out, width, kernel, attrs)
    assert_compiled_matches(mod, channels * 100 + width, constant_weight)


def test_grouped_conv1d_is_left_alone() -> None:
    mod = conv1d(6, 4, 9, 3, ", padding=[1, 1]", groups=2)
    assert "nn.conv1d" in op_names(rewritten(mod, Conv1dAsConv2d()))
    assert_compiled_matches(mod, 3, constant_weight=True)
