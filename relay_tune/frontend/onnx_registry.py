"""The ONNX converter table: each operator type's converter (`CONVERTERS`) and the newest operator version
(`since_version`) that converter handles (`NEWEST_VERSION`), filled by the `converts` decorator in every converter
module (`relay_tune.frontend.onnx`, `onnx_image`, `onnx_ops_math`, `onnx_ops_index`, `onnx_ops_loss`,
`onnx_ops_attention`, `onnx_ops_transformer`, `onnx_ops_quant`, `onnx_ops_recurrent`, `onnx_control_flow`).
Operators of other domains than the default one are keyed `DOMAIN.OpType` (`com.microsoft.QLinearAdd`,
`ai.onnx.preview.FlexAttention`; see `converter_key`). The importer (`relay_tune.frontend.onnx`) imports every
converter module, so the table is complete once it is imported."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx

from relay_tune.frontend.onnx_importer import Importer, OnnxNode
from relay_tune.ir.expr import Expr

MIN_OPSET = 6
MAX_OPSET = onnx.defs.onnx_opset_version()
# The opset whose operator definitions every converter handles unless it says otherwise.
BASE_OPSET = 21
# The newest opset whose operator definitions have been compared with the converters (`newest=` of `converts`).
REVIEWED_OPSET = 28

Converter = Callable[[Importer, OnnxNode], "Expr | Sequence[Expr]"]
CONVERTERS: dict[str, Converter] = {}
# Operator type -> the newest operator version (`since_version`) its converter handles.
NEWEST_VERSION: dict[str, int] = {}

# Operators whose definitions after opset 21 only add element types (bfloat16 at 22, 4-bit floats at 23,
# float8e8m0 at 24, 2-bit integers at 25, ...) that `relay_dtype` rejects by itself, or attributes that
# only apply to such types (Cast's `round_mode`, float8 only): their converters handle the newest version.
TYPE_ONLY_REVISIONS = frozenset({
    "AveragePool", "Cast", "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Dropout", "Elu", "Flatten",
    "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid", "Identity", "InstanceNormalization", "MaxPool", "Pad",
    "Reshape", "Round", "Selu", "Shape", "Size", "Softplus", "Softsign", "Squeeze", "Transpose", "Unsqueeze",
})


def converts(*op_types: str, newest: int = BASE_OPSET) -> Callable[[Converter], Converter]:
    """Registers a converter for `op_types`, handling their definitions up to operator version `newest`.
    An operator type has one converter: registering a second is an error."""

    def register(fn: Converter) -> Converter:
        for name in op_types:
            if name in CONVERTERS and CONVERTERS[name] is not fn:
                raise ValueError(f"two ONNX converters for {name}: {CONVERTERS[name].__module__} and {fn.__module__}")
            CONVERTERS[name] = fn
            NEWEST_VERSION[name] = newest
        return fn

    return register


DEFAULT_DOMAINS = ("", "ai.onnx")


def converter_key(domain: str, op_type: str) -> str:
    """The key of a node's converter in `CONVERTERS`: the operator type in the default domain, else
    `DOMAIN.OpType`."""
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}.{op_type}"


def newest_version(op_type: str) -> int:
    """The newest operator version of `op_type` its converter handles."""
    if op_type in TYPE_ONLY_REVISIONS:
        return REVIEWED_OPSET
    return NEWEST_VERSION.get(op_type, BASE_OPSET)
