"""Pass infrastructure: Sequential, PassConfig, requirements, the registry and the default pipeline."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Expr, Function, IRModule, TensorType, TupleGetItem, Var, const, op
from relay_tune.op.registry import get_op
from relay_tune.passes import (
    EliminateCommonSubexpr,
    FoldConstant,
    FuseOps,
    InferType,
    Pass,
    PassConfig,
    Sequential,
    fused_groups,
    get_pass,
    optimize,
    registered_passes,
)
from relay_tune.passes.base import is_typed
from relay_tune.type_infer import infer_types

T = TensorType((2, 3), "float32")


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


@dataclass(frozen=True)
class RecordingPass(Pass):
    """Appends its tag to a shared log every time it runs; used to observe what a Sequential runs."""

    tag: str
    log: list[str] = dataclasses.field(default_factory=list, compare=False)

    name: ClassVar[str] = "Recording"
    opt_level: ClassVar[int] = 2

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        self.log.append(self.tag)
        return mod


def test_sequential_skips_passes_above_the_opt_level() -> None:
    log: list[str] = []
    seq = Sequential((RecordingPass("a", log), InferType(), RecordingPass("b", log)))
    x = Var("x", T)
    mod = IRModule({"main": Function((x,), x)})
    seq.run(mod, PassConfig(opt_level=1))
    assert log == []
    seq.run(mod, PassConfig(opt_level=2))
    assert log == ["a", "b"]


def test_disabled_passes_are_skipped() -> None:
    x = Var("x", T)
    mod = infer_types(IRModule({"main": Function((x,), call("add", call("exp", x), call("exp", x)))}))
    config = PassConfig(opt_level=3, disabled_passes=frozenset({"EliminateCommonSubexpr"}))
    out = Sequential((EliminateCommonSubexpr(),)).run(mod, config)
    assert out is mod


def test_nested_sequential_has_its_own_level() -> None:
    log: list[str] = []
    inner = Sequential((RecordingPass("inner", log),), opt_level=3)
    x = Var("x", T)
    mod = IRModule({"main": Function((x,), x)})
    Sequential((inner, RecordingPass("outer", log))).run(mod, PassConfig(opt_level=2))
    assert log == ["outer"]


def test_required_type_inference_runs_on_untyped_modules() -> None:
    x = Var("x", T)
    mod = IRModule({"main": Function((x,), call("nn.relu", call("exp", x)))})
    assert not is_typed(mod)
    fused = FuseOps().run(mod, PassConfig(opt_level=3))
    assert is_typed(fused)
    assert fused_groups(fused) == [("exp", "nn.relu")]


def test_passes_are_frozen_values_with_options() -> None:
    fuse = FuseOps(max_depth=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fuse.max_depth = 3  # type: ignore[misc]
    assert fuse == FuseOps(max_depth=8) and fuse != FuseOps()


def test_registry_builds_passes_by_name() -> None:
    assert {"FuseOps", "FoldConstant", "FoldScaleAxis", "SimplifyInference", "InferType",
            "EliminateCommonSubexpr", "DeadCodeElimination"} <= set(registered_passes())
    assert get_pass("FuseOps", max_depth=4) == FuseOps(max_depth=4)
    assert isinstance(get_pass("FoldConstant"), FoldConstant)
    with pytest.raises(KeyError, match="unknown pass"):
        get_pass("NoSuchPass")


def test_config_validates() -> None:
    with pytest.raises(ValueError):
        PassConfig(fuse_max_depth=0)


def _small_network() -> tuple[IRModule, list[np.ndarray]]:
    rng = np.random.default_rng(1)
    x = Var("x", TensorType((1, 3, 8, 8), "float32"))

    def rand(*shape: int) -> Expr:
        return const(rng.standard_normal(shape).astype("float32"))

    def bn(e: Expr, c: int) -> Expr:
        var = const(rng.uniform(0.5, 2, c).astype("float32"))
        return TupleGetItem(call("nn.batch_norm", e, rand(c), rand(c), rand(c), var), 0)

    y = call("nn.relu", bn(call("nn.conv2d", x, rand(4, 3, 3, 3), padding=(1, 1)), 4))
    z = bn(call("nn.conv2d", y, rand(4, 4, 3, 3), padding=(1, 1)), 4)
    out = call("nn.relu", call("add", z, y))
    pooled = call("nn.batch_flatten", call("nn.global_avg_pool2d", out))
    logits = call("add", call("nn.dense", pooled, rand(10, 4)), rand(10))
    mod = IRModule({"main": Function((x,), call("nn.softmax", logits))})
    return mod, [rng.standard_normal((1, 3, 8, 8)).astype("float32")]


def test_optimize_fuses_and_keeps_results() -> None:
    mod, inputs = _small_network()
    fused = optimize(mod, opt_level=3)
    assert is_typed(fused)
    groups = fused_groups(fused)
    assert groups == [
        ("nn.conv2d", "add", "nn.relu"),
        ("nn.conv2d", "add", "add", "nn.relu"),
        ("nn.global_avg_pool2d",),
        ("nn.batch_flatten",),
        ("nn.dense", "add"),
        ("nn.softmax",),
    ]
    np.testing.assert_allclose(evaluate(fused, inputs), evaluate(infer_types(mod), inputs), rtol=1e-5, atol=1e-6)


def test_optimize_at_level_zero_only_simplifies_and_splits() -> None:
    mod, inputs = _small_network()
    fused = optimize(mod, opt_level=0)
    groups = fused_groups(fused)
    assert all(len(g) == 1 for g in groups)
    assert ("nn.batch_norm",) not in groups
    np.testing.assert_allclose(evaluate(fused, inputs), evaluate(infer_types(mod), inputs), rtol=1e-5, atol=1e-6)


def test_optimize_handles_ten_thousand_nodes() -> None:
    x = Var("x", TensorType((4,), "float32"))
    body: Expr = x
    for i in range(5000):
        body = call("multiply", call("add", body, const(float(i % 3))), const(0.5))
    mod = IRModule({"main": Function((x,), body)})
    data = np.ones(4, "float32")
    expected = evaluate(infer_types(mod), [data])
    fused = optimize(mod, 3, PassConfig(disabled_passes=frozenset({"FoldScaleShift"})))
    assert sum(len(g) for g in fused_groups(fused)) == 10000
    np.testing.assert_allclose(evaluate(fused, [data]), expected, rtol=1e-5)
    merged = optimize(mod)  # FoldScaleShift: the whole chain is one multiply and one add
    assert sum(len(g) for g in fused_groups(merged)) == 2
    np.testing.assert_allclose(evaluate(merged, [data]), expected, rtol=1e-5)
