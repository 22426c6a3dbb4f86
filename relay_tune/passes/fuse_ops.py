"""FuseOps: group operator calls into primitive functions using post-dominator analysis (TVM's graph partitioner).

The algorithm, per function:

1. **Indexed dataflow graph.** Every call, tuple, projection, constant, variable, let and if gets a node in post-DFS
   order. Each node knows its pattern (`OpPattern` of the operator; tuples are TUPLE; projections of tensor tuples
   INJECTIVE; scalar int32/int64/float32/float64/bool constants ELEMWISE; everything else OPAQUE) and, for every
   use, an edge to the consumer labelled with the consumer's pattern. A broadcast consumer whose output shape equals
   the argument's shape labels that edge ELEMWISE: that is what lets `conv2d -> add(residual)` fuse. Values used
   outside plain dataflow (function parameters and bodies, let values and bodies, if conditions and branches,
   callees) are *external*: lets and ifs are fusion barriers. Primitive (and `Compiler`) function literals are left
   untouched; other function literals are fused inside.
2. **Post-dominator tree** in one reverse-topological sweep: a node's immediate post-dominator is the least common
   ancestor of its consumers, and the tree edge records the strongest pattern on the way. External nodes have none.
3. **Groups** (union-find), one per node. At opt level 0 that is the result: each call on its own.
4. **Three phases** over the nodes in post-DFS order, each trying to merge a node's group into the group of its
   immediate post-dominator (never beyond `max_depth` nodes, never into a tuple in phases 0/1):
   - phase 0: an OUT_ELEMWISE_FUSABLE group (conv2d, dense, pooling, softmax...) joins its post-dominator when the
     combined edge pattern is ELEMWISE and every node on every path is at most BROADCAST;
   - phases 0 and 1: an ELEMWISE/BROADCAST node joins a post-dominator reached through at most INJECTIVE edges
     (or a COMM_REDUCE edge), when intermediate nodes are at most INJECTIVE and the sink is element-wise, injective,
     a reduction or a complex-op group (so `exp -> sum` fuses and element-wise chains join a convolution);
   - phase 0: an element-wise/broadcast group without a complex op, read only as the data of a 1x1 unpadded
     stride-1 `nn.contrib_conv2d_NCHWc` (`is_pointwise_blocked_conv_input`), joins that convolution as its
     prologue (a pre-activation scale, shift and ReLU: the `conv2d_nchwc` template computes it a row at a time);
   - phase 1: INJECTIVE and TUPLE nodes join a post-dominator reached through INJECTIVE paths only; and a channel
     shuffle (reshapes and transposes that only permute the channels of an NCHW tensor) joins the padded depthwise
     convolution that reads it, whose template computes it one channel plane at a time;
   - phase 2: injective nodes join an intermediate tuple that was itself fused into an injective consumer
     (`concatenate((reshape(a), reshape(b)))`).
   A call with a one-element result (a scalar computed from data: DynamicQuantizeLinear's scale and zero point) never
   joins a group whose root has more elements: it is computed once in its own kernel, not once per element.
   Reductions never start a merge, so element-wise ops after a reduction are not absorbed.
4b. **Dequantize chains go to their consumers** (`partition_keeping_8bit`, unless
   `PassConfig.dequantize_in_consumers` is off). Where the partition appended a dequantize (`cast(x8, float32)`,
   then multiplies, adds and subtracts by constants) to the group of a complex op that computes `x8`, so that the
   kernel returns the float tensor instead of the 8-bit one, the chain is copied once per consumer and partitioned
   again with the producer's group ending at `x8`: each copy then joins its consumer's kernel (an epilogue input of
   a convolution, an element-wise kernel, a 1x1 blocked convolution's prologue). A chain some copy of which would
   stay a kernel of its own keeps the first grouping.
5. **Rewrite.** Each group becomes `Function((p0, p1, ...), body, Primitive=1)` called at the group's root, the
   parameters allocated in first-use order for each distinct outside value. Non-scalar constants are parameters
   (passed by the caller); scalar constants stay inline. Groups containing only reshape-like calls also carry
   `relay.reshape_only=1`. A group rooted at a tuple is not wrapped (its fields are separate groups), nor is a
   projection of a tuple produced by another group.

Everything is iterative (explicit stacks), so 10,000-node programs are fine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

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
    Var,
)
from relay_tune.ir.traversal import free_vars, substitute
from relay_tune.op.registry import OpPattern, get_op, has_op
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    dataflow_post_order,
    is_opaque_function,
    map_functions,
    register_pass,
    retype,
)

DEFAULT_MAX_DEPTH = 256

ELEMWISE = OpPattern.ELEMWISE
BROADCAST = OpPattern.BROADCAST
INJECTIVE = OpPattern.INJECTIVE
COMM_REDUCE = OpPattern.COMM_REDUCE
OUT_EWISE = OpPattern.OUT_ELEMWISE_FUSABLE
TUPLE = OpPattern.TUPLE
OPAQUE = OpPattern.OPAQUE

# Operators that only reinterpret the shape of their input; a group of nothing else needs no computation at run time.
RESHAPE_LIKE_OPS = frozenset({"reshape", "squeeze", "expand_dims", "nn.batch_flatten"})

_SIMPLE_SCALAR_DTYPES = frozenset({"int32", "int64", "float32", "float64", "bool"})


def is_inline_scalar(node: Expr) -> bool:
    """Scalar constants that fused functions keep as literals (the kinds a kernel can embed)."""
    return isinstance(node, Constant) and node.data.ndim == 0 and str(node.data.dtype) in _SIMPLE_SCALAR_DTYPES


def _one_element(expr: Expr) -> bool:
    """Whether `expr` is a call whose result is one tensor of one element (of static shape)."""
    if not isinstance(expr, Call) or not expr.has_type():
        return False
    ty = expr.checked_type
    return isinstance(ty, TensorType) and all(isinstance(d, int) and d == 1 for d in ty.shape)


def op_pattern(name: str) -> OpPattern:
    return get_op(name).pattern if has_op(name) else OPAQUE


# ---------------------------------------------------------------------------------------------------------------------
# 1. Indexed forward graph
# ---------------------------------------------------------------------------------------------------------------------


class _Node:
    __slots__ = ("expr", "extern_ref", "index", "outputs", "pattern")

    def __init__(self, expr: Expr, index: int) -> None:
        self.expr = expr
        self.index = index
        self.pattern: OpPattern = OPAQUE
        self.extern_ref = False
        self.outputs: list[tuple[_Node, OpPattern]] = []


class IndexedGraph:
    """The dataflow graph of one function body (nested non-primitive function bodies included)."""

    def __init__(self, func: Function) -> None:
        order = [n for n in dataflow_post_order(func) if not isinstance(n, (Op, GlobalVar))]
        self.nodes: list[_Node] = [_Node(expr, i) for i, expr in enumerate(order)]
        self.node_of: dict[int, _Node] = {id(n.expr): n for n in self.nodes}
        for node in self.nodes:
            self._link(node)

    def _use(self, child: Expr, parent: _Node | None, pattern: OpPattern) -> None:
        node = self.node_of.get(id(child))
        if node is None:  # operators and global names take no part in fusion
            return
        if parent is None:
            node.extern_ref = True
        else:
            node.outputs.append((parent, pattern))

    def _link(self, node: _Node) -> None:
        expr = node.expr
        if isinstance(expr, Call):
            pattern = op_pattern(expr.op.name) if isinstance(expr.op, Op) else OPAQUE
            node.pattern = pattern
            if not isinstance(expr.op, Op):
                self._use(expr.op, None, OPAQUE)
            out_type = expr.checked_type if expr.has_type() else None
            for arg in expr.args:
                edge = pattern
                if (
                    edge == BROADCAST
                    and isinstance(out_type, TensorType)
                    and arg.has_type()
                    and isinstance(arg.checked_type, TensorType)
                    and arg.checked_type.shape == out_type.shape
                ):
                    edge = ELEMWISE
                self._use(arg, node, edge)
        elif isinstance(expr, Tuple):
            node.pattern = TUPLE
            for field in expr.fields:
                if field.has_type() and isinstance(field.checked_type, TensorType):
                    self._use(field, node, INJECTIVE)
                else:
                    self._use(field, None, OPAQUE)
        elif isinstance(expr, TupleGetItem):
            tuple_type = expr.tuple_value.checked_type if expr.tuple_value.has_type() else None
            if isinstance(tuple_type, TupleType) and all(isinstance(f, TensorType) for f in tuple_type.fields):
                node.pattern = INJECTIVE
                self._use(expr.tuple_value, node, INJECTIVE)
            else:
                self._use(expr.tuple_value, None, OPAQUE)
        elif isinstance(expr, Constant):
            node.pattern = ELEMWISE if is_inline_scalar(expr) else OPAQUE
        elif isinstance(expr, Function):
            if not is_opaque_function(expr):
                for param in expr.params:
                    self._use(param, None, OPAQUE)
                self._use(expr.body, None, OPAQUE)
        else:
            # Let, If, Var and anything else: opaque, and every child is used from outside plain dataflow.
            for child in expr.children():
                self._use(child, None, OPAQUE)


# ---------------------------------------------------------------------------------------------------------------------
# 2. Post-dominator tree
# ---------------------------------------------------------------------------------------------------------------------


class _DomNode:
    __slots__ = ("depth", "node", "parent", "pattern")

    def __init__(self, node: _Node, parent: _DomNode | None, depth: int, pattern: OpPattern) -> None:
        self.node = node
        self.parent = parent
        self.depth = depth
        self.pattern = pattern


def _lca(lhs: _DomNode | None, rhs: _DomNode | None, pattern: OpPattern) -> tuple[_DomNode | None, OpPattern]:
    while lhs is not rhs:
        if lhs is None or rhs is None:
            return None, pattern
        if lhs.depth < rhs.depth:
            pattern = max(pattern, rhs.pattern)
            rhs = rhs.parent
        elif rhs.depth < lhs.depth:
            pattern = max(pattern, lhs.pattern)
            lhs = lhs.parent
        else:
            pattern = max(pattern, lhs.pattern, rhs.pattern)
            lhs = lhs.parent
            rhs = rhs.parent
    return lhs, pattern


def post_dominator_tree(graph: IndexedGraph) -> list[_DomNode]:
    tree: list[_DomNode | None] = [None] * len(graph.nodes)
    for node in reversed(graph.nodes):
        if node.extern_ref or not node.outputs:
            tree[node.index] = _DomNode(node, None, 1, OPAQUE)
            continue
        pattern = ELEMWISE
        first, edge = node.outputs[0]
        parent = tree[first.index]
        pattern = max(pattern, edge)
        for consumer, edge in node.outputs[1:]:
            parent, pattern = _lca(parent, tree[consumer.index], pattern)
            pattern = max(pattern, edge)
        tree[node.index] = _DomNode(node, parent, parent.depth + 1 if parent else 1, pattern)
    return [t for t in tree if t is not None]


# ---------------------------------------------------------------------------------------------------------------------
# 3-4. Partition
# ---------------------------------------------------------------------------------------------------------------------


class _Group:
    __slots__ = ("anchor", "num_nodes", "parent", "pattern", "root")

    def __init__(self, pattern: OpPattern, root: _Node) -> None:
        self.parent: _Group | None = None
        self.pattern = pattern
        self.root = root
        self.anchor: _Node | None = root if pattern == OUT_EWISE else None
        self.num_nodes = 1

    def find_root(self) -> _Group:
        group = self
        while group.parent is not None:
            group = group.parent
        # path compression
        node = self
        while node.parent is not None and node.parent is not group:
            node.parent, node = group, node.parent
        return group


PathRule = Callable[[OpPattern, bool], bool]
"""Whether a node whose group has pattern `kind` may lie on a fused path (`is_sink`: it is the path's end)."""


class GraphPartitioner:
    """Union-find partition of an `IndexedGraph` (steps 3-4 of the module docstring).

    `detached` holds the ids of dequantize-chain starts (`cast(x8, float32)`) whose 8-bit input must end its own
    group: no node joins a detached start's group as its post-dominator, so the chain is left to its consumers.
    """

    def __init__(self, opt_level: int, max_depth: int, detached: frozenset[int] = frozenset()) -> None:
        self.opt_level = opt_level
        self.max_depth = max_depth
        self.detached = detached
        self.groups: list[_Group] = []

    def partition(self, graph: IndexedGraph) -> list[_Group]:
        self.groups = [_Group(n.pattern, n) for n in graph.nodes]
        if self.opt_level == 0:
            return self.groups
        tree = post_dominator_tree(graph)
        for phase in range(3):
            self._run_phase(graph, tree, phase)
        return self.groups

    # -- path walks (explicit stacks) ---------------------------------------------------------------------------------
    def _check_path(self, src: _Node, sink: _Node, ok: PathRule) -> bool:
        """Every node on every path from `src` (excluded) to `sink` (included) satisfies `ok`."""
        visited: set[int] = set()
        stack = [consumer for consumer, _ in src.outputs]
        while stack:
            node = stack.pop()
            if node.index in visited:
                continue
            visited.add(node.index)
            group = self.groups[node.index].find_root()
            if not ok(group.pattern, node is sink):
                return False
            if node is not sink:
                stack.extend(consumer for consumer, _ in node.outputs)
        return True

    def _commit_fuse(self, src: _Node, sink: _Node) -> None:
        target = self.groups[sink.index]
        visited: set[int] = set()
        stack = [src]
        while stack:
            node = stack.pop()
            if node is sink or node.index in visited:
                continue
            visited.add(node.index)
            self._merge(self.groups[node.index], target)
            stack.extend(consumer for consumer, _ in node.outputs)

    def _count_with_new_child(self, child: _Node, dom_parent: _Node) -> int:
        total = self.groups[dom_parent.index].find_root().num_nodes
        visited: set[int] = set()
        stack = [child]
        while stack:
            node = stack.pop()
            if node is dom_parent or node.index in visited:
                continue
            visited.add(node.index)
            total += self.groups[node.index].num_nodes
            stack.extend(consumer for consumer, _ in node.outputs)
        return total

    @staticmethod
    def _merge(child: _Group, parent: _Group) -> None:
        child = child.find_root()
        parent = parent.find_root()
        if child is parent:
            return
        parent.num_nodes += child.num_nodes
        child.parent = parent
        if child.anchor is not None:
            assert parent.anchor is None, "cannot merge two groups that both hold a complex operator"
            parent.anchor = child.anchor
            parent.pattern = max(child.pattern, parent.pattern)

    # -- the phases ---------------------------------------------------------------------------------------------------
    def _run_phase(self, graph: IndexedGraph, tree: list[_DomNode], phase: int) -> None:
        for node in graph.nodes:
            group = self.groups[node.index]
            dom = tree[node.index]
            if group.pattern == OPAQUE or dom.parent is None:
                continue
            assert not node.extern_ref
            sink = dom.parent.node
            if id(sink.expr) in self.detached:
                # The 8-bit output stays the kernel's result; the dequantize goes to the consumers' kernels.
                continue
            if self._count_with_new_child(node, sink) > self.max_depth:
                continue

            if phase == 2:
                self._phase2(node, sink, group)
                continue

            sink_group = self.groups[sink.index]
            if group.find_root() is sink_group.find_root():
                continue
            if _one_element(node.expr) and not _one_element(sink.expr):
                # A scalar computed from data (DynamicQuantizeLinear's zero point) stays a kernel of its own,
                # computed once, rather than once per element of its consumer.
                continue
            if sink_group.pattern == TUPLE:
                continue
            if group.pattern == OUT_EWISE:
                if phase == 0 and dom.pattern == ELEMWISE and self._check_path(node, sink, _up_to_broadcast):
                    self._commit_fuse(node, sink)
            elif group.pattern <= BROADCAST:
                if (dom.pattern <= INJECTIVE or dom.pattern == COMM_REDUCE) and self._check_path(
                    node, sink, _into_anchor
                ):
                    self._commit_fuse(node, sink)
                elif phase == 0 and group.find_root().anchor is None and sink_group.find_root().anchor is sink \
                        and len(node.outputs) == 1 and is_pointwise_blocked_conv_input(node.expr, sink.expr):
                    # A pre-activation (scale, shift, ReLU) read only by a 1x1 blocked convolution: the
                    # convolution's template computes it one input row at a time, so the activated map is never
                    # written out and read back in full (DenseNet's BN-ReLU-Conv on the growing concatenation).
                    self._commit_fuse(node, sink)
            elif group.pattern in (INJECTIVE, TUPLE):
                if phase == 1 and self._check_path(node, sink, _up_to_injective):
                    self._commit_fuse(node, sink)
                elif phase == 1 and is_channel_shuffle_into_padded_depthwise(node.expr, sink.expr) \
                        and self._check_path(node, sink, _into_anchor):
                    # The depthwise convolution copies its input into a padded buffer anyway: the shuffle
                    # becomes the read index of that copy, and its own kernel and buffer disappear.
                    self._commit_fuse(node, sink)
            # COMM_REDUCE never starts a merge: a reduction ends its group.

    def _phase2(self, node: _Node, sink: _Node, group: _Group) -> None:
        if group.pattern > INJECTIVE:
            return
        sink_group = self.groups[sink.index]
        sink_root = sink_group.find_root()
        if sink_root.pattern == TUPLE:
            return
        if sink_group.pattern == TUPLE and sink_root.pattern <= INJECTIVE:
            if self._check_path(node, sink, _up_to_injective):
                self._commit_fuse(node, sink)


_SHUFFLE_OPS = frozenset({"reshape", "transpose"})
_SHUFFLE_CHECK_LIMIT = 1 << 22  # elements: the check below evaluates the chain on an index array


def _shuffle_chain_input(expr: Expr) -> tuple[Expr, list[Call]] | None:
    """The value a chain of reshapes and transposes ending in `expr` starts from, and the chain (first call first);
    None when `expr` is not such a chain."""
    chain: list[Call] = []
    while isinstance(expr, Call) and expr.op_name in _SHUFFLE_OPS:
        chain.append(expr)
        expr = expr.args[0]
    return (expr, chain[::-1]) if chain else None


def is_channel_shuffle(expr: Expr) -> bool:
    """`expr` is a chain of reshapes and transposes that maps a static 4-D NCHW tensor to a tensor of the same shape
    by permuting its channels only (ShuffleNet's reshape(N, g, C/g, H, W) -> transpose(0, 2, 1, 3, 4) -> reshape):
    checked by running the chain on the tensor's element indices."""
    found = _shuffle_chain_input(expr)
    if found is None:
        return False
    source, chain = found
    if not (source.has_type() and expr.has_type()):
        return False
    src_ty, out_ty = source.checked_type, expr.checked_type
    if not (isinstance(src_ty, TensorType) and isinstance(out_ty, TensorType)) or src_ty.ndim != 4:
        return False
    if not all(isinstance(d, int) for d in src_ty.shape) or tuple(out_ty.shape) != tuple(src_ty.shape):
        return False
    shape = tuple(int(d) for d in src_ty.shape)  # type: ignore[arg-type]
    if np.prod(shape) > _SHUFFLE_CHECK_LIMIT:
        return False
    index = np.arange(int(np.prod(shape))).reshape(shape)
    value = index
    for call in chain:
        ty = call.checked_type if call.has_type() else None
        if not isinstance(ty, TensorType) or not all(isinstance(d, int) for d in ty.shape):
            return False
        if call.op_name == "reshape":
            value = value.reshape(tuple(int(d) for d in ty.shape))  # type: ignore[arg-type]
        else:
            axes = call.attrs.get("axes")
            value = np.transpose(value, None if axes is None else tuple(int(a) for a in axes))  # type: ignore[union-attr]
            if value.shape != tuple(int(d) for d in ty.shape):  # type: ignore[arg-type]
                return False
    # A channel permutation: every output plane (n, c) is one whole input plane of the same image n.
    images, channels, plane = shape[0], shape[1], shape[2] * shape[3]
    starts = value[:, :, :1, :1]
    offsets = np.arange(plane).reshape(1, 1, shape[2], shape[3])
    same_image = np.arange(images)[:, None, None, None] == starts // (plane * channels)
    return bool(np.array_equal(value - starts, np.broadcast_to(offsets, shape)) and np.all(starts % plane == 0)
                and np.all(same_image))


def is_channel_shuffle_into_padded_depthwise(expr: Expr, consumer: Expr) -> bool:
    """`expr` is a channel shuffle (`is_channel_shuffle`) read as the data of `consumer`, a padded NCHW depthwise
    `nn.conv2d`."""
    if not (isinstance(consumer, Call) and consumer.op_name == "nn.conv2d" and consumer.args[0] is expr):
        return False
    attrs = consumer.attrs
    if attrs.get("data_layout", "NCHW") != "NCHW" or not any(int(p) for p in attrs.get("padding", ())):  # type: ignore[union-attr]
        return False
    ty = expr.checked_type if expr.has_type() else None
    out = consumer.checked_type if consumer.has_type() else None
    if not (isinstance(ty, TensorType) and isinstance(out, TensorType) and ty.ndim == 4):
        return False
    groups = int(attrs.get("groups", 1))  # type: ignore[arg-type]
    return groups > 1 and ty.shape[1] == groups == out.shape[1] and is_channel_shuffle(expr)


def is_pointwise_blocked_conv_input(expr: Expr, consumer: Expr) -> bool:
    """`expr` is the data of `consumer`, a float32 `nn.contrib_conv2d_NCHWc` with a 1x1 kernel, unit strides and
    dilation, no padding and one group, on `NCHW{b}c` data: the convolution whose template can take an element-wise
    prologue (`search_space.families.conv2d_nchwc`)."""
    if not (isinstance(consumer, Call) and consumer.op_name == "nn.contrib_conv2d_NCHWc" and consumer.args[0] is expr):
        return False
    attrs = consumer.attrs
    if int(attrs.get("groups", 1)) != 1 or any(int(p) for p in attrs.get("padding", ())):
        return False
    if any(int(s) != 1 for s in (*attrs.get("strides", (1, 1)), *attrs.get("dilation", (1, 1)))):
        return False
    data_ty = expr.checked_type if expr.has_type() else None
    weight_ty = consumer.args[1].checked_type if consumer.args[1].has_type() else None
    if not (isinstance(data_ty, TensorType) and isinstance(weight_ty, TensorType)):
        return False
    return data_ty.ndim == 5 and data_ty.dtype == "float32" and weight_ty.ndim == 6 \
        and tuple(weight_ty.shape[2:4]) == (1, 1)


def _up_to_broadcast(kind: OpPattern, is_sink: bool) -> bool:
    return kind <= BROADCAST


def _up_to_injective(kind: OpPattern, is_sink: bool) -> bool:
    return kind <= INJECTIVE


def _into_anchor(kind: OpPattern, is_sink: bool) -> bool:
    if not is_sink:
        # element-wise, broadcast and injective ops on parallel branches may join the element-wise anchor
        return kind <= INJECTIVE
    return kind <= INJECTIVE or kind in (COMM_REDUCE, OUT_EWISE)


# ---------------------------------------------------------------------------------------------------------------------
# 4b. Dequantize chains go to their consumers
# ---------------------------------------------------------------------------------------------------------------------

_EIGHT_BIT = frozenset({"int8", "uint8"})
_DEQUANTIZE_STEPS = frozenset({"multiply", "add", "subtract"})


@dataclass(frozen=True)
class _DequantizeChain:
    """`cast(source, float) -> (multiply | add | subtract by a constant)*`: `calls` first to last, `operands[i]` the
    argument of `calls[i]` that is the chain's value, `consumers` the distinct calls that read the last call."""

    source: Expr
    calls: tuple[Call, ...]
    operands: tuple[int, ...]
    consumers: tuple[Call, ...]


def _same_tensor_type(a: Expr, b: Expr) -> bool:
    return a.has_type() and b.has_type() and isinstance(a.checked_type, TensorType) \
        and a.checked_type == b.checked_type


def _dequantize_chain(start: _Node) -> _DequantizeChain | None:
    """The dequantize chain that starts at `start` (a cast of an 8-bit call's result to float), followed while each
    value has one consumer that multiplies, adds or subtracts a constant without changing its type; None when
    `start` is no such cast or the chain's result is not read by calls only."""
    expr = start.expr
    if not (isinstance(expr, Call) and expr.op_name == "cast" and len(expr.args) == 1):
        return None
    source = expr.args[0]
    if not (isinstance(source, Call) and isinstance(source.op, Op) and source.has_type() and expr.has_type()):
        return None
    src_ty, out_ty = source.checked_type, expr.checked_type
    if not (isinstance(src_ty, TensorType) and isinstance(out_ty, TensorType)) or src_ty.dtype not in _EIGHT_BIT \
            or not out_ty.dtype.startswith("float") or src_ty.shape != out_ty.shape:
        return None
    calls: list[Call] = [expr]
    operands = [0]
    node = start
    while not node.extern_ref and len(node.outputs) == 1:
        consumer = node.outputs[0][0]
        step = consumer.expr
        if not (isinstance(step, Call) and step.op_name in _DEQUANTIZE_STEPS and len(step.args) == 2
                and _same_tensor_type(step, node.expr)):
            break
        at = [i for i, a in enumerate(step.args) if a is node.expr]
        if len(at) != 1 or not isinstance(step.args[1 - at[0]], Constant):
            break
        calls.append(step)
        operands.append(at[0])
        node = consumer
    if node.extern_ref or not node.outputs:
        return None
    consumers: dict[int, Call] = {}
    for consumer, _ in node.outputs:
        if not isinstance(consumer.expr, Call):
            return None
        consumers.setdefault(id(consumer.expr), consumer.expr)
    return _DequantizeChain(source, tuple(calls), tuple(operands), tuple(consumers.values()))


def _widening_dequantize_chains(graph: IndexedGraph, groups: list[_Group]) -> list[_DequantizeChain]:
    """The dequantize chains that `groups` appended to a producer kernel's epilogue, making that kernel's result the
    chain's float output: the 8-bit source, the whole chain and a complex operator share one group rooted at the
    chain's last call."""
    found: list[_DequantizeChain] = []
    for node in graph.nodes:
        chain = _dequantize_chain(node)
        if chain is None:
            continue
        group = groups[node.index].find_root()
        source = graph.node_of[id(chain.source)]
        last = graph.node_of[id(chain.calls[-1])]
        if group.anchor is not None and group.root is last and groups[source.index].find_root() is group:
            found.append(chain)
    return found


def _split_chains(func: Function, chains: list[_DequantizeChain]) -> tuple[Function, list[list[Expr]]]:
    """`func` with every chain's result read by each of its consumers through a copy of its own (the first consumer
    keeps the original); also, per chain, the starts and the last calls of its copies, in the new function, as
    `[start, last, start, last, ...]`. New and rebuilt nodes keep the types of the nodes they replace."""
    by_consumer: dict[int, list[int]] = {}  # id(consumer) -> indices of the chains it needs a copy of
    for c, chain in enumerate(chains):
        for consumer in chain.consumers[1:]:
            by_consumer.setdefault(id(consumer), []).append(c)
    copies: list[list[Expr]] = [[] for _ in chains]
    mapped: dict[int, Expr] = {}

    def copy_chain(chain: _DequantizeChain) -> tuple[Call, Call]:
        value: Expr = mapped.get(id(chain.source), chain.source)
        first: Call | None = None
        for call, at in zip(chain.calls, chain.operands):
            args = tuple(value if i == at else mapped.get(id(a), a) for i, a in enumerate(call.args))
            new = Call(call.op, args, call.attrs, call.span)
            new.set_checked_type(call.checked_type)
            first = first or new
            value = new
        assert isinstance(value, Call) and first is not None
        return first, value

    for node in dataflow_post_order(func):
        children = () if is_opaque_function(node) else node.children()
        new_children = [mapped.get(id(c), c) for c in children]
        for c in by_consumer.get(id(node), ()):
            chain = chains[c]
            start, last = copy_chain(chain)
            copies[c] += [start, last]
            shared = mapped.get(id(chain.calls[-1]), chain.calls[-1])
            new_children = [last if child is shared else child for child in new_children]
        changed = any(n is not c for n, c in zip(new_children, children))
        updated = node.with_children(new_children) if changed else node
        if updated is not node and node.has_type():
            updated.set_checked_type(node.checked_type)
        mapped[id(node)] = updated
    for c, chain in enumerate(chains):
        copies[c][:0] = [mapped[id(chain.calls[0])], mapped[id(chain.calls[-1])]]
    new_func = mapped[id(func)]
    assert isinstance(new_func, Function)
    return new_func, copies


def partition_keeping_8bit(func: Function, opt_level: int, max_depth: int) -> tuple[Function, IndexedGraph,
                                                                                  list[_Group]]:
    """Partition `func`, then keep 8-bit results 8-bit between kernels: a dequantize chain (`_dequantize_chain`)
    that the plain partition appends to its producer's epilogue, so that the kernel returns the wider float tensor,
    moves to the kernels of its consumers instead, copied once per consumer, when every copy then joins its
    consumer's group (an epilogue input of a convolution or dense kernel, an element-wise kernel, a reduction).
    A chain some copy of which would be a kernel of its own stays where the plain partition put it.

    This is TVM's "a dequantize is fused into its consumer" rule made explicit: the producer's group simply does
    not take the chain's first cast (`GraphPartitioner.detached`), and the element-wise rule of phases 0 and 1 then
    fuses each copy forward. Returns the (possibly rewritten) function, its graph and its groups."""
    graph = IndexedGraph(func)
    groups = GraphPartitioner(opt_level, max_depth).partition(graph)
    chains = _widening_dequantize_chains(graph, groups) if opt_level > 0 else []
    while chains:
        new_func, copies = _split_chains(func, chains)
        new_graph = IndexedGraph(new_func)
        detached = frozenset(id(ends[i]) for ends in copies for i in range(0, len(ends), 2))
        new_groups = GraphPartitioner(opt_level, max_depth, detached).partition(new_graph)
        taken = [
            all(new_groups[new_graph.node_of[id(ends[i])].index].find_root().root.expr is not ends[i]
                for i in range(1, len(ends), 2))
            for ends in copies
        ]
        if all(taken):
            return new_func, new_graph, new_groups
        chains = [chain for chain, ok in zip(chains, taken) if ok]
    return func, graph, groups


# ---------------------------------------------------------------------------------------------------------------------
# 5. Rewrite
# ---------------------------------------------------------------------------------------------------------------------


def _wraps(expr: Expr) -> bool:
    """Nodes that belong to fused groups (the rest are rebuilt in place)."""
    if isinstance(expr, Call):
        return isinstance(expr.op, Op)
    return isinstance(expr, (Tuple, TupleGetItem)) or is_inline_scalar(expr)


class _GroupBuilder:
    """Collects the body of one group and the outside values it reads."""

    __slots__ = ("arguments", "holes")

    def __init__(self) -> None:
        self.holes: dict[int, Var] = {}  # id(outside value) -> placeholder parameter
        self.arguments: dict[int, Expr] = {}

    def param_for(self, value: Expr, ty: object) -> Var:
        hole = self.holes.get(id(value))
        if hole is None:
            hole = Var("hole", ty if ty is not None else None)  # type: ignore[arg-type]
            self.holes[id(value)] = hole
            self.arguments[id(hole)] = value
        return hole


def _make_function(builder: _GroupBuilder, body: Expr, ret_type: object) -> Call:
    """`fn (%p0, ...) { body }` called on the outside values, parameters named in first-use order."""
    holes = [v for v in free_vars(body) if id(v) in builder.arguments]
    params = [Var(f"p{i}", hole.type_annotation) for i, hole in enumerate(holes)]
    body = substitute(body, dict(zip(holes, params)))
    calls = [n for n in dataflow_post_order(body) if isinstance(n, Call)]
    attrs: dict[str, object] = {"Primitive": 1}
    if calls and all(c.op_name in RESHAPE_LIKE_OPS for c in calls):
        attrs["relay.reshape_only"] = 1
    func = Function(tuple(params), body, ret_type, attrs)  # type: ignore[arg-type]
    return Call(func, tuple(builder.arguments[id(h)] for h in holes))


def fuse_function(func: Function, opt_level: int, max_depth: int, dequantize_in_consumers: bool = True) -> Function:
    """`func` with every fused group made a primitive function; `dequantize_in_consumers`: see
    `partition_keeping_8bit` (off: the plain partition)."""
    if dequantize_in_consumers:
        func, graph, groups = partition_keeping_8bit(func, opt_level, max_depth)
    else:
        graph = IndexedGraph(func)
        groups = GraphPartitioner(opt_level, max_depth).partition(graph)
    group_of: dict[int, _Group] = {id(n.expr): groups[n.index].find_root() for n in graph.nodes}
    builders: dict[int, _GroupBuilder] = {}

    outside: dict[int, Expr] = {}  # value of a node as seen by code outside its group
    inside: dict[int, Expr] = {}  # value of a node inside the body of its group

    def operand(arg: Expr, group: _Group) -> Expr:
        """`arg` as used by a member of `group`."""
        if is_inline_scalar(arg):
            return arg
        arg_group = group_of.get(id(arg))
        if arg_group is group and id(arg) in inside:
            return inside[id(arg)]
        # Only the root of a group is visible outside it (it post-dominates the other members).
        assert arg_group is None or arg_group.root.expr is arg or not _wraps(arg), "group member used outside"
        value = outside.get(id(arg), arg)
        builder = builders.setdefault(id(group), _GroupBuilder())
        ty = arg.checked_type if arg.has_type() else None
        return builder.param_for(value, ty)

    for node in dataflow_post_order(func):
        key = id(node)
        if is_opaque_function(node) or isinstance(node, (Op, GlobalVar)):
            outside[key] = node
            continue
        group = group_of.get(key)
        if group is None or not _wraps(node) or is_inline_scalar(node):
            children = node.children()
            new_children = [outside.get(id(c), c) for c in children]
            changed = any(a is not b for a, b in zip(new_children, children))
            outside[key] = node.with_children(new_children) if changed else node
            continue
        if isinstance(node, Tuple) and group.root.expr is node:
            # A tuple that roots its group stays in the caller; its fields are the outputs of their own groups.
            outside[key] = Tuple(tuple(outside.get(id(f), f) for f in node.fields), node.span)
            continue
        projection_root = isinstance(node, TupleGetItem) and group.root.expr is node
        if projection_root and group_of.get(id(node.tuple_value)) is not group:
            # projection of a tuple made by another group (or an opaque multi-output op): nothing to fuse
            assert isinstance(node, TupleGetItem)
            outside[key] = TupleGetItem(outside.get(id(node.tuple_value), node.tuple_value), node.index, node.span)
            continue

        if isinstance(node, Call):
            body: Expr = Call(node.op, tuple(operand(a, group) for a in node.args), node.attrs, node.span)
        elif isinstance(node, Tuple):
            body = Tuple(tuple(operand(f, group) for f in node.fields), node.span)
        else:
            assert isinstance(node, TupleGetItem)
            body = TupleGetItem(operand(node.tuple_value, group), node.index, node.span)
        inside[key] = body
        if group.root.expr is node:
            builder = builders.pop(id(group), None) or _GroupBuilder()
            outside[key] = _make_function(builder, body, node.checked_type if node.has_type() else None)
        else:
            # Members other than the root are only used inside their group (the root post-dominates them).
            outside[key] = body

    new_func = outside[id(func)]
    assert isinstance(new_func, Function)
    return new_func


@register_pass
@dataclass(frozen=True)
class FuseOps(Pass):
    """Operator fusion. `fuse_opt_level`/`max_depth` default to the pipeline's `PassConfig` values."""

    fuse_opt_level: int | None = None
    max_depth: int | None = None

    name: ClassVar[str] = "FuseOps"
    opt_level: ClassVar[int] = 0
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        level = config.opt_level if self.fuse_opt_level is None else self.fuse_opt_level
        depth = config.fuse_max_depth if self.max_depth is None else self.max_depth
        dequantize = config.dequantize_in_consumers
        new_mod, changed = map_functions(mod, lambda f: fuse_function(f, level, depth, dequantize))
        return retype(new_mod, changed)


def fused_groups(mod: IRModule, entry: str = "main") -> list[tuple[str, ...]]:
    """The operator names of every primitive function called in `entry`, in evaluation order (for tests and logs)."""
    result: list[tuple[str, ...]] = []
    for node in dataflow_post_order(mod[entry]):
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            names = tuple(
                c.op_name for c in dataflow_post_order(node.op.body) if isinstance(c, Call) and c.op_name is not None
            )
            result.append(names)
    return result

