"""ColumnConvAsRow: 2-D convolutions over a map one column wide (kernels `(k, 1)`: 1-D convolutions along the
height) become the same convolution over one row; the compiled model equals the reference interpreter's direct
convolution (odd shapes, strides, dilation, asymmetric padding, groups, random data, constant and run-time
weights, fused bias and activation), and convolutions with width to convolve are left alone."""

from __future__ import annotations

import pytest
from conv_pass_checks import assert_compiled_matches, rewritten

from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import ColumnConvAsRow
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types


def column_conv(channels: int, out: int, height: int, kernel: int, attrs: str, groups: int = 1,
                width: int = 1, kernel_width: int = 1) -> IRModule:
    return parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {height}, {width}), float32],
          %w: Tensor[({out}, {channels // groups}, {kernel}, {kernel_width}), float32], %b: Tensor[({out}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, channels={out}, kernel_size=[{kernel}, {kernel_width}],
                                groups={groups}{attrs}), %b))
}}""")


def conv_shapes(mod: IRModule) -> list[tuple[int, ...]]:
    typed = infer_types(mod)["main"]
    return [tuple(int(d) for d in n.args[0].checked_type.shape) for n in post_order(typed)
            if isinstance(n, Call) and n.op_name == "nn.conv2d"]


# (input channels, output channels, height, kernel, attrs, groups): magika's 5x1 encoder (smaller), padded and
# strided ones, dilation, asymmetric padding (top 2, bottom 1; the width unpadded), a grouped one
SHAPES = [
    (16, 24, 61, 5, "", 1),
    (8, 8, 33, 3, ", padding=[1, 0]", 1),
    (5, 7, 40, 3, ", strides=[2, 1], padding=[1, 0, 1, 0]", 1),
    (6, 9, 29, 3, ", dilation=[3, 1], padding=[2, 0, 1, 0]", 1),
    (12, 6, 17, 3, ", padding=[1, 0]", 3),
]


@pytest.mark.parametrize("channels,out,height,kernel,attrs,groups", SHAPES)
def test_a_one_column_conv_runs_over_one_row(channels: int, out: int, height: int, kernel: int, attrs: str,
                                             groups: int) -> None:
    mod = column_conv(channels, out, height, kernel, attrs, groups)
    assert conv_shapes(rewritten(mod, ColumnConvAsRow())) == [(1, channels, 1, height)]


@pytest.mark.parametrize("channels,out,height,kernel,attrs,groups", SHAPES)
@pytest.mark.parametrize("constant_weight", [True, False])
def test_compiled_matches_the_direct_convolution(channels: int, out: int, height: int, kernel: int, attrs: str,
                                                 groups: int, constant_weight: bool) -> None:
    mod = column_conv(channels, out, height, kernel, attrs, groups)
    assert_compiled_matches(mod, channels * 100 + height, constant_weight)


@pytest.mark.parametrize("width,kernel_width,attrs", [(3, 1, ""), (1, 1, ", padding=[1, 1]"), (2, 2, "")])
def test_convolutions_over_columns_are_left_alone(width: int, kernel_width: int, attrs: str) -> None:
    mod = column_conv(4, 4, 9, 3, attrs, width=width, kernel_width=kernel_width)
    assert conv_shapes(rewritten(mod, ColumnConvAsRow())) == conv_shapes(mod)
