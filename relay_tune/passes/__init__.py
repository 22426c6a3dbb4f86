"""Graph passes: type inference, inference simplification, constant folding, int8 products of quantized models,
scale folding, scale-shift merging, layout planning, CSE, DCE, fusion.

    from relay_tune.passes import optimize
    fused = optimize(mod, opt_level=3)          # the default pipeline; one Primitive=1 function per fused group

    from relay_tune.passes import FuseOps, PassConfig, Sequential
    mod = Sequential((SimplifyInference(), FuseOps(max_depth=8))).run(mod, PassConfig(opt_level=3))

Task extraction (one tuning task per distinct fused function): `extract_tasks(fused_mod) -> list[TaskSpec]`
(`relay_tune.passes.extract_tasks`).
"""

from relay_tune.passes.base import (
    DEFAULT_CONFIG,
    PRECISIONS,
    InferType,
    Pass,
    PassConfig,
    Sequential,
    get_pass,
    register_pass,
    registered_passes,
)
from relay_tune.passes.bf16 import Bfloat16Products
from relay_tune.passes.column_conv import ColumnConvAsRow
from relay_tune.passes.conv1d import Conv1dAsConv2d
from relay_tune.passes.conv_transpose import ConvTransposeAsConv
from relay_tune.passes.dead_code import DeadCodeElimination
from relay_tune.passes.eliminate_common_subexpr import EliminateCommonSubexpr
from relay_tune.passes.extract_tasks import TaskSpec, extract_tasks
from relay_tune.passes.fold_constant import FoldConstant
from relay_tune.passes.fold_scale_axis import FoldScaleAxis
from relay_tune.passes.fold_scale_shift import FoldScaleShift
from relay_tune.passes.fuse_ops import FuseOps, fused_groups
from relay_tune.passes.pipeline import (
    LAYOUT_PLANNING_DEFAULT,
    PRECISION_OPTIONS,
    WINOGRAD_DEFAULT,
    default_pipeline,
    full_range_int8_mode,
    layout_block,
    optimize,
    precision_mode,
    winograd_mode,
)
from relay_tune.passes.plan_layouts import PlanLayouts
from relay_tune.passes.quantized_pooling import QuantizedPooling
from relay_tune.passes.quantized_products import QuantizedProducts
from relay_tune.passes.requantize import SimplifyRequantize
from relay_tune.passes.sibling_products import CombineSiblingProducts
from relay_tune.passes.simplify_inference import SimplifyInference
from relay_tune.passes.strided_row_conv import StridedRowConvAsFrames, StridedRowConvAsPhases
from relay_tune.passes.winograd import WINOGRAD_MODES, WinogradConv

__all__ = [
    "Bfloat16Products",
    "DEFAULT_CONFIG",
    "PRECISIONS",
    "PRECISION_OPTIONS",
    "ColumnConvAsRow",
    "CombineSiblingProducts",
    "Conv1dAsConv2d",
    "ConvTransposeAsConv",
    "LAYOUT_PLANNING_DEFAULT",
    "DeadCodeElimination",
    "EliminateCommonSubexpr",
    "FoldConstant",
    "FoldScaleAxis",
    "FoldScaleShift",
    "FuseOps",
    "InferType",
    "Pass",
    "PassConfig",
    "PlanLayouts",
    "QuantizedPooling",
    "QuantizedProducts",
    "Sequential",
    "StridedRowConvAsFrames",
    "StridedRowConvAsPhases",
    "SimplifyInference",
    "SimplifyRequantize",
    "TaskSpec",
    "WINOGRAD_DEFAULT",
    "WINOGRAD_MODES",
    "WinogradConv",
    "default_pipeline",
    "extract_tasks",
    "full_range_int8_mode",
    "fused_groups",
    "get_pass",
    "layout_block",
    "optimize",
    "precision_mode",
    "register_pass",
    "registered_passes",
    "winograd_mode",
]
