"""SimplifyInference: rewrite training-only operators into their inference-time arithmetic.

- `nn.batch_norm(x, gamma, beta, mean, var).0` becomes `x * scale + shift` with
  `scale = gamma / sqrt(var + eps)` (just `1 / sqrt(var + eps)` when `scale=False`) and
  `shift = beta - mean * scale` (`- mean * scale` when `center=False`). The per-channel vectors are broadcast along
  `axis` with `expand_dims`, so FoldConstant can turn them into `(C, 1, 1)` constants and FoldScaleAxis can push the
  multiply into a preceding convolution's weights.
- `nn.dropout(x).0` (and a tensor-typed `nn.dropout(x)`) becomes `x`: dropout is the identity at inference.

Layer norm, softmax and the other normalisations are left alone. Only the normalised output (`.0`) of batch_norm
is rewritten; a program that reads the batch statistics (`.1`/`.2`) keeps those calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, TupleGetItem, op
from relay_tune.ir.attrs import Attrs
from relay_tune.passes.base import Pass, PassConfig, map_functions, register_pass, retype, rewrite_dataflow


def _call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, Attrs(attrs) if attrs else Attrs())


def _scalar(value: float, dtype: str) -> Constant:
    return Constant(np.asarray(value, dtype=dtype))


def batch_norm_inference(call: Call, data: Expr, data_type: TensorType) -> Expr:
    """The inference arithmetic of `call` (an `nn.batch_norm`) applied to `data` (its rewritten first argument)."""
    _, gamma, beta, mean, var = call.args
    attrs = call.attrs
    dtype = data_type.dtype
    ndim = data_type.ndim
    axis = int(attrs.get("axis", 1))
    if axis < 0:
        axis += ndim
    eps = float(attrs.get("epsilon", 1e-5))

    std = _call("sqrt", _call("add", var, _scalar(eps, dtype)))
    scale: Expr = _call("divide", gamma, std) if attrs.get("scale", True) else _call("divide", _scalar(1.0, dtype), std)
    shift: Expr = _call("multiply", _call("negative", mean), scale)
    if attrs.get("center", True):
        shift = _call("add", shift, beta)

    # Vectors of length C line up with `axis` once they have one trailing unit dimension per later axis.
    trailing = ndim - axis - 1
    if trailing > 0:
        scale = _call("expand_dims", scale, axis=1, num_newaxis=trailing)
        shift = _call("expand_dims", shift, axis=1, num_newaxis=trailing)
    return _call("add", _call("multiply", data, scale), shift)


@register_pass
@dataclass(frozen=True)
class SimplifyInference(Pass):
    name: ClassVar[str] = "SimplifyInference"
    opt_level: ClassVar[int] = 0
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        new_mod, changed = map_functions(mod, self._simplify_function)
        return retype(new_mod, changed)

    def _simplify_function(self, func: Function) -> Function:
        new = rewrite_dataflow(func, _simplify_node)
        assert isinstance(new, Function)
        return new


def _simplify_node(orig: Expr, new: Expr) -> Expr:
    if isinstance(new, TupleGetItem) and new.index == 0 and isinstance(new.tuple_value, Call):
        assert isinstance(orig, TupleGetItem)
        inner = new.tuple_value
        name = inner.op_name
        if name == "nn.dropout":
            return inner.args[0]
        if name == "nn.batch_norm":
            orig_call = orig.tuple_value
            assert isinstance(orig_call, Call)
            data_type = orig_call.args[0].checked_type
            if isinstance(data_type, TensorType):
                return batch_norm_inference(inner, inner.args[0], data_type)
    if isinstance(new, Call) and new.op_name == "nn.dropout" and isinstance(orig.checked_type, TensorType):
        return new.args[0]
    return new
