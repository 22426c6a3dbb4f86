"""Fused primitive functions as tensor expressions.

`primitive_compute(func)` turns a fused `Primitive=1` function (its body a DAG of operator calls over its
parameters, with tuples and projections) into tensor expressions:

- one placeholder per tensor parameter, named `p0, p1, ...` in parameter order (a tuple-typed parameter
  is flattened into one placeholder per field, `p1.0, p1.1, ...`);
- for every call, the tensors its operator's `@compute` returns, built over the tensors of its
  arguments (a tuple argument, e.g. of `concatenate`, is passed as its fields);
- the outputs: the body's tensor, or the flattened fields of a tuple body.

Each operator writes its result as its own tensor (stage); the default schedule then inlines the
element-wise and injective stages into their consumers, so a fused group has no intermediate buffers,
while a tuner remains free to place them elsewhere. Stage names are derived deterministically from the
operator names in evaluation order, so recorded schedule steps replay on a fresh compute of the same
workload.

Operator computes have the signature

    compute(inputs: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor | tuple[te.Tensor, ...]

and are declared next to each operator with `@compute("name")`. The helpers those computes are written with
(broadcast reads, element-wise maps, layout index maps, named index functions, the tags below) live in
`relay_tune.kernel.compute_blocks`, below the operator layer, and are re-exported here.

Tags: every tensor an operator compute returns carries a `tag` saying what it is, which the default
schedules read: `elemwise`, `broadcast`, `injective` (cheap, inlined into readers), `pad` (a padded
input), `pack` (an operand re-laid out ahead of a product), and for the complex operators their family:
`dense`, `batch_matmul`, `conv2d_nchw`, `conv2d_nchw_cl` (NCHW sums kept channel-innermost), `conv2d_nhwc`,
`depthwise_conv2d_nchw`, `conv` (other layouts,
ranks and groupings), `conv_transpose`, `pool`, `global_pool`, `reduce`, `softmax`, `norm`, `winograd_input`,
`winograd_output`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relay_tune.errors import CompileError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.expr import Call, Constant, Function, Op, Tuple, TupleGetItem, Var
from relay_tune.ir.traversal import post_order
from relay_tune.ir.types import TensorType, TupleType, Type
from relay_tune.kernel import te
from relay_tune.kernel.compute_blocks import (
    BROADCAST,
    ELEMWISE,
    FAMILY_TAGS,
    INJECTIVE,
    INLINABLE_TAGS,
    LayoutMap,
    accumulate_dtype,
    axis_names,
    broadcast_read,
    const_expr,
    elementwise,
    is_float,
    named,
    scalar_constant,
    static_shape,
    tensor_type,
)
from relay_tune.op.registry import OpPattern, get_op

# ------------------------------------------------------------------------------------------------
# Fused function -> tensor expressions
# ------------------------------------------------------------------------------------------------

ComputeValue = te.Tensor | tuple  # a tensor, or a (nested) tuple of them


@dataclass(frozen=True)
class OpStage:
    """The tensors one operator call produced (its own stages, including internal ones such as a pad)."""

    op_name: str
    attrs: Attrs
    pattern: OpPattern
    tensors: tuple[te.Tensor, ...]
    result: tuple[te.Tensor, ...]  # the call's value (flattened), a subset of `tensors`


@dataclass(frozen=True)
class PrimitiveCompute:
    """A fused function as tensor expressions.

    inputs: one placeholder per (flattened) parameter, in order; kernel arguments follow this order.
    outputs: the (flattened) results.
    calls: per operator call in evaluation order, the stages it created.
    anchor: index into `calls` of the call that decides the schedule (the complex operator; the call with
        the highest pattern kind, the first such one on ties, as in task extraction), or None for a
        function without calls.
    """

    inputs: tuple[te.Tensor, ...]
    outputs: tuple[te.Tensor, ...]
    calls: tuple[OpStage, ...]
    anchor: int | None
    input_types: tuple[TensorType, ...] = field(default=())
    output_types: tuple[TensorType, ...] = field(default=())

    @property
    def anchor_call(self) -> OpStage | None:
        return None if self.anchor is None else self.calls[self.anchor]

    @property
    def anchor_op(self) -> str:
        call = self.anchor_call
        return call.op_name if call is not None else ""

    def op_of(self, tensor: te.Tensor) -> OpStage | None:
        for call in self.calls:
            if any(t is tensor for t in call.tensors):
                return call
        return None


def _flatten_type(ty: Type, what: str) -> list[TensorType]:
    out: list[TensorType] = []
    stack: list[Type] = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(reversed(t.fields))
        elif isinstance(t, TensorType):
            out.append(t)
        else:
            raise UnsupportedError(f"a kernel {what} must be a tensor or a tuple of tensors, got {t}")
    return out


def _flatten_value(value: ComputeValue) -> list[te.Tensor]:
    out: list[te.Tensor] = []
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out


def _param_type(param: Var) -> Type:
    if param.has_type():
        return param.checked_type
    if param.type_annotation is not None:
        return param.type_annotation
    raise CompileError(f"parameter %{param.name_hint} has no type; run type inference before building kernels")


def _structure(ty: Type, tensors: list[te.Tensor]) -> ComputeValue:
    """Rebuild the tuple structure of `ty` from flattened tensors (consumed from the front)."""
    if isinstance(ty, TupleType):
        return tuple(_structure(f, tensors) for f in ty.fields)
    return tensors.pop(0)


def _short_name(op_name: str) -> str:
    return op_name.removeprefix("nn.").removeprefix("contrib_").replace(".", "_")


def primitive_compute(func: Function) -> PrimitiveCompute:
    """Tensor expressions of a fused primitive function (see the module docstring). The function must be
    type-checked (`checked_type` set on its nodes)."""
    inputs: list[te.Tensor] = []
    input_types: list[TensorType] = []
    values: dict[int, ComputeValue] = {}
    for i, param in enumerate(func.params):
        ptype = _param_type(param)
        fields = _flatten_type(ptype, "parameter")
        tensors: list[te.Tensor] = []
        for j, fty in enumerate(fields):
            name = f"p{i}" if isinstance(ptype, TensorType) else f"p{i}.{j}"
            tensors.append(te.placeholder(static_shape(fty, f"parameter %{param.name_hint}"), fty.dtype, name))
            input_types.append(fty)
        inputs.extend(tensors)
        values[id(param)] = _structure(ptype, list(tensors))

    calls: list[OpStage] = []
    used_names: dict[str, int] = {}
    nodes = post_order(func.body)
    for node in nodes:
        if id(node) in values:
            continue
        if isinstance(node, Var):
            raise CompileError(f"variable %{node.name_hint} is not a parameter of the primitive function")
        if isinstance(node, Op):
            continue
        if isinstance(node, Constant):
            if node.data.ndim != 0:
                raise UnsupportedError(
                    f"a primitive function may only hold scalar constants (tensor constants are parameters after "
                    f"fusion); found one of shape {node.data.shape}"
                )
            values[id(node)] = scalar_constant(node.data.item(), str(node.data.dtype), "const")
        elif isinstance(node, Tuple):
            values[id(node)] = tuple(values[id(f)] for f in node.fields)
        elif isinstance(node, TupleGetItem):
            tup = values[id(node.tuple_value)]
            if not isinstance(tup, tuple):
                raise CompileError("projection of a value that is not a tuple")
            values[id(node)] = tup[node.index]
        elif isinstance(node, Call) and isinstance(node.op, Op):
            values[id(node)] = _compute_call(node, values, calls, used_names)
        else:
            raise UnsupportedError(f"a primitive function may not contain a {type(node).__name__}")

    body_type = func.body.checked_type if func.body.has_type() else func.ret_type
    if body_type is None:
        raise CompileError("the primitive function has no type; run type inference before building kernels")
    output_types = _flatten_type(body_type, "result")
    outputs = _flatten_value(values[id(func.body)])
    outputs = _distinct_outputs(outputs)
    anchor = _choose_anchor(calls)
    return PrimitiveCompute(tuple(inputs), tuple(outputs), tuple(calls), anchor, tuple(input_types),
                            tuple(output_types))


def _compute_call(call: Call, values: dict[int, ComputeValue], calls: list[OpStage],
                  used_names: dict[str, int]) -> ComputeValue:
    assert isinstance(call.op, Op)
    opdef = get_op(call.op.name)
    if opdef.compute is None:
        # Only operators with a hand-written CPU loop kernel (`relay_tune.kernel.recurrent.FIXED_KERNELS`) lack a
        # compute; the CPU build lowers them before reaching here, so this is another target (NVPTX).
        raise UnsupportedError(f"operator {opdef.name} has no tensor-expression compute: it runs only as a "
                               "hand-written CPU loop kernel, not on this target")
    args: list[te.Tensor] = []
    for a in call.args:
        args.extend(_flatten_value(values[id(a)]))
    if not call.has_type():
        raise CompileError(f"call of {opdef.name} has no type; run type inference before building kernels")
    out_type = call.checked_type
    result = opdef.compute(args, call.attrs, out_type)
    flat = _flatten_value(result)
    expected = _flatten_type(out_type, "result")
    if len(flat) != len(expected):
        raise CompileError(f"compute of {opdef.name} returned {len(flat)} tensors for type {out_type}")
    for t, ty in zip(flat, expected):
        if t.shape != static_shape(ty) or t.dtype != ty.dtype:
            raise CompileError(
                f"compute of {opdef.name} returned {t.shape} {t.dtype} but the call has type {ty} (a bug)"
            )
    own = _new_tensors(flat, args)
    _rename(own, flat, _short_name(opdef.name), used_names)
    calls.append(OpStage(opdef.name, call.attrs, opdef.pattern, tuple(own), tuple(flat)))
    return _structure(out_type, list(flat))


def _new_tensors(results: list[te.Tensor], args: list[te.Tensor]) -> list[te.Tensor]:
    """The tensors a compute created: everything reachable from its results that is not reachable from
    (or equal to) its arguments."""
    known: set[int] = {id(t) for t in te.post_order_tensors(args)} if args else set()
    out: list[te.Tensor] = []
    for t in te.post_order_tensors(results):
        if id(t) not in known and not t.is_placeholder:
            out.append(t)
    return out


def _rename(tensors: list[te.Tensor], results: list[te.Tensor], base: str, used: dict[str, int]) -> None:
    """Give the stages of one call deterministic, unique names: the operator's short name for its result
    (`<name>.0, <name>.1, ...` for several), `<name>.<stage>` for internal stages. Computes name their tensors
    locally (they cannot know what else is in the group), so the names are set here, once, right after the
    compute returned and before any schedule or other tensor refers to them by name."""
    count = used.get(base, 0)
    used[base] = count + 1
    prefix = base if count == 0 else f"{base}_{count}"
    result_ids = [id(t) for t in results]
    taken: set[str] = set()
    for t in tensors:
        if id(t) in result_ids:
            name = prefix if len(results) == 1 else f"{prefix}.{result_ids.index(id(t))}"
        else:
            name, n = f"{prefix}.{t.name}", 0
            while name in taken:
                n += 1
                name = f"{prefix}.{t.name}_{n}"
        taken.add(name)
        object.__setattr__(t, "name", name)


def _distinct_outputs(outputs: list[te.Tensor]) -> list[te.Tensor]:
    """Outputs must be distinct computed tensors: a parameter returned as is, or one tensor returned twice,
    gets a copy stage of its own."""
    seen: set[int] = set()
    result: list[te.Tensor] = []
    for k, t in enumerate(outputs):
        if t.is_placeholder or id(t) in seen:
            src = t
            t = te.compute(src.shape, named(axis_names(src.ndim), lambda *i, s=src: s[i]), f"copy{k}", INJECTIVE)
        seen.add(id(t))
        result.append(t)
    return result


def _choose_anchor(calls: list[OpStage]) -> int | None:
    best: int | None = None
    best_pattern = -1
    for i, call in enumerate(calls):
        pattern = int(call.pattern)
        if pattern > best_pattern:  # the first of the strongest, as task extraction names the anchor
            best, best_pattern = i, pattern
    return best


__all__ = [
    "BROADCAST", "ELEMWISE", "FAMILY_TAGS", "INJECTIVE", "INLINABLE_TAGS", "LayoutMap", "OpStage",
    "PrimitiveCompute", "accumulate_dtype", "axis_names", "broadcast_read", "const_expr", "elementwise", "is_float",
    "named", "primitive_compute", "scalar_constant", "static_shape", "tensor_type",
]
