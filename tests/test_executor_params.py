"""Weights passed as inputs, bound as constants: packed once at build time (Python API and `--params`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.cli import main
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.runtime.benchmark import LatencyComparison
from relay_tune.runtime.model import PACKING_TASK, load
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import tasks_from_module

DENSE = """#[version = "0.0.5"]
def @main(%x: Tensor[(4, 64), float32], %w: Tensor[(32, 64), float32], %b: Tensor[(32), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}
"""


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {"w": (0.1 * rng.standard_normal((32, 64))).astype("float32"),
            "b": rng.standard_normal(32).astype("float32")}


def test_bound_weights_are_packed_at_build_time_not_per_run() -> None:
    mod = parse_module(DENSE)
    as_inputs = relay_tune.build(mod)
    # A weight given as an input is packed by a packing kernel before every run (the default schedule reads it
    # packed, as a tuned one may: tests/test_runtime_weight_packing.py) ...
    assert [c.task for c in as_inputs.plan.calls] == [PACKING_TASK, 0]
    bound_mod = relay_tune.bind_params(mod, weights())
    (as_input_task,) = tasks_from_module(mod, "llvm")
    (bound_task,) = tasks_from_module(bound_mod, "llvm")
    assert as_input_task.default_config()["pack_b"] and bound_task.default_config()["pack_b"]
    bound = relay_tune.build(bound_mod)
    assert bound.input_names == ["x"]
    assert not any(c.task == PACKING_TASK for c in bound.plan.calls)  # ... bound, once, at build time, into a constant
    assert bound.num_kernel_calls == 1 and as_inputs.num_kernel_calls == 2
    x = np.random.default_rng(0).standard_normal((4, 64)).astype("float32")
    want = np.asarray(evaluate(mod, {"x": x, **weights()}))
    np.testing.assert_allclose(bound.run(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(as_inputs.run(x, **weights()), want, rtol=1e-5, atol=1e-5)


def test_cli_params_file_binds_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_path = tmp_path / "dense.relay"
    model_path.write_text(DENSE)
    params = tmp_path / "weights.npz"
    np.savez(params, **weights())
    out = tmp_path / "dense.rtmod"
    assert main(["build", str(model_path), "--params", str(params), "-o", str(out)]) == 0
    model = load(out)
    assert model.input_names == ["x"]
    x = np.ones((4, 64), "float32")
    want = np.asarray(evaluate(parse_module(DENSE), {"x": x, **weights()}))
    np.testing.assert_allclose(model.run(x), want, rtol=1e-5, atol=1e-5)
    capsys.readouterr()

    np.savez(tmp_path / "wrong.npz", weight=weights()["w"])
    assert main(["build", str(model_path), "--params", str(tmp_path / "wrong.npz"), "-o", str(out)]) == 1
    assert "unknown input(s) 'weight'" in capsys.readouterr().err
    assert main(["build", str(model_path), "--params", str(tmp_path / "missing.npz"), "-o", str(out)]) == 1
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert main(["tasks", str(model_path), "--params", str(tmp_path / "bad.npz")]) == 1
    assert "not a readable .npz" in capsys.readouterr().err


def test_read_params_refuses_pickled_arrays(tmp_path: Path) -> None:
    from relay_tune.compile import read_params

    path = tmp_path / "objects.npz"
    np.savez(path, w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(RelayTuneError, match="not a readable"):
        read_params(path)


SLOW_DENSE = """#[version = "0.0.5"]
def @main(%x: Tensor[(32, 256), float32], %w: Tensor[(256, 256), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.relu(%0);
  %2 = reshape(%1, newshape=[32, 16, 16]);
  sum(%2, axis=[2])
}
"""


ONE_CORE = "llvm -num-cores=1"


def test_a_record_slower_in_the_graph_than_the_default_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import relay_tune.compile.check_tuned as check_tuned

    mod = parse_module(SLOW_DENSE)
    w = (0.1 * np.random.default_rng(4).standard_normal((256, 256))).astype("float32")
    dense_keys: list[str] = []

    def lookup(key: str, _target: object) -> list[object] | None:
        # A "record" for every task: no schedule at all (serial, unvectorised loops).
        dense_keys.append(key)
        return []

    def in_graph_seconds(models: tuple[object, object], *_args: object, **_kwargs: object) -> list[dict[str, float]]:
        # The profiles the check compares, fixed: in the tuned model its dense kernel takes twice the default's time,
        # every other kernel the same.
        tuned, default = models
        return [{t.key: 2e-3 if "dense" in t.description else 1e-3 for t in tuned.plan.tasks},  # type: ignore[attr-defined]
                {t.key: 1e-3 for t in default.plan.tasks}]  # type: ignore[attr-defined]

    def end_to_end(
        default: object, tuned: object, _inputs: object, rounds: int, extend_s: float = 0.0,
    ) -> LatencyComparison:
        # the checked build is the faster one end to end
        return LatencyComparison(((2e-3,),) * rounds, ((1e-3,),) * rounds)

    monkeypatch.setattr(check_tuned, "interleaved_task_seconds", in_graph_seconds)
    monkeypatch.setattr(check_tuned, "compare_latency", end_to_end)
    naive = relay_tune.build(mod, ONE_CORE, params={"w": w}, logs=lookup)
    assert all(t.tuned for t in naive.plan.tasks if t.kernel)
    checked = relay_tune.build(mod, ONE_CORE, params={"w": w}, logs=lookup, check_tuned=True)
    report = checked.build_info["tuned_check"]
    dense = next(t for t in checked.plan.tasks if "dense" in t.description)
    assert report["rejected"] == [dense.key]  # its kernel lost in the graph
    assert report["tasks"][dense.key] == {"tuned_s": 2e-3, "default_s": 1e-3}
    assert not dense.tuned  # so the model runs the default dense kernel
    assert all(t.tuned for t in checked.plan.tasks if t.kernel and t.key != dense.key)  # the others keep theirs
    assert not report["kept_default"] and report["tuned_e2e_s"] == 1e-3 and report["default_e2e_s"] == 2e-3
    x = np.random.default_rng(1).standard_normal((32, 256)).astype("float32")
    want = np.asarray(evaluate(mod, {"x": x, "w": w}))
    np.testing.assert_allclose(checked.run(x), want, rtol=1e-4, atol=1e-4)
    # require_tuned concerns the records found, not the ones the check then leaves out
    strict = relay_tune.build(mod, ONE_CORE, params={"w": w}, logs=lookup, check_tuned=True, require_tuned=True)
    np.testing.assert_allclose(strict.run(x), want, rtol=1e-4, atol=1e-4)
    # without logs there is nothing to check: a plain build
    assert "tuned_check" not in relay_tune.build(mod, ONE_CORE, params={"w": w}, check_tuned=True).build_info


def test_the_end_to_end_choice_follows_the_medians_it_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    import relay_tune.compile.check_tuned as check_tuned

    mod = parse_module(SLOW_DENSE)
    w = (0.1 * np.random.default_rng(4).standard_normal((256, 256))).astype("float32")

    def lookup(key: str, _target: object) -> list[object] | None:
        return []

    def in_graph_seconds(models: tuple[object, object], *_args: object, **_kwargs: object) -> list[dict[str, float]]:
        tuned, default = models
        return [{t.key: 1e-3 for t in tuned.plan.tasks}, {t.key: 1e-3 for t in default.plan.tasks}]  # type: ignore[attr-defined]

    def end_to_end(
        default: object, tuned: object, _inputs: object, rounds: int, extend_s: float = 0.0,
    ) -> LatencyComparison:
        # the records' build is faster by its medians (0.8 against 1 ms); one lucky default sample is faster still
        return LatencyComparison(((1e-3, 1e-3, 0.4e-3),) * rounds, ((0.8e-3,) * 3,) * rounds)

    monkeypatch.setattr(check_tuned, "interleaved_task_seconds", in_graph_seconds)
    monkeypatch.setattr(check_tuned, "compare_latency", end_to_end)
    checked = relay_tune.build(mod, ONE_CORE, params={"w": w}, logs=lookup, check_tuned=True)
    report = checked.build_info["tuned_check"]
    assert not report["kept_default"]
    assert report["tuned_e2e_s"] == pytest.approx(0.8e-3) and report["default_e2e_s"] == pytest.approx(1e-3)
