"""Checks shared by the tests of the convolution rewrites (Conv1dAsConv2d, ColumnConvAsRow, StridedRowConvAsPhases):
one pass run alone, random arrays for a module's parameters, and the compiled model against the interpreter."""

from __future__ import annotations

import numpy as np

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import IRModule
from relay_tune.passes import Pass, PassConfig, Sequential
from relay_tune.type_infer import infer_types


def rewritten(mod: IRModule, rewrite: Pass) -> IRModule:
    return Sequential((rewrite,)).run(infer_types(mod), PassConfig(opt_level=3))


def random_arrays(mod: IRModule, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    typed = infer_types(mod)["main"]
    return {p.name_hint: rng.standard_normal(tuple(int(d) for d in p.checked_type.shape)).astype(np.float32)
            for p in typed.params}


def assert_compiled_matches(mod: IRModule, seed: int, constant_weight: bool) -> None:
    """`mod(x, w, b)` built (with `w` and `b` bound as constants or passed at run time) equals the interpreter."""
    arrays = random_arrays(mod, seed)
    want = np.asarray(Interpreter(mod).run(arrays))
    params = {"w": arrays["w"], "b": arrays["b"]} if constant_weight else None
    inputs = {"x": arrays["x"]} if constant_weight else arrays
    got = relay_tune.build(mod, params=params).run(**inputs)
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
