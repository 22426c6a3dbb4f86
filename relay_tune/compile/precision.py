"""How far a reduced-precision build's outputs are from the fp32 build's.

A bf16 build (`relay_tune.build(..., precision="bf16")`) rounds weights and activations to bfloat16 (8-bit
mantissas): its outputs differ from the fp32 build's by a relative error of order 2^-8 per product, accumulated over
each sum and through the layers. `relative_error_vs_fp32` builds the fp32 model beside it, runs both on the same
seeded random inputs and reports the worst output's relative error in the L2 norm, `|y - y32| / |y32|`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from relay_tune.compile.pipeline import compile_model
from relay_tune.ir import Function, IRModule


def _outputs(result: Any) -> list[np.ndarray]:
    if isinstance(result, tuple | list):
        return [np.asarray(r) for item in result for r in _outputs(item)]
    return [np.asarray(result)]


def relative_error(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """The largest `|y - r| / |r|` (L2 norms, in float64) over pairs of outputs; 0.0 for identical outputs, inf
    where a reference output is all zeros and the other is not."""
    worst = 0.0
    for y, r in zip(outputs, reference, strict=True):
        diff = float(np.linalg.norm(y.astype(np.float64) - r.astype(np.float64)))
        norm = float(np.linalg.norm(r.astype(np.float64)))
        worst = max(worst, diff / norm if norm else (0.0 if diff == 0 else float("inf")))
    return worst


def relative_error_vs_fp32(model: Any, mod: IRModule | Function, target: Any, params: Mapping[str, Any] | None = None,
                           opt_level: int = 3, seed: int = 0, **options: Any) -> float:
    """`relative_error` of `model` (a reduced-precision build of `mod`) against `mod` built at fp32 with the same
    `target`, `params`, `opt_level` and `options` (default schedules: the numbers, not the speed, are compared), on
    `model.random_inputs(seed)`."""
    fp32 = compile_model(mod, target, params, None, opt_level, **{**options, "precision": "fp32"})
    inputs = model.random_inputs(seed=seed)
    return relative_error(_outputs(model.run(**inputs)), _outputs(fp32.run(**inputs)))
