"""PlanLayouts: choose, for the whole graph, which 4-D activations are stored channel-blocked (`NCHW{k}c`).

A convolution on blocked data (`k` consecutive channels of one pixel in one vector register) runs as vector FMAs
over output channels with unit-stride loads. Blocking one convolution at a time would pay two layout transforms per
convolution; this pass decides layouts for the graph, so that a chain of convolutions and the element-wise ops,
pooling and concatenations between them stay blocked, and a `layout_transform` appears only where a value's layout
really changes (the graph's inputs, the convolution chain's ends, an operator that needs NCHW).

Blocks are per tensor. `b` is the target's float32 vector lanes (16 on AVX-512); a tensor of C channels is stored
in `NCHW{b}c` when b divides C, else in `NCHW{b/2}c` when b/2 (at least 8) does (MobileNet v2's 24 channels, 40,
56, 72...: blocks of 8 on AVX-512), else it stays NCHW.

The plan is one forward walk in data-flow order (as TVM's ConvertLayout): every rewritten value is either in its
original layout or in one `NCHW{k}c`, and each consumer asks for its inputs in the layout it wants. A value asked for
in a layout it does not have gets one `layout_transform` (blocked to blocked directly: NCHW8c -> NCHW16c), shared by
every consumer that asks for the same (so no value is transformed twice into one layout, and a transform of a
transform becomes one transform from the first layout, or cancels when it leads back there).

- `nn.conv2d` (NCHW data, OIHW kernel, groups 1, float32) becomes `nn.contrib_conv2d_NCHWc` when its output
  channels have a block `bo`: on `NCHW{bi}c` data, where `bi` is the block its input is in already (any block: a
  convolution reads `NCHW8c` with an `OIHW8i16o` kernel and writes `NCHW16c`), or the full block `b`, transformed
  to, when the input is NCHW and `b` divides its channels. A half block runs at half the vector width, so it only
  continues a blocked chain: a convolution never has its input transformed into one, and writes one only where its
  output reaches a convolution writing a blocked layout through ops that keep blocks (MobileNet v2's 24-channel
  projections into the next expansion; not SqueezeNet's 1000-channel classifier into global pooling, nor
  ShuffleNet's 24-channel stem into 58-channel branches: those stay NCHW). The weight is wrapped in
  `layout_transform(w, "OIHW", "OIHW{bi}i{bo}o")`: the FoldConstant after this pass packs a constant weight once at
  build time; a weight that is a model input is packed by the model on every run (still correct).
- An 8-bit `nn.conv2d` (uint8 data, a constant int8 weight, int32 sums; what `QuantizedProducts` builds) becomes
  `nn.contrib_conv2d_NCHWc_int8` (`relay_tune.op.quantized`): input in its block when blocked (else the full block,
  or blocks of 4 for fewer channels than a block, zero channels appended where the block does not divide them),
  output in the full block, the weight packed here for four-byte dot products (or, with
  `PassConfig.full_range_int8 == "int16"`, a weight whose pairs would saturate vpmaddubsw packed in int8 pairs for
  vpmaddwd, widened to int16 as the kernel loads them). A zero-point `nn.pad` of its input
  (spatial axes only) becomes the convolution's own padding with that value, so the chain stays blocked. Output
  channels the block does not divide are computed padded and sliced off in NCHW. An 8-bit `nn.dense` (uint8 rows,
  a constant int8 weight, int32 sums) becomes the same convolution over its rows as a batch of 1x1 maps.
- Depthwise convolutions (groups == channels) become `OIHW1i{k}o` kernels in their input's block when `depthwise`,
  and only when their input is blocked already: a memory-bound depthwise kernel cannot win back the transform of
  its input.
- A stem, a convolution of fewer input channels than `b` (3 RGB channels) whose output channels have a block and
  whose output reaches a convolution writing a blocked layout through ops that keep blocks, reads its input as one
  block of all its channels (`NCHW3c`, pixel-major like NHWC, kernel `OIHW3i{bo}o`) and writes `NCHW{bo}c`: the
  transform of the 3-channel image is smaller than one of the stem's output, and the stem's ReLU and pooling run
  blocked (`stem=False`: the stem stays NCHW and its output is transformed where the first blocked consumer needs
  it). A stem with a kernel of 5x5 or more whose output channels have the full block is blocked wherever its output
  goes (AlexNet's, ZFNet's and Inception v1's stems feed an LRN, which needs NCHW): there the blocked kernel's speed
  pays for the transform of its output. A 3x3 stem feeding only NCHW convolutions (ShuffleNet v1's grouped ones)
  stays NCHW.
- A grouped convolution with a spatial kernel (3x3 and up) whose groups hold whole blocks of `b` input and output
  channels (AlexNet's two-group 5x5 and 3x3 convolutions) becomes a grouped `nn.contrib_conv2d_NCHWc` in `NCHW{b}c`,
  `OIHW{b}i{b}o` kernel (each output block reads its group's input blocks).
- Any other convolution (output channels with no block, ShuffleNet's 58 or 116; input channels that `b` does not
  divide, coming from NCHW; other grouped convolutions) stays `nn.conv2d` in NCHW.
- Element-wise ops follow their input. A binary broadcast op (`add`, `multiply`, comparisons...) or `nn.bias_add`
  on axis 1 is blocked when one operand is blocked, in the widest block of its operands (one in blocks of 8 and one
  in blocks of 16 meet in NCHW16c: the other is transformed), and every other operand fits the blocked output: a
  scalar stays as it is; a per-channel tensor ((C,), (C, 1, 1), (1, C, 1, 1): all other axes 1) is reshaped to its
  blocked shape (the reshape folds into a new constant, or is an alias at run time); any other 4-D operand with the
  same channel count ((N, C, H, W), the (N, C, 1, 1) scale of a squeeze-excitation block) is transformed to the
  blocked layout. An operand that fits none of these (a (1, H, W) spatial map) keeps the whole op in NCHW.
- Max/avg pooling and global pooling of a blocked input take `layout="NCHW{k}c"` in its block; `concatenate` on the
  channel axis, when one of its inputs is blocked, concatenates along the outer block axis in the widest block (b,
  else b/2) that divides every input's channel count (24 + 32 channels: blocks of 8), or stays NCHW.
- `min` and `max` of every element of a blocked input (keepdims off) read it in its block: the same elements, one
  scalar, no transform (DynamicQuantizeLinear's range of a convolution's output).
- Every other operator (reshape, flatten, dense, softmax, transpose, slices, other reductions, pad, calls of
  functions), tuples and projections get their inputs in the original layout, and the function returns its results
  in their original layouts: callers see the same signature.

Functions with `let` bindings, `if` or nested function literals are left as they are (the walk plans data-flow
graphs; imported and zoo models are graphs). The rewritten function computes the same values as the original
(tests check every planned model against the unplanned one with the reference interpreter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, Let, TensorType, Tuple, op
from relay_tune.ir.expr import If
from relay_tune.op.quantized import OP_NAME as INT8_CONV
from relay_tune.op.quantized import pack_int8_pairs, pack_int8_weight, pack_int16_weight
from relay_tune.op.reduce import MIN_MAX, reduce_axes
from relay_tune.op.registry import OpPattern, get_op, has_op
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    call_op,
    dataflow_post_order,
    is_opaque_function,
    map_functions,
    register_pass,
    retype,
    tensor_type_of,
)

PLAIN = "NCHW"  # the original layout of every 4-D activation this pass plans
_BINARY_OPS = frozenset({
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
})
# Reductions whose result over every element does not depend on the elements' order (a sum's rounding would).
_FULL_REDUCTIONS = frozenset({"min", "max"})
_POOL_OPS = frozenset({"nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d"})
_CONV_DTYPE = "float32"
_MIN_HALF_BLOCK = 8  # half blocks narrower than this are not planned (see `_Planner.half`)


def blocked_layout(block: int) -> str:
    return f"NCHW{block}c"


def _layout(block: int) -> str:
    """The layout of a value stored in `block` (0: the original layout)."""
    return blocked_layout(block) if block else PLAIN


def _is_unary_elementwise(name: str) -> bool:
    """Element-wise operators of one input (relu, sigmoid, clip, cast...): the output is the input's shape, every
    element depends on the element at the same place, so any layout works."""
    if not has_op(name):
        return False
    definition = get_op(name)
    return definition.pattern == OpPattern.ELEMWISE and definition.num_inputs == 1


def _static_4d(node: Expr) -> TensorType | None:
    ty = tensor_type_of(node)
    return ty if ty is not None and ty.ndim == 4 else None


def _kernel_taps(weight: TensorType) -> int:
    """The taps of a convolution kernel (9 for 3x3)."""
    return int(weight.shape[2]) * int(weight.shape[3])  # type: ignore[arg-type]  # static: _static_4d


def _channels(ty: TensorType) -> int:
    return int(ty.shape[1])  # type: ignore[arg-type]  # static: checked by tensor_type_of


class _Planner:
    """The forward walk over one function body (see the module docstring)."""

    def __init__(self, block: int, depthwise: bool, stem: bool, half_blocks: bool, int16_weights: bool) -> None:
        self.block = block
        self.int16_weights = int16_weights
        # The half block, for channel counts the full block does not divide (24, 40, 56... on AVX-512): at least 8
        # lanes, so that a block still fills a vector of 8 (AVX2 targets, block 8, have none).
        self.half = block // 2 if half_blocks and block // 2 >= _MIN_HALF_BLOCK else 0
        self.depthwise = depthwise
        self.stem = stem
        # id(original node) -> (rewritten node, its block: 0 for the original layout, k for NCHW{k}c)
        self.value: dict[int, tuple[Expr, int]] = {}
        # (id(original node), wanted block) -> the shared transform that delivers it
        self.converted: dict[tuple[int, int], Expr] = {}
        # ids of the values that reach a convolution writing a blocked layout through layout-following ops
        self.feeds_blocked: set[int] = set()

    # -- values in a wanted layout -------------------------------------------------------------------------------

    def get(self, node: Expr, want: int = 0) -> Expr:
        """The rewritten `node` in `NCHW{want}c` (0: its original layout), transformed once if need be."""
        new, have = self.value[id(node)]
        if have == want:
            return new
        key = (id(node), want)
        found = self.converted.get(key)
        if found is None:
            found = _transform(new, _layout(have), _layout(want))
            self.converted[key] = found
        return found

    def block_of(self, node: Expr) -> int:
        """The block `node`'s value is stored in (0: its original layout)."""
        return self.value[id(node)][1]

    def block_for(self, channels: int) -> int:
        """The block a tensor of `channels` channels is stored in when it is planned: the full block where it
        divides them, else the half block where that does, else 0 (NCHW)."""
        if channels % self.block == 0:
            return self.block
        if self.half and channels % self.half == 0:
            return self.half
        return 0

    # -- the walk ------------------------------------------------------------------------------------------------

    def visit(self, node: Expr) -> None:
        if isinstance(node, Call) and node.op_name is not None:
            planned = self._call(node)
            if planned is not None:
                self.value[id(node)] = planned
                return
        children = () if is_opaque_function(node) else node.children()
        if not children:
            self.value[id(node)] = (node, 0)
            return
        new_children = [self.get(c) if id(c) in self.value else c for c in children]
        changed = any(n is not c for n, c in zip(new_children, children))
        self.value[id(node)] = (node.with_children(new_children) if changed else node, 0)

    def _call(self, call: Call) -> tuple[Expr, int] | None:
        """A blocked rewrite of `call` and its block, or None to keep it in the original layout (inputs in theirs)."""
        name = call.op_name
        assert name is not None
        if name == "nn.conv2d":
            return self._conv(call)
        if name == "nn.dense":
            return self._int8_dense(call) if _is_int8_dense(call) else None
        if name in _POOL_OPS:
            return self._pool(call)
        if name == "concatenate":
            return self._concatenate(call)
        if name in _BINARY_OPS or name == "nn.bias_add":
            return self._broadcast(call)
        if name in _FULL_REDUCTIONS or name == MIN_MAX:
            return self._full_reduction(call)
        if _is_unary_elementwise(name) and len(call.args) == 1:
            block = self.block_of(call.args[0])
            if block:
                return Call(call.op, (self.get(call.args[0], block),), call.attrs, call.span), block
        return None

    def _conv(self, call: Call) -> tuple[Expr, int] | None:
        if _is_int8_conv(call):
            return self._int8_conv(call)
        attrs = call.attrs
        if attrs.get("data_layout", "NCHW") != "NCHW" or attrs.get("kernel_layout", "OIHW") != "OIHW":
            return None
        if attrs.get("out_layout") not in ("", "NCHW", None):
            return None
        if attrs.get("out_dtype") not in ("", None, _CONV_DTYPE):
            return None
        data, weight, out = _static_4d(call.args[0]), _static_4d(call.args[1]), _static_4d(call)
        if data is None or weight is None or out is None:
            return None
        if not (data.dtype == weight.dtype == out.dtype == _CONV_DTYPE):
            return None
        c_in, c_out, groups = _channels(data), _channels(out), int(attrs.get("groups", 1))  # type: ignore[arg-type]
        have = self.block_of(call.args[0])
        if groups == 1:
            bo = self.block_for(c_out)
            if bo and bo != self.block and id(call) not in self.feeds_blocked:
                # A half block runs at half the vector width: written only where the chain goes on blocked (a
                # 24-channel projection into the next expansion), not where it ends (SqueezeNet's 1000-channel
                # classifier convolution into pooling, ShuffleNet's 24-channel stem into 58-channel branches).
                bo = 0
            # The input's block where it is blocked already (a convolution reads any block: NCHW8c x OIHW8i16o ->
            # NCHW16c); else the full block, transformed to. A half block is taken only where the input has it
            # already: it saves a transform there, but is not worth one of its own.
            bi = have or (self.block if c_in % self.block == 0 else 0)
            if bo == 0:
                return None
            if bi:
                data_block, kernel_layout = bi, f"OIHW{bi}i{bo}o"
            elif self.stem and c_in < self.block and (id(call) in self.feeds_blocked
                                                       or (bo == self.block and _kernel_taps(weight) >= 25)):
                # A stem (3 RGB channels): all its input channels form one block (NCHW3c, pixel-major like NHWC),
                # so it writes NCHW{bo}c directly; transforming the 3-channel image costs less than its output.
                # Where its output reaches a blocked convolution; or where its kernel is wide (5x5 and up): then
                # the blocked stem is twice as fast as the NCHW one (ZFNet's and Inception v1's 7x7 stride-2 stems,
                # 80-90 GFLOPS against 35-45 on one AVX2 core), far more than the transform of its output back to
                # NCHW costs, where the LRN after AlexNet's, ZFNet's and Inception v1's stems needs it. A 3x3 stem
                # feeding only NCHW convolutions (ShuffleNet v1's grouped ones) stays NCHW: blocked, it costs a
                # transform into every unit and one out of it.
                data_block, kernel_layout = c_in, f"OIHW{c_in}i{bo}o"
            else:
                return None
        elif (groups > 1 and _kernel_taps(weight) >= 9 and (c_in // groups) % self.block == 0
              and (c_out // groups) % self.block == 0):
            # A grouped convolution whose groups hold whole blocks, with a spatial kernel (AlexNet's 5x5 and 3x3
            # convolutions in two groups): as the dense blocked kernel, group by group, it runs at three times the
            # speed of the grouped NCHW one (384x12x12, 3x3, two groups: 93 against 31 GFLOPS on one AVX2 core),
            # which pays for transforms around it. Grouped 1x1 convolutions (ShuffleNet v1) do too few FLOPs per
            # value for that and stay NCHW.
            data_block = bo = self.block
            kernel_layout = f"OIHW{bo}i{bo}o"
        elif (self.depthwise and have and groups == c_in == c_out and int(weight.shape[1]) == 1):  # type: ignore[arg-type]
            # A depthwise convolution does a few FLOPs per byte: blocking it cannot pay for a transform of its
            # input, so it is blocked only where its input already is, in its input's block.
            data_block, kernel_layout, bo = have, f"OIHW1i{have}o", have
        else:
            return None
        x = self.get(call.args[0], data_block)
        w = _transform(self.get(call.args[1]), "OIHW", kernel_layout)
        new_attrs = attrs.with_updates(data_layout=_layout(data_block), kernel_layout=kernel_layout,
                                       out_layout=_layout(bo))
        return Call(op("nn.contrib_conv2d_NCHWc"), (x, w), new_attrs, call.span), bo

    def _int8_conv(self, call: Call) -> tuple[Expr, int]:
        """`call` (see `_is_int8_conv`) as `nn.contrib_conv2d_NCHWc_int8` (module docstring)."""
        attrs = call.attrs
        source, padding, pad_value = call.args[0], [int(p) for p in attrs.get("padding", (0, 0))], 0  # type: ignore[union-attr]
        if len(padding) == 2:
            padding = padding * 2
        zero_point = _zero_point_pad(source)
        if zero_point is not None and not any(padding):
            source, (padding, pad_value) = source.args[0], zero_point  # type: ignore[union-attr]
        data, out = _static_4d(source), _static_4d(call)
        assert data is not None and out is not None
        have = self.block_of(source)
        x = self.get(source, have) if have and have % 4 == 0 else self.get(source)
        weight = call.args[1]
        assert isinstance(weight, Constant)
        strides = tuple(int(s) for s in attrs.get("strides", (1, 1)))  # type: ignore[union-attr]
        return self._int8_product(x, have if have % 4 == 0 else 0, data, out, weight.data, strides, padding,
                                  pad_value)

    def _int8_dense(self, call: Call) -> tuple[Expr, int]:
        """An 8-bit `nn.dense` (see `_is_int8_dense`) as the int8 convolution of its rows as a batch of 1x1 maps:
        (M, K) -> (M, K, 1, 1), whose blocked layout is a reshape, so only the weight changes; an int16 one of
        several rows as one map (`_int16_dense_as_row`)."""
        data, out, weight = tensor_type_of(call.args[0]), tensor_type_of(call), call.args[1]
        assert data is not None and out is not None and isinstance(weight, Constant)
        (m, k), units = (int(d) for d in data.shape), int(out.shape[1])  # type: ignore[arg-type]
        if data.dtype == "int16" and m > 1:
            return self._int16_dense_as_row(call, m, k, units)
        x = call_op("reshape", self.get(call.args[0]), newshape=(m, k, 1, 1))
        maps = TensorType((m, k, 1, 1), data.dtype), TensorType((m, units, 1, 1), "int32")
        product, block = self._int8_product(x, 0, *maps, weight.data.reshape(units, k, 1, 1), (1, 1),
                                            [0, 0, 0, 0], 0)
        return call_op("reshape", self.in_plain(product, block), newshape=(m, units)), 0

    def _int16_dense_as_row(self, call: Call, m: int, k: int, units: int) -> tuple[Expr, int]:
        """An int16 `nn.dense` of M rows as the 1x1 convolution of one map whose M pixels are the rows: (M, K) ->
        (1, K, 1, M), so the packed convolution tiles the rows as it tiles a map's columns (as M 1x1 maps, the
        dynamically quantized CRNN's 32 x 1024 x 8210 classifier took several times the float dense's time)."""
        weight = call.args[1]
        assert isinstance(weight, Constant)
        x = call_op("reshape", call_op("transpose", self.get(call.args[0]), axes=(1, 0)), newshape=(1, k, 1, m))
        maps = TensorType((1, k, 1, m), "int16"), TensorType((1, units, 1, m), "int32")
        product, block = self._int8_product(x, 0, *maps, weight.data.reshape(units, k, 1, 1), (1, 1),
                                            [0, 0, 0, 0], 0)
        rows = call_op("reshape", self.in_plain(product, block), newshape=(units, m))
        return call_op("transpose", rows, axes=(1, 0)), 0

    def in_plain(self, value: Expr, block: int) -> Expr:
        """A rewritten value stored in `block`, in the original layout."""
        return _transform(value, _layout(block), PLAIN) if block else value

    def _int8_product(self, x: Expr, have: int, data: TensorType, out: TensorType, weight: np.ndarray,
                      strides: tuple[int, ...], padding: list[int], pad_value: int) -> tuple[Expr, int]:
        """The int8 blocked convolution of `x` (NCHW `data`, or already in `NCHW{have}c`) by an OIHW int8 `weight`
        into `out`, and its block (0 where output channels were padded and sliced off in NCHW)."""
        c_in, c_out = _channels(data), _channels(out)
        if have:
            bi = have
        else:
            bi = self.block if c_in >= self.block else 4
            if c_in % bi:  # zero channels up to a whole block (their weights are zero too)
                x = call_op("nn.pad", x, Constant(np.asarray(0, dtype=data.dtype)),
                            pad_width=[[0, 0], [0, -c_in % bi], [0, 0], [0, 0]])
            x = _transform(x, PLAIN, _layout(bi))
        bo = self.block
        if weight.dtype == np.int16:  # int16 data: int16 pairs for vpmaddwd whatever the values
            packed, pairs = pack_int16_weight(weight, bi, bo), False
        else:
            packed, pairs = pack_int8_weight(weight, bi, bo)
            if not pairs and self.int16_weights:  # pairs that would saturate vpmaddubsw: int8 pairs for vpmaddwd
                packed = pack_int8_pairs(weight, bi, bo)
        conv: Expr = call_op(INT8_CONV, x, Constant(packed), strides=strides, padding=tuple(padding),
                             pad_value=int(pad_value), pairs_fit_int16=pairs)
        if c_out % bo == 0:
            return conv, bo
        n, _, h, w = (int(d) for d in out.shape)  # type: ignore[arg-type]
        plain = _transform(conv, _layout(bo), PLAIN)
        return call_op("strided_slice", plain, begin=[0, 0, 0, 0], end=[n, c_out, h, w]), 0

    def _pool(self, call: Call) -> tuple[Expr, int] | None:
        attrs = call.attrs
        if attrs.get("layout", "NCHW") != "NCHW" or attrs.get("out_layout") not in ("", "NCHW", None):
            return None
        block = self.block_of(call.args[0])
        if not block:
            return None
        updates: dict[str, str] = {"layout": _layout(block)}
        if attrs.get("out_layout"):
            updates["out_layout"] = _layout(block)
        x = self.get(call.args[0], block)
        return Call(call.op, (x,), attrs.with_updates(**updates), call.span), block

    def _full_reduction(self, call: Call) -> tuple[Expr, int] | None:
        """`min`/`max` (or `min_max`) of every element of a blocked input, read in its block: the same elements in
        another order (the block divides the channels, so no padding is read), one result, with no transform of the
        input."""
        ty = _static_4d(call.args[0])
        block = self.block_of(call.args[0])
        if not block or ty is None or _channels(ty) % block:
            return None
        if call.op_name != MIN_MAX and (reduce_axes(4, call.attrs.get("axis"), bool(call.attrs.get("exclude")))
                                        != (0, 1, 2, 3) or call.attrs.get("keepdims")):
            return None
        return Call(call.op, (self.get(call.args[0], block),), call.attrs, call.span), 0

    def _concatenate(self, call: Call) -> tuple[Expr, int] | None:
        fields_node = call.args[0]
        out = _static_4d(call)
        if not isinstance(fields_node, Tuple) or out is None:
            return None
        if int(call.attrs.get("axis", 0)) % 4 != 1:  # type: ignore[arg-type]
            return None
        fields = fields_node.fields
        if not any(self.block_of(f) for f in fields):
            return None
        types = [tensor_type_of(f) for f in fields]
        if not all(t is not None and t.ndim == 4 for t in types):
            return None
        counts = [_channels(t) for t in types if t is not None]
        # One block for every input, the widest that divides every channel count (24 + 32: blocks of 8).
        block = next((k for k in (self.block, self.half) if k and all(c % k == 0 for c in counts)), 0)
        if not block:
            return None
        blocked_fields = Tuple(tuple(self.get(f, block) for f in fields), fields_node.span)
        # Axis 1 of NCHW{k}c is the outer channel-block axis: blocks of whole multiples of k concatenate there.
        return Call(call.op, (blocked_fields,), call.attrs.with_updates(axis=1), call.span), block

    def _broadcast(self, call: Call) -> tuple[Expr, int] | None:
        out = _static_4d(call)
        blocks = [self.block_of(a) for a in call.args if self.block_of(a)]
        if out is None or not blocks:
            return None
        channels = _channels(out)
        # Operands in different blocks (a value concatenated in blocks of 8 added to one in blocks of 16) meet in
        # the widest: one of them is transformed.
        block = max(blocks)
        if channels % block != 0:
            return None
        if call.op_name == "nn.bias_add":
            axis = int(call.attrs.get("axis", 1))  # type: ignore[arg-type]
            if axis % 4 != 1 or not self.block_of(call.args[0]):
                return None
            bias = self._per_channel(call.args[1], channels, block)
            if bias is None:
                return None
            return call_op("add", *(self.get(call.args[0], block), bias)), block
        args: list[Expr] = []
        for arg in call.args:
            fitted = self._operand(arg, channels, block)
            if fitted is None:
                return None
            args.append(fitted)
        return Call(call.op, tuple(args), call.attrs, call.span), block

    def _operand(self, arg: Expr, channels: int, block: int) -> Expr | None:
        """`arg` rewritten to broadcast against a (N, C/k, H, W, k) result, or None when it cannot."""
        ty = tensor_type_of(arg)
        if ty is None:
            return None
        if self.block_of(arg):
            return self.get(arg, block)
        if all(d == 1 for d in ty.shape):
            return self.get(arg)  # a scalar (or all-ones tensor) broadcasts against any layout
        per_channel = self._per_channel(arg, channels, block)
        if per_channel is not None:
            return per_channel
        if ty.ndim == 4 and _channels(ty) == channels:
            return self.get(arg, block)
        return None

    def _per_channel(self, arg: Expr, channels: int, block: int) -> Expr | None:
        """A (C,), (C, 1, 1) or (1, C, 1, 1) tensor reshaped to (C/k, 1, 1, k) or (1, C/k, 1, 1, k): channel
        c = outer * k + inner, which is the row-major order of the blocked axes, so a reshape is the transform."""
        ty = tensor_type_of(arg)
        if ty is None or ty.ndim not in (1, 3, 4):
            return None
        axis = {1: 0, 3: 0, 4: 1}[ty.ndim]
        if ty.shape[axis] != channels or any(d != 1 for i, d in enumerate(ty.shape) if i != axis):
            return None
        shape = [channels // block, 1, 1, block] if ty.ndim in (1, 3) else [1, channels // block, 1, 1, block]
        return call_op("reshape", *(self.get(arg),), newshape=tuple(shape))




def _is_int8_conv(call: Call) -> bool:
    """An `nn.conv2d` the int8 blocked convolution computes: NCHW uint8 data, a constant OIHW int8 weight (or int16
    data and weight), int32 sums, groups and dilation 1, static shapes."""
    attrs = call.attrs
    if attrs.get("data_layout", "NCHW") != "NCHW" or attrs.get("kernel_layout", "OIHW") != "OIHW" \
            or attrs.get("out_layout") not in ("", "NCHW", None) or int(attrs.get("groups", 1)) != 1:  # type: ignore[arg-type]
        return False
    if any(int(d) != 1 for d in attrs.get("dilation", (1, 1))):  # type: ignore[union-attr]
        return False
    data, out, weight = _static_4d(call.args[0]), _static_4d(call), call.args[1]
    return (data is not None and out is not None and out.dtype == "int32" and isinstance(weight, Constant)
            and weight.data.ndim == 4 and _int8_operands(data.dtype, weight.data.dtype))


def _is_int8_dense(call: Call) -> bool:
    """An `nn.dense` of uint8 rows (M, K) by a constant int8 weight (N, K) (or int16 by int16) into int32 sums."""
    data, out, weight = tensor_type_of(call.args[0]), tensor_type_of(call), call.args[1]
    return (call.op_name == "nn.dense" and data is not None and out is not None and data.ndim == 2
            and out.dtype == "int32" and isinstance(weight, Constant) and weight.data.ndim == 2
            and _int8_operands(data.dtype, weight.data.dtype))


def _int8_operands(data: str, weight: np.dtype) -> bool:
    """uint8 data by an int8 weight, or int16 data by an int16 weight (QuantizedProducts' int16 products): the
    operand types of the packed int8 convolution."""
    return (data == "uint8" and weight == np.int8) or (data == "int16" and weight == np.int16)


def _zero_point_pad(node: Expr) -> tuple[list[int], int] | None:
    """(top, left, bottom, right) and the value of an `nn.pad` of a 4-D tensor on its spatial axes only, with a
    constant value; None for anything else."""
    if not (isinstance(node, Call) and node.op_name == "nn.pad" and len(node.args) == 2):
        return None
    value = node.args[1]
    widths = node.attrs.get("pad_width")
    mode = str(node.attrs.get("pad_mode", "constant"))
    if not isinstance(value, Constant) or value.data.size != 1 or mode != "constant" or widths is None \
            or len(widths) != 4:  # type: ignore[arg-type]
        return None
    (n0, n1), (c0, c1), (t, b), (left, r) = ((int(a), int(z)) for a, z in widths)  # type: ignore[union-attr, misc]
    if n0 or n1 or c0 or c1 or min(t, b, left, r) < 0:
        return None
    return [t, left, b, r], int(value.data.reshape(()))


def _transform(value: Expr, src: str, dst: str) -> Expr:
    """`layout_transform(value, src, dst)`. When `value` is itself a transform from layout A, what it transformed
    from (A == dst) or one transform A -> dst (NCHW -> NCHW16c -> NCHW8c becomes NCHW -> NCHW8c): no value is
    transformed twice in a row."""
    if isinstance(value, Call) and value.op_name == "layout_transform" and value.attrs.get("dst_layout") == src:
        first = str(value.attrs.get("src_layout"))
        if first == dst:
            return value.args[0]
        if first.startswith(PLAIN) and dst.startswith(PLAIN):
            src, value = first, value.args[0]
    return call_op("layout_transform", *(value,), src_layout=src, dst_layout=dst)


def _plannable(func: Function, planner: _Planner) -> bool:
    """True when `func` is a data-flow graph with at least one convolution worth blocking."""
    worth = False
    for node in dataflow_post_order(func.body):
        if isinstance(node, (Let, If)) or (isinstance(node, Function) and not is_opaque_function(node)):
            return False
        if isinstance(node, Call) and node.op_name == "nn.conv2d":
            out = _static_4d(node)
            # an 8-bit convolution is always worth it: the packed int8 kernel is the fast one at any channel count
            worth = worth or (out is not None and planner.block_for(_channels(out)) > 0) or _is_int8_conv(node)
        if isinstance(node, Call) and node.op_name == "nn.dense":
            worth = worth or _is_int8_dense(node)
    return worth


def _feeding_blocked(body: Expr, planner: _Planner) -> set[int]:
    """ids of the nodes whose value reaches a convolution that writes a blocked layout (groups 1, output channels
    with a block) through ops that keep a blocked layout (element-wise, broadcast, pooling, concatenation, depthwise
    convolutions): where a half block written there would be read blocked."""
    order = list(dataflow_post_order(body))
    consumers: dict[int, list[Expr]] = {}
    for node in order:
        if is_opaque_function(node):
            continue
        for child in node.children():
            consumers.setdefault(id(child), []).append(node)
    feeds: set[int] = set()

    def continues(user: Expr) -> bool:
        if isinstance(user, Tuple):
            return id(user) in feeds
        if not isinstance(user, Call) or user.op_name is None:
            return False
        name = user.op_name
        if name == "nn.conv2d":
            out = _static_4d(user)
            if out is None:
                return False
            groups = int(user.attrs.get("groups", 1))  # type: ignore[arg-type]
            if groups == 1:
                return planner.block_for(_channels(out)) > 0
            return groups == _channels(out) and id(user) in feeds  # depthwise: the block goes through
        if (name in _POOL_OPS and not name.startswith("nn.global")) or name in _BINARY_OPS \
                or name in ("nn.bias_add", "concatenate") or _is_unary_elementwise(name):
            return id(user) in feeds
        return False

    for node in reversed(order):  # consumers before producers
        if any(continues(user) for user in consumers.get(id(node), ())):
            feeds.add(id(node))
    return feeds


def plan_function(func: Function, block: int, depthwise: bool = True, stem: bool = True,
                  half_blocks: bool = True, int16_weights: bool = False) -> Function:
    """`func` with its activations planned in `NCHW{block}c` (or `NCHW{block/2}c`) where that keeps convolution
    chains blocked. `int16_weights`: int8 weights whose pairs do not fit int16 are packed as int16 pairs."""
    planner = _Planner(block, depthwise, stem, half_blocks, int16_weights)
    if not _plannable(func, planner):
        return func
    if planner.half or planner.stem:
        planner.feeds_blocked = _feeding_blocked(func.body, planner)
    for param in func.params:
        planner.value[id(param)] = (param, 0)
    for node in dataflow_post_order(func.body):
        if id(node) not in planner.value:
            planner.visit(node)
    body = planner.get(func.body)
    if body is func.body:
        return func
    return Function(func.params, body, func.ret_type, func.attrs, func.type_params, func.span)


@register_pass
@dataclass(frozen=True)
class PlanLayouts(Pass):
    """Plan channel-blocked layouts (module docstring). `block`: the block size (the target's float32 vector
    lanes); None takes `PassConfig.layout_block`; 0 turns the pass off. `depthwise`: block depthwise convolutions
    too. `stem`: stems of fewer input channels than the block write blocked outputs. `half_blocks`: channel counts
    that only half the block divides (24 on AVX-512) are blocked in half blocks (at least 8 lanes)."""

    block: int | None = None
    depthwise: bool = True
    stem: bool = True
    half_blocks: bool = True
    name: ClassVar[str] = "PlanLayouts"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def __post_init__(self) -> None:
        if self.block is not None and self.block < 0:
            raise ValueError(f"PlanLayouts block must be 0 (off) or positive, got {self.block}")

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        block = config.layout_block if self.block is None else self.block
        if block <= 1:
            return mod
        int16 = config.full_range_int8 == "int16"
        new_mod, changed = map_functions(
            mod, lambda f: plan_function(f, block, self.depthwise, self.stem, self.half_blocks, int16))
        return retype(new_mod, changed)


__all__ = ["PLAIN", "PlanLayouts", "blocked_layout", "plan_function"]
