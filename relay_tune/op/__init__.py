"""Operator registry and the operator families.

The family modules register their operators into the registry on import; importing them here (before anything
can reach `relay_tune.op.registry`, whose package this is) makes the registry complete on first use.
"""

from relay_tune.op import (  # noqa: F401  (they register their operators)
    bf16,
    elemwise,
    image,
    indexing,
    low_precision,
    nn,
    quantized,
    recurrent,
    reduce,
    signal,
    transform,
    winograd,
)
from relay_tune.op.registry import OpDef, OpPattern, all_ops, get_op, has_op

__all__ = ["OpDef", "OpPattern", "all_ops", "get_op", "has_op"]
