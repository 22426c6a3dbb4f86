"""PlanLayouts: choose, for the whole graph, which 4-D activations are stored channel-blocked (`NCHW{b}c`).

A convolution whose input and output channels are multiples of the block `b` (the target's float32 vector lanes)
runs on blocked data: `b` consecutive channels of one pixel sit in one vector register, so its inner loop is a
vector FMA over output channels with unit-stride loads. Blocking one convolution at a time would pay two layout
transforms per convolution; this pass decides layouts for the graph, so that a chain of convolutions and the
element-wise ops, pooling and concatenations between them stay blocked, and a `layout_transform` appears only where
a value's layout really changes (the graph's inputs, the convolution chain's ends, an operator that needs NCHW).

The plan is one forward walk in data-flow order (as TVM's ConvertLayout): every rewritten value is either in its
original layout or in `NCHW{b}c`, and each consumer asks for its inputs in the layout it wants. A value asked for in
a layout it does not have gets one `layout_transform`, shared by every consumer that asks for the same (so no value
is transformed twice into one layout, and a transform of a transform back to where it started cancels instead of
appearing as a pair A->B->A).

- `nn.conv2d` (NCHW data, OIHW kernel, groups 1, float32, input and output channels multiples of `b`) becomes
  `nn.contrib_conv2d_NCHWc` on `NCHW{b}c` data with an `OIHW{b}i{b}o` kernel and `NCHW{b}c` output. Its weight is
  wrapped in `layout_transform(w, "OIHW", "OIHW{b}i{b}o")`: the FoldConstant after this pass packs a constant
  weight once at build time; a weight that is a model input is packed by the model on every run (still correct).
  Depthwise convolutions (groups == channels, a multiple of `b`) become `OIHW1i{b}o` kernels when `depthwise`, and
  only when their input is blocked already: a memory-bound depthwise kernel cannot win back the transform of its
  input (MobileNet v2's 144-channel depthwise convolutions between 24-channel projections stay NCHW).
- A stem, a convolution of fewer input channels than `b` (3 RGB channels) and output channels a multiple of `b`,
  reads its input as one block of all its channels (`NCHW3c`, pixel-major like NHWC, kernel `OIHW3i{b}o`) and
  writes `NCHW{b}c`: the transform of the 3-channel image is smaller than one of the stem's output, and the stem's
  ReLU and pooling run blocked (`stem=False`: the stem stays NCHW and its output is transformed where the first
  blocked consumer needs it).
- Any other convolution whose input or output channels are not multiples of `b` (ShuffleNet's 58, 116..., grouped
  convolutions) stays `nn.conv2d` in NCHW.
- Element-wise ops follow their input. A binary broadcast op (`add`, `multiply`, comparisons...) or `nn.bias_add`
  on axis 1 is blocked when one operand is blocked and every other operand fits the blocked output: a scalar stays
  as it is; a per-channel tensor ((C,), (C, 1, 1), (1, C, 1, 1): all other axes 1) is reshaped to its blocked shape
  (the reshape folds into a new constant, or is an alias at run time); any other 4-D operand with the same channel
  count ((N, C, H, W), the (N, C, 1, 1) scale of a squeeze-excitation block) is transformed to `NCHW{b}c`. An operand
  that fits none of these (a (1, H, W) spatial map) keeps the whole op in NCHW.
- Max/avg pooling and global pooling of a blocked input take `layout="NCHW{b}c"`; `concatenate` on the channel axis
  of inputs whose channel counts are all multiples of `b` (one of them blocked) concatenates along the outer block
  axis of the blocked inputs.
- Every other operator (reshape, flatten, dense, softmax, transpose, slices, reductions, pad, calls of functions),
  tuples and projections get their inputs in the original layout, and the function returns its results in their
  original layouts: callers see the same signature.

Functions with `let` bindings, `if` or nested function literals are left as they are (the walk plans data-flow
graphs; imported and zoo models are graphs). The rewritten function computes the same values as the original
(tests check every planned model against the unplanned one with the reference interpreter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relay_tune.ir import Call, Expr, Function, IRModule, Let, TensorType, Tuple, op
from relay_tune.ir.expr import If
from relay_tune.op.registry import OpPattern, get_op, has_op
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    dataflow_post_order,
    is_opaque_function,
    map_functions,
    register_pass,
    retype,
    tensor_type_of,
)

PLAIN = "NCHW"  # the original layout of every 4-D activation this pass plans
_BINARY_OPS = frozenset({
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
})
_POOL_OPS = frozenset({"nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d"})
_CONV_DTYPE = "float32"


def blocked_layout(block: int) -> str:
    return f"NCHW{block}c"


def _is_unary_elementwise(name: str) -> bool:
    """Element-wise operators of one input (relu, sigmoid, clip, cast...): the output is the input's shape, every
    element depends on the element at the same place, so any layout works."""
    if not has_op(name):
        return False
    definition = get_op(name)
    return definition.pattern == OpPattern.ELEMWISE and definition.num_inputs == 1


def _static_4d(node: Expr) -> TensorType | None:
    ty = tensor_type_of(node)
    return ty if ty is not None and ty.ndim == 4 else None


def _channels(ty: TensorType) -> int:
    return int(ty.shape[1])  # type: ignore[arg-type]  # static: checked by tensor_type_of


class _Planner:
    """The forward walk over one function body (see the module docstring)."""

    def __init__(self, block: int, depthwise: bool, stem: bool) -> None:
        self.block = block
        self.depthwise = depthwise
        self.stem = stem
        self.blocked = blocked_layout(block)
        # id(original node) -> (rewritten node, its layout: PLAIN/"" for the original layout, or self.blocked)
        self.value: dict[int, tuple[Expr, str]] = {}
        # (id(original node), wanted layout) -> the shared transform that delivers it
        self.converted: dict[tuple[int, str], Expr] = {}

    # -- values in a wanted layout -------------------------------------------------------------------------------

    def get(self, node: Expr, want: str = "") -> Expr:
        """The rewritten `node` in layout `want` ("" = its original layout), transformed once if need be."""
        new, layout = self.value[id(node)]
        if layout == want or (want == "" and layout == PLAIN):
            return new
        key = (id(node), want)
        found = self.converted.get(key)
        if found is None:
            if want == "":
                found = _transform(new, self.blocked, PLAIN)
            else:
                assert layout in ("", PLAIN), f"no transform from {layout} to {want} is planned"
                found = _transform(new, PLAIN, want)
            self.converted[key] = found
        return found

    def is_blocked(self, node: Expr) -> bool:
        return self.value[id(node)][1] == self.blocked

    def fits_block(self, ty: TensorType | None) -> bool:
        return ty is not None and ty.ndim == 4 and _channels(ty) % self.block == 0

    # -- the walk ------------------------------------------------------------------------------------------------

    def visit(self, node: Expr) -> None:
        if isinstance(node, Call) and node.op_name is not None:
            planned = self._call(node)
            if planned is not None:
                self.value[id(node)] = planned
                return
        children = () if is_opaque_function(node) else node.children()
        if not children:
            self.value[id(node)] = (node, "")
            return
        new_children = [self.get(c) if id(c) in self.value else c for c in children]
        changed = any(n is not c for n, c in zip(new_children, children))
        self.value[id(node)] = (node.with_children(new_children) if changed else node, "")

    def _call(self, call: Call) -> tuple[Expr, str] | None:
        """A blocked rewrite of `call`, or None to keep it in the original layout (inputs in theirs)."""
        name = call.op_name
        assert name is not None
        if name == "nn.conv2d":
            return self._conv(call)
        if name in _POOL_OPS:
            return self._pool(call)
        if name == "concatenate":
            return self._concatenate(call)
        if name in _BINARY_OPS or name == "nn.bias_add":
            return self._broadcast(call)
        if _is_unary_elementwise(name) and len(call.args) == 1 and self.is_blocked(call.args[0]):
            return Call(call.op, (self.get(call.args[0], self.blocked),), call.attrs, call.span), self.blocked
        return None

    def _conv(self, call: Call) -> tuple[Expr, str] | None:
        attrs = call.attrs
        if attrs.get("data_layout", "NCHW") != "NCHW" or attrs.get("kernel_layout", "OIHW") != "OIHW":
            return None
        if attrs.get("out_layout") not in ("", "NCHW", None):
            return None
        if attrs.get("out_dtype") not in ("", None, _CONV_DTYPE):
            return None
        data, weight, out = _static_4d(call.args[0]), _static_4d(call.args[1]), _static_4d(call)
        if data is None or weight is None or out is None:
            return None
        if not (data.dtype == weight.dtype == out.dtype == _CONV_DTYPE):
            return None
        b = self.block
        c_in, c_out, groups = _channels(data), _channels(out), int(attrs.get("groups", 1))  # type: ignore[arg-type]
        data_layout = self.blocked
        if groups == 1 and c_in % b == 0 and c_out % b == 0:
            kernel_layout = f"OIHW{b}i{b}o"
        elif self.stem and groups == 1 and c_in < b and c_out % b == 0:
            # A stem (3 RGB channels): all its input channels form one block (NCHW3c, pixel-major like NHWC), so
            # it writes NCHW{b}c directly; transforming the 3-channel image costs less than the stem's output.
            data_layout, kernel_layout = f"NCHW{c_in}c", f"OIHW{c_in}i{b}o"
        elif (self.depthwise and groups == c_in == c_out and c_in % b == 0 and int(weight.shape[1]) == 1  # type: ignore[arg-type]
              and self.is_blocked(call.args[0])):
            # A depthwise convolution does a few FLOPs per byte: blocking it cannot pay for a transform of its
            # input, so it is blocked only where its input already is (and a blocked chain continues through it).
            kernel_layout = f"OIHW1i{b}o"
        else:
            return None
        x = self.get(call.args[0], data_layout)
        w = _transform(self.get(call.args[1]), "OIHW", kernel_layout)
        new_attrs = attrs.with_updates(data_layout=data_layout, kernel_layout=kernel_layout, out_layout=self.blocked)
        return Call(op("nn.contrib_conv2d_NCHWc"), (x, w), new_attrs, call.span), self.blocked

    def _pool(self, call: Call) -> tuple[Expr, str] | None:
        attrs = call.attrs
        if attrs.get("layout", "NCHW") != "NCHW" or attrs.get("out_layout") not in ("", "NCHW", None):
            return None
        if not self.is_blocked(call.args[0]):
            return None
        updates: dict[str, str] = {"layout": self.blocked}
        if attrs.get("out_layout"):
            updates["out_layout"] = self.blocked
        x = self.get(call.args[0], self.blocked)
        return Call(call.op, (x,), attrs.with_updates(**updates), call.span), self.blocked

    def _concatenate(self, call: Call) -> tuple[Expr, str] | None:
        fields_node = call.args[0]
        out = _static_4d(call)
        if not isinstance(fields_node, Tuple) or out is None:
            return None
        if int(call.attrs.get("axis", 0)) % 4 != 1:  # type: ignore[arg-type]
            return None
        fields = fields_node.fields
        if not all(self.fits_block(tensor_type_of(f)) for f in fields):
            return None
        if not any(self.is_blocked(f) for f in fields):
            return None
        blocked_fields = Tuple(tuple(self.get(f, self.blocked) for f in fields), fields_node.span)
        # Axis 1 of NCHW{b}c is the outer channel-block axis: blocks of whole multiples of b concatenate there.
        return Call(call.op, (blocked_fields,), call.attrs.with_updates(axis=1), call.span), self.blocked

    def _broadcast(self, call: Call) -> tuple[Expr, str] | None:
        out = _static_4d(call)
        if not self.fits_block(out) or not any(self.is_blocked(a) for a in call.args):
            return None
        assert out is not None
        channels = _channels(out)
        if call.op_name == "nn.bias_add":
            axis = int(call.attrs.get("axis", 1))  # type: ignore[arg-type]
            if axis % 4 != 1 or not self.is_blocked(call.args[0]):
                return None
            bias = self._per_channel(call.args[1], channels)
            if bias is None:
                return None
            return _op_call("add", (self.get(call.args[0], self.blocked), bias)), self.blocked
        args: list[Expr] = []
        for arg in call.args:
            fitted = self._operand(arg, channels)
            if fitted is None:
                return None
            args.append(fitted)
        return Call(call.op, tuple(args), call.attrs, call.span), self.blocked

    def _operand(self, arg: Expr, channels: int) -> Expr | None:
        """`arg` rewritten to broadcast against a blocked (N, C/b, H, W, b) result, or None when it cannot."""
        ty = tensor_type_of(arg)
        if ty is None:
            return None
        if self.is_blocked(arg):
            return self.get(arg, self.blocked)
        if all(d == 1 for d in ty.shape):
            return self.get(arg)  # a scalar (or all-ones tensor) broadcasts against any layout
        per_channel = self._per_channel(arg, channels)
        if per_channel is not None:
            return per_channel
        if ty.ndim == 4 and _channels(ty) == channels:
            return self.get(arg, self.blocked)
        return None

    def _per_channel(self, arg: Expr, channels: int) -> Expr | None:
        """A (C,), (C, 1, 1) or (1, C, 1, 1) tensor reshaped to (C/b, 1, 1, b) or (1, C/b, 1, 1, b): channel
        c = outer * b + inner, which is the row-major order of the blocked axes, so a reshape is the transform."""
        ty = tensor_type_of(arg)
        if ty is None or ty.ndim not in (1, 3, 4):
            return None
        axis = {1: 0, 3: 0, 4: 1}[ty.ndim]
        if ty.shape[axis] != channels or any(d != 1 for i, d in enumerate(ty.shape) if i != axis):
            return None
        b = self.block
        shape = [channels // b, 1, 1, b] if ty.ndim in (1, 3) else [1, channels // b, 1, 1, b]
        return _op_call("reshape", (self.get(arg),), newshape=tuple(shape))


def _op_call(name: str, args: tuple[Expr, ...], **attrs: object) -> Call:
    """A call of operator `name` with its attrs completed by their defaults, as the parser builds calls."""
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def _transform(value: Expr, src: str, dst: str) -> Expr:
    """`layout_transform(value, src, dst)`, or what `value` transformed from when it already came from `dst`."""
    if isinstance(value, Call) and value.op_name == "layout_transform":
        if value.attrs.get("src_layout") == dst and value.attrs.get("dst_layout") == src:
            return value.args[0]
    return _op_call("layout_transform", (value,), src_layout=src, dst_layout=dst)


def _plannable(func: Function, block: int) -> bool:
    """True when `func` is a data-flow graph with at least one convolution worth blocking."""
    worth = False
    for node in dataflow_post_order(func.body):
        if isinstance(node, (Let, If)) or (isinstance(node, Function) and not is_opaque_function(node)):
            return False
        if isinstance(node, Call) and node.op_name == "nn.conv2d":
            out = _static_4d(node)
            worth = worth or (out is not None and _channels(out) % block == 0)
    return worth


def plan_function(func: Function, block: int, depthwise: bool = True, stem: bool = True) -> Function:
    """`func` with its activations planned in `NCHW{block}c` where that keeps convolution chains blocked."""
    if not _plannable(func, block):
        return func
    planner = _Planner(block, depthwise, stem)
    for param in func.params:
        planner.value[id(param)] = (param, "")
    for node in dataflow_post_order(func.body):
        if id(node) not in planner.value:
            planner.visit(node)
    body = planner.get(func.body)
    if body is func.body:
        return func
    return Function(func.params, body, func.ret_type, func.attrs, func.type_params, func.span)


@register_pass
@dataclass(frozen=True)
class PlanLayouts(Pass):
    """Plan channel-blocked layouts (module docstring). `block`: the block size (the target's float32 vector
    lanes); None takes `PassConfig.layout_block`; 0 turns the pass off. `depthwise`: block depthwise convolutions
    too. `stem`: stems of fewer input channels than the block write blocked outputs."""

    block: int | None = None
    depthwise: bool = True
    stem: bool = True
    name: ClassVar[str] = "PlanLayouts"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def __post_init__(self) -> None:
        if self.block is not None and self.block < 0:
            raise ValueError(f"PlanLayouts block must be 0 (off) or positive, got {self.block}")

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        block = config.layout_block if self.block is None else self.block
        if block <= 1:
            return mod
        new_mod, changed = map_functions(mod, lambda f: plan_function(f, block, self.depthwise, self.stem))
        return retype(new_mod, changed)


__all__ = ["PLAIN", "PlanLayouts", "blocked_layout", "plan_function"]
