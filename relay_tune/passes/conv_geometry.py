"""What the convolution rewrites read off an `nn.conv2d` call: its (height, width) attribute pairs, its padding as
(top, left, bottom, right), and its tensor types where it is a plain NCHW / OIHW convolution with static shapes."""

from __future__ import annotations

from relay_tune.ir import Call, TensorType
from relay_tune.passes.base import tensor_type_of


def int_pair(value: object) -> tuple[int, ...]:
    """A (height, width) attribute (`strides`, `dilation`, `kernel_size`): one value stands for both."""
    values = (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)  # type: ignore[attr-defined]
    return values * 2 if len(values) == 1 else values


def conv2d_padding(value: object) -> tuple[int, int, int, int]:
    """`padding` as (top, left, bottom, right): one value pads every side, two pad (height, width) on both sides."""
    pads = int_pair(value)
    return (pads[0], pads[1], pads[0], pads[1]) if len(pads) == 2 else pads  # type: ignore[return-value]


def plain_conv2d_types(call: Call) -> tuple[TensorType, TensorType, TensorType] | None:
    """(data, weight, output) types of an `nn.conv2d` in the NCHW / OIHW layouts with static 4-D shapes, else None."""
    data, weight, out = tensor_type_of(call.args[0]), tensor_type_of(call.args[1]), tensor_type_of(call)
    if data is None or weight is None or out is None or len(data.shape) != 4 or len(weight.shape) != 4:
        return None
    attrs = call.attrs
    layouts = (str(attrs["data_layout"]), str(attrs["kernel_layout"]), str(attrs["out_layout"] or "NCHW"))
    return (data, weight, out) if layouts == ("NCHW", "OIHW", "NCHW") else None
