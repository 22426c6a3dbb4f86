"""A convolution layer as a task describes it, and the same layer on channel-blocked layouts (`NCHW{b}c`).

`parse_layer` reads a task description (`conv2d_nchw+bias+relu 1x64x56x56 * 64x64x3x3 s1 p1`) into a `ConvLayer`;
`blocked_module` builds that layer as `nn.contrib_conv2d_NCHWc` on `NCHW{b}c` data with an `OIHW{b}i{b}o` weight
(a constant, already packed, as a layout-planned graph holds it), bias `(C/b, 1, 1, b)`, the same activation and a
residual in `NCHW{b}c`; depthwise layers as a grouped `nn.contrib_conv2d_NCHWc` with an `OIHW1i{b}o` weight. The
block is the target's float32 lanes where the channels divide by it, else the largest power of two that divides
them; an image's 3 input channels are one block (`NCHW3c`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.compile import bind_params
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types

_CONV = re.compile(r"^conv2d_nchw\+?([+\w]*) 1x(\d+)x(\d+)x(\d+) \* (\d+)x(\d+)x(\d+)x(\d+) s(\d+) p(\d+)(?: g(\d+))?$")


@dataclass(frozen=True)
class ConvLayer:
    """One convolution as a task describes it (NCHW, batch 1, square stride and padding)."""

    cin: int
    height: int
    width: int
    cout: int
    kernel: int
    stride: int
    pad: int
    groups: int
    epilogue: tuple[str, ...]  # of "bias", "relu", "clip", "add", in order

    @property
    def name(self) -> str:
        kind = "dw" if self.groups > 1 else "conv"
        return (f"{kind} {self.cin}x{self.height}x{self.width} -> {self.cout} {self.kernel}x{self.kernel} "
                f"s{self.stride}{' +add' if 'add' in self.epilogue else ''}")


def parse_layer(description: str) -> ConvLayer | None:
    """The layer of a task description (`conv2d_nchw+bias+relu 1x64x56x56 * 64x64x3x3 s1 p1`), None when it is not
    a square 2-D convolution."""
    found = _CONV.match(description)
    if not found:
        return None
    epilogue, cin, h, w, cout, _ci, kh, kw, stride, pad, groups = found.groups()
    if kh != kw:
        return None
    return ConvLayer(int(cin), int(h), int(w), int(cout), int(kh), int(stride), int(pad), int(groups or 1),
                     tuple(e for e in epilogue.split("+") if e))


def channel_block(channels: int, lanes: int) -> int | None:
    """The block of a channel count: `lanes` when it divides them, else the largest power of two that does (4 at
    least: a smaller block leaves most of a vector empty); None when none does."""
    block = lanes
    while block >= 4:
        if channels % block == 0:
            return block
        block //= 2
    return None


def blocked_source(layer: ConvLayer, lanes: int) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """Relay text of the blocked form of `layer` and the shapes of its constants (weight, bias), or None when its
    channels have no block."""
    bi, bo = channel_block(layer.cin, lanes), channel_block(layer.cout, lanes)
    if bi is None and layer.groups == 1 and layer.cin < 4:
        bi = layer.cin  # an image's 3 channels: one block of all of them (`NCHW3c`), broadcast one at a time
    if bi is None or bo is None:
        return None
    depthwise = layer.groups > 1
    if depthwise:
        if layer.groups != layer.cin or layer.cin != layer.cout:
            return None
        bi = bo = min(bi, bo)
    k, s, p = layer.kernel, layer.stride, layer.pad
    oh = (layer.height + 2 * p - k) // s + 1
    ow = (layer.width + 2 * p - k) // s + 1
    if depthwise:
        weight = (layer.cout // bo, 1, k, k, 1, bo)
        kernel_layout = f"OIHW1i{bo}o"
    else:
        weight = (layer.cout // bo, layer.cin // bi, k, k, bi, bo)
        kernel_layout = f"OIHW{bi}i{bo}o"
    out_ty = f"Tensor[(1, {layer.cout // bo}, {oh}, {ow}, {bo}), float32]"
    params = [f"%x: Tensor[(1, {layer.cin // bi}, {layer.height}, {layer.width}, {bi}), float32]",
              f"%w: Tensor[{weight}, float32]"]
    constants: dict[str, tuple[int, ...]] = {"w": weight}
    expr = (f"nn.contrib_conv2d_NCHWc(%x, %w, strides=[{s}, {s}], padding=[{p}, {p}, {p}, {p}], "
            f"groups={layer.groups}, channels={layer.cout}, kernel_size=[{k}, {k}], data_layout=\"NCHW{bi}c\", "
            f"kernel_layout=\"{kernel_layout}\", out_layout=\"NCHW{bo}c\")")
    for step in layer.epilogue:
        if step == "bias":
            params.append(f"%b: Tensor[({layer.cout // bo}, 1, 1, {bo}), float32]")
            constants["b"] = (layer.cout // bo, 1, 1, bo)
            expr = f"add({expr}, %b)"
        elif step == "relu":
            expr = f"nn.relu({expr})"
        elif step == "clip":
            expr = f"clip({expr}, a_min=0f, a_max=6f)"
        elif step == "add":
            params.append(f"%r: {out_ty}")
            expr = f"add({expr}, %r)"
        else:
            return None
    source = f"#[version = \"0.0.5\"]\ndef @main({', '.join(params)}) -> {out_ty} {{\n  {expr}\n}}\n"
    return source, constants


def blocked_module(layer: ConvLayer, lanes: int, seed: int = 0) -> Any:
    """The type-checked blocked form of `layer` with seeded random constants at trained scale, or None."""
    made = blocked_source(layer, lanes)
    if made is None:
        return None
    source, constants = made
    rng = np.random.default_rng(seed)
    fan_in = layer.kernel * layer.kernel * layer.cin // layer.groups
    values = {name: (rng.standard_normal(shape) * (np.sqrt(2.0 / fan_in) if name == "w" else 0.1))
              .astype("float32") for name, shape in constants.items()}
    return infer_types(bind_params(infer_types(parse_module(source)), values))
