"""Program statistics: operator counts, parameter counts and FLOP estimates of typed programs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, post_order


def _elements(ty: object) -> int:
    if isinstance(ty, TensorType) and ty.is_static:
        return ty.size
    return 0


def call_flops(call: Call) -> int:
    """Floating-point operations of one operator call (a multiply-add counts as two).

    Convolutions and matrix products count 2 * multiply-accumulates; every other operator counts one
    operation per output element, which is the usual convention for reporting model FLOPs.
    """
    name = call.op_name
    out_ty = call.checked_type
    out = _elements(out_ty)
    if name in ("nn.conv2d", "nn.conv1d", "nn.contrib_conv2d_NCHWc"):
        w = call.args[1].checked_type
        assert isinstance(w, TensorType)
        # MACs per output element = weight elements per output channel = I/groups * prod(kernel)
        per_out = w.size // int(w.shape[call.attrs.get("kernel_layout", "OIHW").index("O")]) if w.is_static else 0
        return 2 * out * per_out
    if name in ("nn.dense", "nn.matmul"):
        k = call.args[0].checked_type
        assert isinstance(k, TensorType)
        kdim = k.shape[-1]
        return 2 * out * (kdim if isinstance(kdim, int) else 0)
    if name == "nn.batch_matmul":
        x = call.args[0].checked_type
        assert isinstance(x, TensorType)
        kdim = x.shape[1] if call.attrs.get("transpose_a") else x.shape[2]
        return 2 * out * (kdim if isinstance(kdim, int) else 0)
    if name in ("nn.max_pool2d", "nn.avg_pool2d"):
        ph, pw = call.attrs["pool_size"] if len(call.attrs["pool_size"]) == 2 else call.attrs["pool_size"] * 2
        return out * int(ph) * int(pw)
    if name in ("nn.global_avg_pool2d", "nn.global_max_pool2d", "sum", "mean", "max", "min", "prod"):
        return _elements(call.args[0].checked_type)
    return out


@dataclass(frozen=True)
class ProgramSummary:
    op_counts: dict[str, int]
    num_parameters: int
    parameter_bytes: int
    flops: int
    num_functions: int


def summarize(mod: IRModule) -> ProgramSummary:
    """Statistics of a type-checked module (constants count as parameters)."""
    ops: Counter[str] = Counter()
    flops = 0
    params = 0
    param_bytes = 0
    seen_consts: set[int] = set()
    for func in mod.values():
        for node in post_order(func):
            if isinstance(node, Call) and node.op_name is not None:
                ops[node.op_name] += 1
                flops += call_flops(node)
            elif isinstance(node, Constant) and node.data.ndim > 0 and id(node) not in seen_consts:
                seen_consts.add(id(node))
                params += int(node.data.size)
                param_bytes += int(node.data.nbytes)
    return ProgramSummary(dict(sorted(ops.items())), params, param_bytes, flops, len(mod))


def primitive_functions(expr: Expr) -> list[Function]:
    """Fused primitive functions reachable from `expr`, in post order."""
    return [n for n in post_order(expr) if isinstance(n, Function) and n.is_primitive]
