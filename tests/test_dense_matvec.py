"""Dense layers at batch 1 (matrix-vector products): the default rule of `search_space.families.dense` for a
streamed weight, and every schedule of the matrix-vector part of the tuning space, checked against numpy on random
non-zero inputs of odd shapes, as single kernels and inside compiled models (against the interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import Interpreter
from relay_tune.target import Target
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space.families.common import split_value
from search_space.families.dense import MATVEC_CHAINS, MATVEC_MIN_WEIGHTS, is_matvec

HOST = resolve_target("llvm -num-cores=2")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")  # loop nests lowered, never run


def _source(n: int, k: int, epilogue: bool = False) -> str:
    body = "nn.relu(nn.bias_add(nn.dense(%x, %w), %b))" if epilogue else "nn.dense(%x, %w)"
    bias = f", %b: Tensor[({n}), float32]" if epilogue else ""
    return f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {k}), float32], %w: Tensor[({n}, {k}), float32]{bias}) {{
  {body}
}}"""


def _weights(n: int, k: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # uniform away from zero: a schedule that drops or repeats a term cannot hide behind a zero
    signs = rng.choice([-1.0, 1.0], size=(n, k))
    return {"w": (signs * rng.uniform(0.25, 1.0, (n, k))).astype(np.float32),
            "b": rng.uniform(-1.0, 1.0, n).astype(np.float32)}


def _task(n: int, k: int, target: Target, weights: dict[str, np.ndarray]) -> RelayTuneTask:
    mod = infer_types(bind_params(infer_types(parse_module(_source(n, k))), {"w": weights["w"]}))
    (task,) = tasks_from_module(mod, target, layout_planning=False, winograd="off")
    return task


def _run(task: RelayTuneTask, config: object, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    built = build_primitive(task.func, task.target_info, task.steps(config))  # type: ignore[arg-type]
    inputs = [w if i in task.weight_inputs else x for i in range(len(built.packing.input_shapes))]
    return np.asarray(built(*inputs))


@pytest.mark.parametrize("n,k", [(4096, 9216), (4096, 4096), (1000, 4096), (768, 3072), (1001, 263)])
@pytest.mark.parametrize("target", [HOST, AVX512], ids=["host", "avx512"])
def test_large_one_row_dense_defaults_to_streamed_panels_of_independent_chains(n: int, k: int,
                                                                               target: Target) -> None:
    """A weight of at least `MATVEC_MIN_WEIGHTS` at batch 1: packed panels `MATVEC_CHAINS` vectors wide (of the
    target's lanes; fewer only where a narrower panel divides the row), the panels split between the cores."""
    task = _task(n, k, target, {"w": np.ones((n, k), np.float32)})
    config = task.default_config()
    lanes = target.vector_lanes("float32")
    panel = int(config["tile_n"][-1])  # type: ignore[index]
    assert is_matvec(task.workload)
    assert config["pack_b"] and config["parallel"] == 2 and config["tile_m"] == (1, 1, 1), dict(config)
    assert panel % lanes == 0 and MATVEC_CHAINS // 2 <= panel // lanes <= MATVEC_CHAINS, dict(config)
    assert panel == MATVEC_CHAINS * lanes or n % panel == 0, dict(config)
    task.space.validate(config)
    task.lower(config)  # the template applies on AVX-512 as well (128-lane panels)


@pytest.mark.parametrize("n,k", [(37, 70), (3, 1001), (4096, 63)])
def test_small_or_cache_resident_one_row_dense_keeps_the_tiled_rule(n: int, k: int) -> None:
    """Below `MATVEC_MIN_WEIGHTS` weights (or under two vectors of columns) the weight stays in cache: the tiled
    default (two or three vectors of columns) applies."""
    task = _task(n, k, HOST, {"w": np.ones((n, k), np.float32)})
    assert n * k < MATVEC_MIN_WEIGHTS and not is_matvec(task.workload)
    assert int(task.default_config()["tile_n"][-1]) <= 3 * HOST.vector_lanes("float32")  # type: ignore[index]


def _matvec_configs(task: RelayTuneTask) -> list[object]:
    """Points of the space around the matrix-vector default: each panel width the knob offers in whole vectors
    (and half a vector, and the widest), each with the reduction unrolled by 1, 3 (leaving a tail) and 4, serial and
    parallel; those the space's constraints reject are left out."""
    default = task.default_config()
    lanes, n, k = task.workload.lanes, task.workload.dims["n"], task.workload.dims["k"]
    candidates = task.space.knob("tile_n").candidates  # type: ignore[attr-defined]
    widths = [w for w in candidates if w % lanes == 0 or w in (lanes // 2, max(candidates))]
    configs = []
    for width in widths:
        for unroll in (1, 3, 4):
            for parallel in (0, 2):
                config = default.replace(tile_n=split_value(n, 1, width), tile_k=split_value(k, min(unroll, k)),
                                         parallel=parallel)
                if task.space.is_valid(config):
                    configs.append(config)
    return configs


@pytest.mark.parametrize("n,k", [(37, 1001), (3, 1), (1, 3), (1001, 263), (131, 2049)])
def test_matvec_schedules_of_odd_shapes_equal_numpy(n: int, k: int) -> None:
    """Every panel width (up to `MATVEC_CHAINS` vectors) and reduction unroll of the space at batch 1, on shapes
    where no tile divides: the kernel equals numpy's product on random non-zero inputs."""
    weights = _weights(n, k, seed=n + k)
    x = np.random.default_rng(k).uniform(0.5, 1.5, (1, k)).astype(np.float32)
    task = _task(n, k, HOST, weights)
    configs = _matvec_configs(task)
    assert configs, "no matrix-vector config of the space is valid"
    want = x @ weights["w"].T
    for config in [task.default_config(), *configs]:
        got = _run(task, config, x, weights["w"])
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4 * np.sqrt(k),
                                   err_msg=str(dict(config)))


@pytest.mark.parametrize("n,k", [(1001, 263), (512, 1152), (125, 2099)])
def test_compiled_one_row_dense_with_epilogue_matches_the_interpreter(n: int, k: int) -> None:
    """Whole models (dense, bias, ReLU: a classifier layer, scaled-down AlexNet fc6 shapes) built untuned take the
    matrix-vector default and equal the reference interpreter and numpy."""
    weights = _weights(n, k, seed=3 * n + k)
    mod = infer_types(parse_module(_source(n, k, epilogue=True)))
    task = _task(n, k, HOST, weights)
    assert is_matvec(task.workload)
    x = np.random.default_rng(n).uniform(-1.0, 1.0, (1, k)).astype(np.float32)
    got = relay_tune.build(mod, HOST, params=weights).run(x=x)
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    want = np.asarray(Interpreter(mod).run({"x": x, **weights}))
    np.testing.assert_allclose(want, np.maximum(x @ weights["w"].T + weights["b"], 0.0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
