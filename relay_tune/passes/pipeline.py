"""The default optimisation pipeline: what `relay_tune.build` and the command line run before code generation."""

from __future__ import annotations

from relay_tune.ir import IRModule
from relay_tune.passes.base import InferType, Pass, PassConfig, Sequential
from relay_tune.passes.dead_code import DeadCodeElimination
from relay_tune.passes.eliminate_common_subexpr import EliminateCommonSubexpr
from relay_tune.passes.fold_constant import FoldConstant
from relay_tune.passes.fold_scale_axis import FoldScaleAxis
from relay_tune.passes.fuse_ops import FuseOps
from relay_tune.passes.simplify_inference import SimplifyInference


def default_pipeline() -> Sequential:
    """InferType, SimplifyInference, EliminateCommonSubexpr, FoldConstant, FoldScaleAxis, FoldConstant,
    DeadCodeElimination, FuseOps, InferType; each pass runs only at or above its own `opt_level`."""
    passes: tuple[Pass, ...] = (
        InferType(),
        SimplifyInference(),
        EliminateCommonSubexpr(),
        FoldConstant(),
        FoldScaleAxis(),
        FoldConstant(),
        DeadCodeElimination(),
        FuseOps(),
        InferType(),
    )
    return Sequential(passes, name="DefaultPipeline")


def optimize(mod: IRModule, opt_level: int = 3, config: PassConfig | None = None) -> IRModule:
    """Optimise and fuse `mod`: the result calls one `Primitive=1` function per fused group and is fully typed.

    `config` overrides other settings (its `opt_level` is replaced by the argument).
    """
    base = config or PassConfig()
    run_config = PassConfig(
        opt_level=opt_level,
        disabled_passes=base.disabled_passes,
        fuse_max_depth=base.fuse_max_depth,
        fold_small_result_elements=base.fold_small_result_elements,
    )
    return default_pipeline().run(mod, run_config)
