"""Pass infrastructure: `Pass`, `PassConfig`, `Sequential`, `InferType` and traversal helpers shared by passes.

A pass is a small frozen dataclass. Its fields are its options (`FuseOps(max_depth=64)`), its class variables say
when it runs (`opt_level`: the lowest optimisation level at which a pipeline includes it) and what it needs first
(`required`: names of passes that must have run, in practice `"InferType"`). Configuration that applies to a whole
pipeline run (the optimisation level, passes to skip, fusion depth...) travels in an explicit `PassConfig` argument,
never in global state, so two pipelines with different settings can run side by side.

Calling order: `Pass.run(mod, config)` first satisfies `required` (type inference runs only when the module is not
typed yet), then calls `transform(mod, config)`, which subclasses implement and which must return a type-correct
module (passes that build new nodes end with `infer_types`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from relay_tune.ir import Constant, Expr, Function, IRModule, TensorType
from relay_tune.ir.expr import Call, op
from relay_tune.op.registry import get_op
from relay_tune.type_infer import infer_types

WINOGRAD_MODES = ("off", "auto", "on", "f2", "f4")
"""Settings of `PassConfig.winograd` (see `relay_tune.passes.winograd`)."""

FULL_RANGE_INT8_MODES = ("float", "dot4", "int16")
"""Settings of `PassConfig.full_range_int8` (see `relay_tune.passes.quantized_products`)."""

PRECISIONS = ("fp32", "bf16")
"""Settings of `PassConfig.precision` (see `relay_tune.passes.bf16`)."""


@dataclass(frozen=True)
class PassConfig:
    """Settings shared by every pass of one pipeline run.

    Attributes:
        opt_level: passes whose `opt_level` exceeds this are skipped by `Sequential`; FuseOps at level 0 puts every
            operator call in its own primitive function.
        disabled_passes: names of passes a `Sequential` skips.
        fuse_max_depth: most nodes in one fused group (TVM's `relay.FuseOps.max_depth`).
        fold_small_result_elements: FoldConstant always folds a call whose result has at most this many elements,
            however small its inputs (see `FoldConstant` for the whole rule).
        layout_block: channel block of the layouts `PlanLayouts` plans (`NCHW{b}c`: the CPU target's float32
            vector lanes); 0 leaves every activation in its original layout.
        winograd: which blocked 3x3 stride-1 convolutions `WinogradConv` rewrites into Winograd form: "off",
            "auto", "on", "f2", "f4" (see `relay_tune.passes.winograd`).
        full_range_int8: how the target multiplies int8 weights whose channel pairs would saturate vpmaddubsw
            (`relay_tune.passes.quantized_products`): "float" (no exact fast path: QuantizedProducts leaves them
            float below opt_level 4, PlanLayouts packs them for four-byte products), "dot4" (exact four-byte
            products: VNNI's vpdpbusd) or "int16" (the weight widened to int16 pairs for vpmaddwd: x86 without
            VNNI); the last two take them at opt_level 3.
        precision: what float32 convolutions and dense products compute in: "fp32", or "bf16" (bfloat16 weights
            and activations, float32 sums: `relay_tune.passes.bf16`).
        dequantize_in_consumers: FuseOps leaves a dequantize (`cast(x8, float32)` times and plus constants) that
            would widen its producer kernel's result to the kernels of its consumers, so 8-bit tensors stay 8-bit
            between kernels (`relay_tune.passes.fuse_ops.partition_keeping_8bit`); False: the plain partition.
    """

    opt_level: int = 2
    disabled_passes: frozenset[str] = frozenset()
    fuse_max_depth: int = 256
    fold_small_result_elements: int = 4096
    layout_block: int = 0
    winograd: str = "off"
    full_range_int8: str = "float"
    precision: str = "fp32"
    dequantize_in_consumers: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "disabled_passes", frozenset(self.disabled_passes))
        if self.fuse_max_depth < 1:
            raise ValueError(f"fuse_max_depth must be at least 1, got {self.fuse_max_depth}")
        if self.layout_block < 0:
            raise ValueError(f"layout_block must be 0 (off) or positive, got {self.layout_block}")
        if self.winograd not in WINOGRAD_MODES:
            raise ValueError(f"winograd must be one of {', '.join(WINOGRAD_MODES)}; got {self.winograd!r}")
        if self.full_range_int8 not in FULL_RANGE_INT8_MODES:
            raise ValueError(f"full_range_int8 must be one of {', '.join(FULL_RANGE_INT8_MODES)}; "
                             f"got {self.full_range_int8!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")


DEFAULT_CONFIG = PassConfig()


class Pass(abc.ABC):
    """A module-to-module transformation.

    Subclasses are frozen dataclasses (their fields are options), set the class variables `name`, `opt_level` and
    `required`, and implement `transform`. Users call `run` (or the pass itself).
    """

    name: ClassVar[str]
    opt_level: ClassVar[int] = 0
    required: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        """The transformation itself; may assume the `required` passes have run."""

    def run(self, mod: IRModule, config: PassConfig | None = None) -> IRModule:
        config = config or DEFAULT_CONFIG
        for name in self.required:
            if name == InferType.name:
                if not is_typed(mod):
                    mod = InferType().run(mod, config)
            else:
                mod = get_pass(name).run(mod, config)
        return self.transform(mod, config)

    def __call__(self, mod: IRModule, config: PassConfig | None = None) -> IRModule:
        return self.run(mod, config)


@dataclass(frozen=True)
class Sequential(Pass):
    """Runs `passes` in order, skipping those above `config.opt_level` or named in `config.disabled_passes`.

    `opt_level` is the level of the sequence itself (when nested in another sequence).
    """

    passes: tuple[Pass, ...]
    opt_level: int = 0  # type: ignore[misc]  # an option here, a class constant on other passes
    name: str = "Sequential"  # type: ignore[misc]

    def __post_init__(self) -> None:
        object.__setattr__(self, "passes", tuple(self.passes))

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        for p in self.passes:
            if p.opt_level > config.opt_level or p.name in config.disabled_passes:
                continue
            mod = p.run(mod, config)
        return mod


@dataclass(frozen=True)
class InferType(Pass):
    """Fills `checked_type` on every node (see `relay_tune.type_infer.infer_types`)."""

    name: ClassVar[str] = "InferType"

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return infer_types(mod)


# ---------------------------------------------------------------------------------------------------------------------
# Registry: pass name -> class, so that `required` and command lines can name passes.
# ---------------------------------------------------------------------------------------------------------------------

_PASSES: dict[str, type[Pass]] = {"InferType": InferType}


def register_pass(cls: type[Pass]) -> type[Pass]:
    if cls.name in _PASSES and _PASSES[cls.name] is not cls:
        raise ValueError(f"pass {cls.name} registered twice")
    _PASSES[cls.name] = cls
    return cls


def get_pass(name: str, **options: Any) -> Pass:
    """A pass by name with its options, e.g. `get_pass("FuseOps", max_depth=8)`. Every pass is registered by then:
    this module is only ever imported through its package, whose `__init__` imports every pass module."""
    try:
        cls = _PASSES[name]
    except KeyError:
        known = ", ".join(sorted(_PASSES))
        raise KeyError(f"unknown pass {name!r} (known: {known})") from None
    return cls(**options)


def registered_passes() -> list[str]:
    return sorted(_PASSES)


# ---------------------------------------------------------------------------------------------------------------------
# Helpers shared by the passes
# ---------------------------------------------------------------------------------------------------------------------


def is_typed(mod: IRModule) -> bool:
    return all(f.has_type() and f.body.has_type() for f in mod.values())


def should_transform(func: Function) -> bool:
    """Global functions a graph pass rewrites: not already lowered (`Primitive`) and not offloaded (`Compiler`)."""
    return not func.is_primitive and "Compiler" not in func.attrs


def is_opaque_function(node: Expr) -> bool:
    """Function literals whose bodies graph passes leave exactly as they are."""
    return isinstance(node, Function) and not should_transform(node)


def dataflow_post_order(root: Expr) -> list[Expr]:
    """Like `relay_tune.ir.post_order`, but primitive/external function literals are leaves (their bodies are
    not visited)."""
    order: list[Expr] = []
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if is_opaque_function(node):
            continue
        for child in reversed(node.children()):
            if id(child) not in seen:
                stack.append((child, False))
    return order


RewriteFn = Callable[[Expr, Expr], Expr]


def rewrite_dataflow(root: Expr, fn: RewriteFn) -> Expr:
    """Bottom-up rebuild (see `relay_tune.ir.rewrite`) that leaves primitive/external function literals alone."""
    mapped: dict[int, Expr] = {}
    for node in dataflow_post_order(root):
        children = () if is_opaque_function(node) else node.children()
        if children:
            new_children = [mapped.get(id(c), c) for c in children]
            changed = any(n is not c for n, c in zip(new_children, children))
            updated = node.with_children(new_children) if changed else node
        else:
            updated = node
        mapped[id(node)] = fn(node, updated)
    return mapped[id(root)]


def map_functions(mod: IRModule, fn: Callable[[Function], Function]) -> tuple[IRModule, bool]:
    """Apply `fn` to every global function that graph passes transform; also says whether anything changed."""
    changed = False
    functions: dict[str, Function] = {}
    for name, func in mod.items():
        new = fn(func) if should_transform(func) else func
        changed = changed or new is not func
        functions[name] = new
    return (IRModule(functions) if changed else mod), changed


def retype(mod: IRModule, changed: bool) -> IRModule:
    """Re-run type inference after a pass built new nodes (and only then)."""
    if not changed:
        return mod
    return infer_types(mod)


def rewrite_functions(mod: IRModule, fn: RewriteFn) -> IRModule:
    """`rewrite_dataflow` with `fn` over every global function graph passes transform, retyped if anything
    changed: the whole `transform` of a pass that rewrites calls one at a time."""

    def rewrite(func: Function) -> Function:
        new = rewrite_dataflow(func, fn)
        assert isinstance(new, Function)
        return new

    return retype(*map_functions(mod, rewrite))


def tensor_type_of(node: Expr) -> TensorType | None:
    """The node's checked type when it is a tensor type with static shape, else None."""
    if not node.has_type():
        return None
    ty = node.checked_type
    if isinstance(ty, TensorType) and ty.is_static:
        return ty
    return None


def float_constant_operand(node: Call) -> tuple[int, Constant] | None:
    """(index of the other operand, the constant) where `node` is a binary call on static floating-point tensors with
    exactly one constant operand of the result's dtype (`x * scale`, `bias + x`); None otherwise."""
    out_type = tensor_type_of(node)
    if len(node.args) != 2 or out_type is None or not np.issubdtype(np.dtype(out_type.dtype), np.floating):
        return None
    lhs, rhs = node.args
    if isinstance(rhs, Constant) and not isinstance(lhs, Constant):
        data_index, constant = 0, rhs
    elif isinstance(lhs, Constant) and not isinstance(rhs, Constant):
        data_index, constant = 1, lhs
    else:
        return None
    return (data_index, constant) if str(constant.data.dtype) == out_type.dtype else None


def call_op_name(node: Expr) -> str | None:
    return node.op_name if isinstance(node, Call) else None


def use_counts(root: Expr) -> dict[int, int]:
    """How many times each node (by identity) is referenced as a child; the root counts one extra use."""
    counts: dict[int, int] = {id(root): 1}
    for node in dataflow_post_order(root):
        if is_opaque_function(node):
            continue
        for child in node.children():
            counts[id(child)] = counts.get(id(child), 0) + 1
    return counts


def call_op(name: str, *args: Expr, **attrs: object) -> Call:
    """A call of operator `name` with its attrs completed by their defaults, as the parser builds calls."""
    return Call(op(name), args, get_op(name).make_attrs(attrs))
