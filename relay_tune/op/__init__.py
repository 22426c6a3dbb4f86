"""Operator registry and the operator families."""

from relay_tune.op.registry import OpDef, OpPattern, all_ops, get_op, has_op

__all__ = ["OpDef", "OpPattern", "all_ops", "get_op", "has_op"]
