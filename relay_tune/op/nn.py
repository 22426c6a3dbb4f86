"""Neural-network operators: convolutions, dense/matmul, pooling, normalisation, softmax."""

from __future__ import annotations

from relay_tune.op.registry import OpPattern, register_op

OUT_EW = OpPattern.OUT_ELEMWISE_FUSABLE

_CONV_COMMON = {
    "padding": (0, 0), "groups": 1, "channels": None, "kernel_size": None, "out_layout": "", "out_dtype": "",
}
register_op(
    "nn.conv2d", 2, OUT_EW,
    {"strides": (1, 1), "dilation": (1, 1), **_CONV_COMMON, "data_layout": "NCHW", "kernel_layout": "OIHW"},
    "relay.attrs.Conv2DAttrs",
)
register_op(
    "nn.contrib_conv2d_NCHWc", 2, OUT_EW,
    {"strides": (1, 1), "dilation": (1, 1), **_CONV_COMMON, "data_layout": "NCHW", "kernel_layout": "OIHW"},
    "relay.attrs.Conv2DAttrs", description="conv2d on channel-blocked layouts (NCHW[x]c data, OIHW[x]i[y]o kernel)",
)
register_op(
    "nn.conv1d", 2, OUT_EW,
    {"strides": (1,), "dilation": (1,), **_CONV_COMMON, "data_layout": "NCW", "kernel_layout": "OIW"},
    "relay.attrs.Conv1DAttrs",
)
register_op("nn.dense", 2, OUT_EW, {"units": None, "out_dtype": ""}, "relay.attrs.DenseAttrs")
register_op(
    "nn.batch_matmul", 2, OUT_EW, {"out_dtype": "", "transpose_a": False, "transpose_b": False},
    "relay.attrs.BatchMatmulAttrs",
)
register_op(
    "nn.batch_norm", 5, OpPattern.OPAQUE, {"axis": 1, "epsilon": 1e-5, "center": True, "scale": True},
    "relay.attrs.BatchNormAttrs", description="inference-mode batch normalisation; returns (out, mean, var)",
)
register_op("nn.bias_add", 2, OpPattern.BROADCAST, {"axis": 1}, "relay.attrs.BiasAddAttrs")
register_op("nn.dropout", 1, OpPattern.OPAQUE, {"rate": 0.5}, "relay.attrs.DropoutAttrs")
register_op("nn.softmax", 1, OUT_EW, {"axis": -1}, "relay.attrs.SoftmaxAttrs")
register_op("nn.log_softmax", 1, OUT_EW, {"axis": -1}, "relay.attrs.SoftmaxAttrs")

_POOL = {
    "pool_size": None, "strides": (1, 1), "dilation": (1, 1), "padding": (0, 0),
    "layout": "NCHW", "out_layout": "", "ceil_mode": False,
}
register_op("nn.max_pool2d", 1, OUT_EW, _POOL, "relay.attrs.MaxPool2DAttrs", required=("pool_size",))
register_op(
    "nn.avg_pool2d", 1, OUT_EW, {**_POOL, "count_include_pad": False}, "relay.attrs.AvgPool2DAttrs",
    required=("pool_size",),
)
register_op("nn.global_avg_pool2d", 1, OUT_EW, {"layout": "NCHW", "out_layout": ""}, "relay.attrs.GlobalPool2DAttrs")
register_op("nn.global_max_pool2d", 1, OUT_EW, {"layout": "NCHW", "out_layout": ""}, "relay.attrs.GlobalPool2DAttrs")
