"""Commutative reductions: sum, mean, max, min, prod and `collapse_sum_like`."""

from __future__ import annotations

from relay_tune.op.registry import OpPattern, register_op

REDUCE_ATTRS = {"axis": None, "keepdims": False, "exclude": False}
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
for _name in REDUCE_OPS:
    register_op(_name, 1, OpPattern.COMM_REDUCE, REDUCE_ATTRS, "relay.attrs.ReduceAttrs")

register_op("collapse_sum_like", 2, OpPattern.COMM_REDUCE)
