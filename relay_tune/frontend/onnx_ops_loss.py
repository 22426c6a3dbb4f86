"""ONNX converters for the inference-time losses NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both are compositions of existing Relay operators over static shapes: the class dimension (axis 1) is
read at each target with a one-hot comparison against a constant class ramp, targets equal to
`ignore_index` weigh 0, and `mean` divides by the total weight of the targets not ignored (as the ONNX
definition says; 0 / 0 is NaN when every target is ignored, as in the ONNX reference).
"""

from __future__ import annotations

import numpy as np

from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr


def negative_log_likelihood(imp: Importer, log_prob: Expr, target: Expr, weight: Expr | None,
                            reduction: str, ignore_index: int | None) -> Expr:
    """The NegativeLogLikelihoodLoss of `log_prob (N, C, d...)` at `target (N, d...)`."""
    shape = imp.static_shape(log_prob, "the input")
    classes = shape[1]
    dtype = imp.dtype(log_prob)
    target = imp.cast(target, "int64")
    ramp = np.arange(classes, dtype=np.int64).reshape([1, classes, *[1] * (len(shape) - 2)])
    chosen = imp.call("equal", [imp.call("expand_dims", [target], axis=1), imp.const(ramp, "int64")])  # (N, C, d...)
    picked = imp.call("sum", [imp.call("where", [chosen, log_prob, imp.const(0, dtype)])], axis=[1])
    if weight is not None:
        weighted = imp.call("where", [chosen, imp.reshape(weight, ramp.shape), imp.const(0, dtype)])
        weights = imp.call("sum", [weighted], axis=[1])
    else:
        weights = imp.cast(imp.call("ones_like", [target]), dtype)
    if ignore_index is not None:
        kept = imp.call("not_equal", [target, imp.const(ignore_index, "int64")])
        weights = imp.call("where", [kept, weights, imp.const(0, dtype)])
    loss = imp.call("negative", [imp.call("multiply", [picked, weights])])
    if reduction == "none":
        return loss
    total = imp.call("sum", [loss], axis=None)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return imp.call("divide", [total, imp.call("sum", [weights], axis=None)])
    raise OnnxModelError(f"reduction {reduction!r} (expected none, sum or mean)")


def _ignore_index(node: OnnxNode) -> int | None:
    return int(node.attrs["ignore_index"]) if "ignore_index" in node.attrs else None


@converts("NegativeLogLikelihoodLoss", newest=REVIEWED_OPSET)
def _nll_loss(imp: Importer, node: OnnxNode) -> Expr:
    return negative_log_likelihood(imp, node.required(0), node.required(1), node.input(2),
                                   node.attr_str("reduction", "mean"), _ignore_index(node))


@converts("SoftmaxCrossEntropyLoss", newest=REVIEWED_OPSET)
def _softmax_cross_entropy(imp: Importer, node: OnnxNode) -> list[Expr]:
    scores = node.required(0)
    if imp.rank(scores) < 2:
        raise OnnxModelError("scores must have shape (N, C) or (N, C, d1, ...)")
    log_prob = imp.call("nn.log_softmax", [scores], axis=1)
    loss = negative_log_likelihood(imp, log_prob, node.required(1), node.input(2),
                                   node.attr_str("reduction", "mean"), _ignore_index(node))
    return [loss, log_prob]
