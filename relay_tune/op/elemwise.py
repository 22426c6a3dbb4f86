"""Element-wise and broadcasting operators: unary math, binary arithmetic, comparisons, `where`."""

from __future__ import annotations

from relay_tune.op.registry import OpPattern, register_op

E, B = OpPattern.ELEMWISE, OpPattern.BROADCAST

UNARY_OPS = (
    "negative", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs", "copy",
    "zeros_like", "ones_like", "floor", "ceil", "round",
)
for _name in UNARY_OPS:
    register_op(_name, 1, E)

register_op("nn.relu", 1, E)
register_op("nn.leaky_relu", 1, E, {"alpha": 0.25}, "relay.attrs.LeakyReluAttrs")
register_op("clip", 1, E, {"a_min": None, "a_max": None}, "relay.attrs.ClipAttrs", required=("a_min", "a_max"))
register_op("cast", 1, E, {"dtype": ""}, "relay.attrs.CastAttrs", required=("dtype",))

ARITH_OPS = ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum")
COMPARE_OPS = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
for _name in ARITH_OPS + COMPARE_OPS:
    register_op(_name, 2, B)

register_op("where", 3, B)
