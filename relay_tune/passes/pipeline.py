"""The default optimisation pipeline: what `relay_tune.build` and the command line run before code generation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from relay_tune.errors import UnsupportedError
from relay_tune.ir import IRModule
from relay_tune.passes.base import InferType, Pass, PassConfig, Sequential
from relay_tune.passes.bf16 import Bfloat16Products
from relay_tune.passes.column_conv import ColumnConvAsRow
from relay_tune.passes.conv1d import Conv1dAsConv2d
from relay_tune.passes.conv_transpose import ConvTransposeAsConv
from relay_tune.passes.dead_code import DeadCodeElimination
from relay_tune.passes.eliminate_common_subexpr import EliminateCommonSubexpr
from relay_tune.passes.fold_constant import FoldConstant
from relay_tune.passes.fold_scale_axis import FoldScaleAxis
from relay_tune.passes.fold_scale_shift import FoldScaleShift
from relay_tune.passes.fuse_ops import FuseOps
from relay_tune.passes.plan_layouts import PlanLayouts
from relay_tune.passes.quantized_pooling import QuantizedPooling
from relay_tune.passes.quantized_products import QuantizedProducts
from relay_tune.passes.requantize import SimplifyRequantize
from relay_tune.passes.sibling_products import CombineSiblingProducts
from relay_tune.passes.simplify_inference import SimplifyInference
from relay_tune.passes.strided_row_conv import StridedRowConvAsFrames, StridedRowConvAsPhases
from relay_tune.passes.winograd import WinogradConv
from relay_tune.target import DotFeatures

# Whether CPU builds plan blocked layouts when the caller does not say (`layout_planning=None`). On: with default
# schedules it made ResNet-50, SqueezeNet 1.1 and an Inception-style net 7-17% faster end to end
# (experiments/bench_onnx_e2e.py --layout-planning both). Every CPU path (build, task extraction, the command line)
# reads it through `layout_block`, so tuning logs and builds agree on the workloads.
LAYOUT_PLANNING_DEFAULT = True

# Which 3x3 stride-1 convolutions CPU builds run as Winograd transforms around a batched product when the caller
# does not say (`winograd=None`; see `relay_tune.passes.winograd`). "auto": with default schedules it made
# ResNet-50 0.95 -> 0.83x onnxruntime's time, VGG-16 1.00 -> 0.70x, DenseNet-121 1.01 -> 0.92x, Inception-style
# 0.98 -> 0.81x, the others unchanged (experiments/bench_onnx_e2e.py --winograd off auto). Like layout planning,
# every CPU path (build, task extraction, the command line) reads it, so tuning logs and builds agree on the
# workloads.
WINOGRAD_DEFAULT = "auto"

# Blocks narrower than this are not worth a layout (a target without SIMD: 1 lane).
_MIN_BLOCK = 4


def layout_block(target: Any, layout_planning: bool | None = None) -> int:
    """The `PassConfig.layout_block` for `target` (a resolved `relay_tune.target.Target`): its float32 vector lanes
    on CPU (llvm) targets when layout planning is on (`None`: `LAYOUT_PLANNING_DEFAULT`), else 0 (off; GPU targets
    are always off)."""
    enabled = LAYOUT_PLANNING_DEFAULT if layout_planning is None else bool(layout_planning)
    if not enabled or target is None or getattr(target, "kind", None) != "llvm":
        return 0
    lanes = int(target.vector_lanes("float32"))
    return lanes if lanes >= _MIN_BLOCK else 0


def full_range_int8_mode(target: Any) -> str:
    """The `PassConfig.full_range_int8` for `target` (a resolved `relay_tune.target.Target`): "dot4" on CPUs with
    VNNI (vpdpbusd sums four u8 x s8 products exactly), "int16" on other x86 CPUs (vpmaddwd on the weight widened to
    int16), "float" elsewhere (GPU targets, CPUs without either)."""
    if target is None or getattr(target, "kind", None) != "llvm":
        return "float"
    features = DotFeatures.for_target(target)
    if features.vnni:
        return "dot4"
    return "int16" if features.pmaddubsw else "float"


PRECISION_OPTIONS = ("fp32", "bf16", "bf16-emulated")
"""What builds and tuning accept as a precision: "fp32" (the default), "bf16" (bfloat16 products on a CPU with
AVX512_BF16: vdpbf16ps), "bf16-emulated" (the same bfloat16 products on any CPU target, their pairs widened to
float32 where the CPU has no vdpbf16ps: bf16's numerics, not its speed)."""


def precision_mode(precision: str | None, target: Any) -> str:
    """The `PassConfig.precision` of a build or tuning run at `precision` (one of `PRECISION_OPTIONS`; None:
    "fp32") for `target` (a resolved `relay_tune.target.Target`). Raises `UnsupportedError` for "bf16" on a target
    without AVX512_BF16 (the message names the missing feature and the explicit "bf16-emulated"), and for either
    bf16 setting on a target other than a CPU."""
    choice = precision or "fp32"
    if choice not in PRECISION_OPTIONS:
        raise UnsupportedError(f"unknown precision {choice!r}; choose one of {', '.join(PRECISION_OPTIONS)}")
    if choice == "fp32":
        return "fp32"
    if target is None or getattr(target, "kind", None) != "llvm":
        raise UnsupportedError(f"precision {choice} is for CPU (llvm) targets, not {target}")
    if choice == "bf16" and not DotFeatures.for_target(target).bf16:
        raise UnsupportedError(
            f"precision bf16 needs a CPU with AVX512_BF16 (vdpbf16ps); the target "
            f"{target.mcpu or 'generic CPU'} does not have the avx512bf16 feature. Build for such a CPU "
            "(e.g. -mcpu=sapphirerapids) or ask for precision bf16-emulated: the same bfloat16 products with the "
            "pairs widened to float32, bf16's numerics without its speed")
    return "bf16"


def winograd_mode(winograd: str | None = None) -> str:
    """The `PassConfig.winograd` for a build (`None`: `WINOGRAD_DEFAULT`). It only acts where layout planning is on
    (it rewrites blocked convolutions), so GPU targets never see it."""
    return WINOGRAD_DEFAULT if winograd is None else str(winograd)  # `PassConfig` checks it


def default_pipeline() -> Sequential:
    """InferType, SimplifyInference, Conv1dAsConv2d, ColumnConvAsRow, ConvTransposeAsConv, EliminateCommonSubexpr,
    FoldConstant, StridedRowConvAsFrames, StridedRowConvAsPhases (after FoldConstant: a constant weight is a constant
    by then), QuantizedPooling, QuantizedProducts, FoldScaleAxis, FoldScaleShift, PlanLayouts, WinogradConv,
    CombineSiblingProducts (after PlanLayouts: blocked convolutions are left alone), FoldConstant, Bfloat16Products,
    DeadCodeElimination, FuseOps, SimplifyRequantize (inside each fused kernel: the products passes match
    dequantizations as the importer wrote them, and fusion keeps a kernel's 8-bit result 8-bit), InferType;
    each pass runs only at or above its own `opt_level`
    (QuantizedProducts: see `relay_tune.passes.quantized_products` for which products it
    takes at 3 and 4; PlanLayouts only when `PassConfig.layout_block` is set, WinogradConv only when
    `PassConfig.winograd` is not "off"). The FoldConstant after PlanLayouts packs constant weights into their blocked
    layouts once, at build time; Bfloat16Products acts only when `PassConfig.precision` is "bf16" and repacks those
    weights as bfloat16 pairs."""
    passes: tuple[Pass, ...] = (
        InferType(),
        SimplifyInference(),
        Conv1dAsConv2d(),
        ColumnConvAsRow(),
        ConvTransposeAsConv(),
        EliminateCommonSubexpr(),
        FoldConstant(),
        StridedRowConvAsFrames(),
        StridedRowConvAsPhases(),
        QuantizedPooling(),
        QuantizedProducts(),
        FoldScaleAxis(),
        FoldScaleShift(),
        PlanLayouts(),
        WinogradConv(),
        CombineSiblingProducts(),
        FoldConstant(),
        Bfloat16Products(),
        DeadCodeElimination(),
        FuseOps(),
        SimplifyRequantize(),
        InferType(),
    )
    return Sequential(passes, name="DefaultPipeline")


def optimize(mod: IRModule, opt_level: int = 3, config: PassConfig | None = None, *,
             layout_block: int | None = None, winograd: str | None = None,
             full_range_int8: str | None = None, precision: str | None = None) -> IRModule:
    """Optimise and fuse `mod`: the result calls one `Primitive=1` function per fused group and is fully typed.

    `config` overrides other settings (its `opt_level` is replaced by the argument, its `layout_block` by
    `layout_block` when given: see `layout_block(target, layout_planning)` for a target's block; its `winograd`
    by `winograd_mode(winograd)` unless a `config` is given and `winograd` is not; its `full_range_int8` by
    `full_range_int8` when given: see `full_range_int8_mode(target)`; its `precision` by `precision` when given,
    and a bf16 pipeline runs without Winograd unless `winograd` names a mode: Winograd-form convolutions would stay
    float32).
    """
    run_config = replace(config or PassConfig(), opt_level=opt_level)
    if layout_block is not None:
        run_config = replace(run_config, layout_block=layout_block)
    if full_range_int8 is not None:
        run_config = replace(run_config, full_range_int8=full_range_int8)
    if precision is not None:
        run_config = replace(run_config, precision=precision)
    if winograd is not None or config is None:
        bf16 = run_config.precision == "bf16" and winograd is None
        run_config = replace(run_config, winograd="off" if bf16 else winograd_mode(winograd))
    return default_pipeline().run(mod, run_config)
