"""Shape and data-movement (injective) operators."""

from __future__ import annotations

from relay_tune.op.registry import OpPattern, register_op

I = OpPattern.INJECTIVE  # noqa: E741

register_op("reshape", 1, I, {"newshape": None, "allowzero": 0}, "relay.attrs.ReshapeAttrs", required=("newshape",))
register_op("transpose", 1, I, {"axes": None}, "relay.attrs.TransposeAttrs")
register_op("expand_dims", 1, OpPattern.BROADCAST, {"axis": None, "num_newaxis": 1}, "relay.attrs.ExpandDimsAttrs", required=("axis",))
register_op("squeeze", 1, I, {"axis": None}, "relay.attrs.SqueezeAttrs")
register_op("concatenate", 1, I, {"axis": 0}, "relay.attrs.ConcatenateAttrs")
register_op("stack", 1, I, {"axis": 0}, "relay.attrs.StackAttrs")
register_op(
    "split", 1, I, {"indices_or_sections": None, "axis": 0}, "relay.attrs.SplitAttrs",
    required=("indices_or_sections",),
)
register_op(
    "strided_slice", 1, I,
    {"begin": None, "end": None, "strides": None, "axes": None, "slice_mode": "end"},
    "relay.attrs.StridedSliceAttrs", required=("begin", "end"),
)
register_op("take", 2, I, {"axis": None, "batch_dims": 0, "mode": "clip"}, "relay.attrs.TakeAttrs")
register_op("nn.batch_flatten", 1, I)
register_op(
    "nn.pad", 2, I, {"pad_width": None, "pad_mode": "constant"}, "relay.attrs.PadAttrs", required=("pad_width",)
)
register_op(
    "layout_transform", 1, I, {"src_layout": "", "dst_layout": ""}, "relay.attrs.LayoutTransformAttrs",
    required=("src_layout", "dst_layout"),
)
register_op(
    "nn.upsampling", 1, I,
    {"scale_h": 1.0, "scale_w": 1.0, "layout": "NCHW", "method": "nearest_neighbor", "align_corners": False},
    "relay.attrs.UpSamplingAttrs",
)
