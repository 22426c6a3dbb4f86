"""Task extraction: one tuning task per distinct fused primitive function of a fused module.

Two primitive functions are the same workload when they compute the same thing on the same input/output types,
whatever their parameter names and constant values: the `key` is the SHA-1 of a canonical text of the function in
which parameters are renamed `p0, p1, ...` in order, every non-scalar constant is replaced by its type and scalar
constants keep their value (they are compiled into the kernel). Attributes are written with every key sorted, so
the key is stable across runs, processes and machines.

`flops` counts one execution of the function: 2 x multiply-accumulates for convolutions, dense/matmul and batch
matmul, plus one per output element for every other operator call. `occurrences` is how many times the model calls
a function with that key, and `call_sites` are those calls.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from relay_tune.errors import UnsupportedError
from relay_tune.ir import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    IRModule,
    Op,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
)
from relay_tune.op.registry import OpPattern, get_op, has_op
from relay_tune.passes.base import dataflow_post_order

KEY_VERSION = "relay-tune-task-v1"

CONV_OPS = frozenset({"nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.contrib_conv2d_NCHWc", "nn.conv2d_transpose"})
MATMUL_OPS = frozenset({"nn.dense", "nn.matmul", "nn.batch_matmul"})


@dataclass(frozen=True)
class TaskSpec:
    """One tuning task: a distinct fused primitive function and where the model uses it."""

    key: str
    func: Function
    description: str
    anchor_op: str
    occurrences: int
    flops: int
    call_sites: tuple[Call, ...]
    input_types: tuple[Type, ...]
    output_type: Type

    @property
    def total_flops(self) -> int:
        """Work of this task in one inference of the whole model."""
        return self.flops * self.occurrences


def constant_inputs(spec: TaskSpec) -> tuple[int, ...]:
    """Parameters of a task's function that are model constants at every call site (weights)."""
    sites = list(spec.call_sites)
    if not sites:
        return ()
    return tuple(i for i in range(len(spec.func.params))
                 if all(i < len(site.args) and isinstance(site.args[i], Constant) for site in sites))


# ---------------------------------------------------------------------------------------------------------------------
# Canonical text and key
# ---------------------------------------------------------------------------------------------------------------------


def _type_text(ty: Type | None) -> str:
    return "?" if ty is None else str(ty)


def _attr_text(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    return f"{type(value).__name__}:{value!r}"


def canonical_text(func: Function) -> str:
    """A text of `func` that ignores parameter names and tensor constant values (see the module docstring)."""
    names: dict[int, str] = {}
    for i, param in enumerate(func.params):
        names[id(param)] = f"p{i}"
    lines = [
        "fn(" + ", ".join(f"p{i}: {_type_text(_param_type(p))}" for i, p in enumerate(func.params)) + ")"
        f" -> {_type_text(func.body.checked_type if func.body.has_type() else func.ret_type)}"
    ]
    counter = 0
    for node in dataflow_post_order(func.body):
        if id(node) in names:
            continue
        if isinstance(node, Var):
            names[id(node)] = f"free:{_type_text(_param_type(node))}"
            continue
        if isinstance(node, (Op, GlobalVar)):
            names[id(node)] = node.name if isinstance(node, Op) else "@" + node.name
            continue
        if isinstance(node, Constant):
            if node.data.ndim == 0:
                names[id(node)] = f"{node.data.item()!r}:{node.data.dtype}"
            else:
                names[id(node)] = f"const<{node.tensor_type}>"
            continue
        text: str
        if isinstance(node, Call):
            keyed = get_op(node.op.name).keyed_attrs(node.attrs) if isinstance(node.op, Op) else list(node.attrs)
            attrs = ", ".join(f"{k}={_attr_text(node.attrs[k])}" for k in sorted(keyed))
            args = ", ".join(names[id(a)] for a in node.args)
            text = f"{names[id(node.op)]}({args}; {attrs})"
        elif isinstance(node, Tuple):
            text = "(" + ", ".join(names[id(f)] for f in node.fields) + ",)"
        elif isinstance(node, TupleGetItem):
            text = f"{names[id(node.tuple_value)]}.{node.index}"
        else:
            raise UnsupportedError(f"a primitive function may not contain a {type(node).__name__}")
        ty = node.checked_type if node.has_type() else None
        names[id(node)] = f"%{counter}"
        lines.append(f"%{counter} = {text} : {_type_text(ty)}")
        counter += 1
    lines.append("return " + names[id(func.body)])
    return "\n".join(lines)


def _param_type(param: Var) -> Type | None:
    if param.has_type():
        return param.checked_type
    return param.type_annotation


def workload_key(func: Function) -> str:
    text = KEY_VERSION + "\n" + canonical_text(func)
    return hashlib.sha1(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# Anchor, flops and description
# ---------------------------------------------------------------------------------------------------------------------


def _calls(func: Function) -> list[Call]:
    return [n for n in dataflow_post_order(func.body) if isinstance(n, Call) and isinstance(n.op, Op)]


def anchor_call(func: Function) -> Call | None:
    """The call that decides how the kernel is scheduled: the complex op if any, else the heaviest pattern."""
    calls = _calls(func)
    if not calls:
        return None
    best = calls[-1]
    best_pattern = -1
    for call in calls:
        name = call.op.name  # type: ignore[union-attr]
        pattern = int(get_op(name).pattern) if has_op(name) else int(OpPattern.OPAQUE)
        if pattern > best_pattern:
            best, best_pattern = call, pattern
    return best


def _shape(expr: Expr) -> tuple[int, ...] | None:
    if not expr.has_type():
        return None
    ty = expr.checked_type
    if isinstance(ty, TensorType) and ty.is_static:
        return tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]
    return None


def _elements(ty: Type) -> int:
    if isinstance(ty, TensorType):
        return ty.size if ty.is_static else 0
    if isinstance(ty, TupleType):
        return sum(_elements(f) for f in ty.fields)
    return 0


_LAYOUT_AXIS = re.compile(r"(\d*)([A-Za-z])")


def _output_channels(weight_shape: tuple[int, ...], kernel_layout: str) -> int:
    """Product of the weight dims that index output channels (`O`, and `o` in blocked layouts)."""
    axes = [m.group(2) for m in _LAYOUT_AXIS.finditer(kernel_layout)]
    if len(axes) != len(weight_shape):
        return weight_shape[0]
    return math.prod(d for d, a in zip(weight_shape, axes) if a in ("O", "o")) or 1


def call_flops(call: Call) -> int:
    """Work of one operator call: 2 x MACs for convolutions and matrix products, else its output element count."""
    name = call.op.name if isinstance(call.op, Op) else ""
    out_elements = _elements(call.checked_type) if call.has_type() else 0
    if name in CONV_OPS and len(call.args) >= 2:
        data, weight = _shape(call.args[0]), _shape(call.args[1])
        if data is None or weight is None:
            return out_elements
        if name == "nn.conv2d_transpose":
            # every input element meets every weight of its group's output channels
            in_channels = weight[0]
            return 2 * math.prod(data) * math.prod(weight) // max(in_channels, 1)
        default_layout = {"nn.conv1d": "OIW", "nn.conv3d": "OIDHW"}.get(name, "OIHW")
        kernel_layout = str(call.attrs.get("kernel_layout", default_layout))
        return 2 * out_elements * math.prod(weight) // _output_channels(weight, kernel_layout)
    if name in MATMUL_OPS and len(call.args) >= 2:
        data = _shape(call.args[0])
        if data is None:
            return out_elements
        transpose_a = bool(call.attrs.get("transpose_a", False))
        reduce_dim = data[-2] if transpose_a and len(data) >= 2 else data[-1]
        return 2 * out_elements * reduce_dim
    return out_elements


_SHORT_NAMES = {"nn.bias_add": "bias", "nn.relu": "relu", "nn.batch_flatten": "flatten"}


def _short(call: Call) -> str:
    name = call.op.name  # type: ignore[union-attr]
    if name in ("add", "subtract") and call.has_type():
        # an add of a smaller (broadcast) tensor is a bias; an add of a same-shaped tensor is a residual sum
        out = _shape(call)
        if out is not None and any((_shape(a) or out) != out for a in call.args):
            return "bias"
    return _SHORT_NAMES.get(name, name.removeprefix("nn."))


def _dims(shape: tuple[int, ...] | None) -> str:
    return "x".join(str(d) for d in shape) if shape is not None else "?"


def _pair(value: object) -> str:
    if isinstance(value, tuple) and value and all(v == value[0] for v in value):
        return str(value[0])
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def describe(func: Function) -> str:
    """e.g. `conv2d_nchw+bias+relu 1x64x56x56 * 64x64x3x3 s1 p1` or `dense+bias 1x2048 * 1000x2048`."""
    calls = _calls(func)
    anchor = anchor_call(func)
    if anchor is None:
        return "copy " + " ".join(_dims(_shape(p)) for p in func.params)
    head = _short(anchor)
    if anchor.op_name in CONV_OPS:
        head += "_" + str(anchor.attrs.get("data_layout", "NCHW")).lower()
    ordered: list[str] = []
    for call in calls:  # evaluation order; repeats of one operator in a row are named once
        short = head if call is anchor else _short(call)
        if not ordered or ordered[-1] != short:
            ordered.append(short)
    text = "+".join(ordered)
    if anchor.op_name in CONV_OPS | MATMUL_OPS and len(anchor.args) >= 2:
        text += f" {_dims(_shape(anchor.args[0]))} * {_dims(_shape(anchor.args[1]))}"
        if anchor.op_name in CONV_OPS:
            text += f" s{_pair(anchor.attrs.get('strides', 1))} p{_pair(anchor.attrs.get('padding', 0))}"
            groups = anchor.attrs.get("groups", 1)
            if groups != 1:
                text += f" g{groups}"
            dilation = anchor.attrs.get("dilation", (1, 1))
            if isinstance(dilation, tuple) and any(d != 1 for d in dilation):
                text += f" d{_pair(dilation)}"
    else:
        text += " " + " ".join(_dims(_shape(a)) for a in anchor.args if _shape(a))  # scalars (pad values) omitted
    return text


# ---------------------------------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------------------------------


def primitive_calls(mod: IRModule) -> list[Call]:
    """Calls of `Primitive=1` function literals in every global function, in evaluation order."""
    calls: list[Call] = []
    for func in mod.values():
        if func.is_primitive:
            continue
        for node in dataflow_post_order(func):
            if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
                calls.append(node)
    return calls


def extract_tasks(fused_mod: IRModule) -> list[TaskSpec]:
    """One `TaskSpec` per distinct primitive function of a fused module (see `relay_tune.passes.optimize`),
    in order of first use."""
    by_key: dict[str, list[Call]] = {}
    first: dict[str, Function] = {}
    for call in primitive_calls(fused_mod):
        func = call.op
        assert isinstance(func, Function)
        key = workload_key(func)
        by_key.setdefault(key, []).append(call)
        first.setdefault(key, func)
    tasks: list[TaskSpec] = []
    for key, sites in by_key.items():
        func = first[key]
        anchor = anchor_call(func)
        tasks.append(
            TaskSpec(
                key=key,
                func=func,
                description=describe(func),
                anchor_op=anchor.op.name if anchor is not None and isinstance(anchor.op, Op) else "",
                occurrences=len(sites),
                flops=sum(call_flops(c) for c in _calls(func)),
                call_sites=tuple(sites),
                input_types=tuple(_param_type(p) or TupleType(()) for p in func.params),
                output_type=func.body.checked_type if func.body.has_type() else (func.ret_type or TupleType(())),
            )
        )
    return tasks


def format_task_table(tasks: list[TaskSpec]) -> str:
    """A plain-text table of tasks (one line each): count, MFLOPs, description, key prefix."""
    lines = [f"{'count':>5}  {'MFLOPs':>10}  {'key':12}  workload"]
    for task in tasks:
        lines.append(f"{task.occurrences:>5}  {task.flops / 1e6:>10.2f}  {task.key[:12]}  {task.description}")
    return "\n".join(lines)
