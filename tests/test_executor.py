"""The native executor: generated code runs every kernel of a model; benchmark/run/profile share it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.thread_team import HOLD, RELEASE
from relay_tune.errors import CompileError
from relay_tune.interpreter import Interpreter
from relay_tune.runtime.executor import RUN, RUN_PROFILED, RUN_REPEAT, executor_ir
from relay_tune.runtime.model import CompiledModel, load
from relay_tune.text import parse_module


def chain_text(shape: Sequence[int], ops: int) -> str:
    """Relay text of `ops` elementwise operators on one tensor of `shape`: y = y * 0.9, then y = y + x, in turn
    (so that the result depends on every call, in order)."""
    lines = ['#[version = "0.0.5"]', f"def @main(%x: Tensor[({', '.join(map(str, shape))}), float32]) {{"]
    previous = "%x"
    for i in range(ops):
        step = f"multiply({previous}, 0.9f)" if i % 2 == 0 else f"add({previous}, %x)"
        lines.append(f"  %{i} = {step};")
        previous = f"%{i}"
    lines += [f"  {previous}", "}"]
    return "\n".join(lines)


def build_chain(shape: Sequence[int], ops: int) -> tuple[CompiledModel, object]:
    """The chain as a model built with fusion off (opt_level 0): one kernel call per operator."""
    mod = parse_module(chain_text(shape, ops))
    return relay_tune.build(mod, opt_level=0), mod

MLP = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 16), float32], %w: Tensor[(8, 16), float32], %b: Tensor[(8), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.bias_add(%0, %b);
  %2 = nn.relu(%1);
  %3 = sigmoid(%2);
  (%2, %3)
}
"""


@pytest.fixture(scope="module")
def chain() -> tuple[CompiledModel, object]:
    return build_chain((1, 2, 8, 8), 100)


def test_a_chain_of_100_kernels_matches_the_interpreter(chain: tuple[CompiledModel, object]) -> None:
    model, mod = chain
    assert model.num_kernel_calls == 100  # fusion off: every operator is a kernel call of the executor
    inputs = model.random_inputs(seed=3)
    want = np.asarray(Interpreter(mod).run(inputs))
    np.testing.assert_allclose(model.run(**inputs), want, rtol=1e-6, atol=1e-6)
    # The result depends on every call: y = 0.9 y + x, 50 times, starting from y = x.
    x = inputs["x"].astype("float64")
    np.testing.assert_allclose(want, x * sum(0.9**k for k in range(51)), rtol=1e-5)


def test_the_executor_is_generated_code_calling_each_kernel_in_order() -> None:
    text = executor_ir([("k0", [0, 1]), ("k1", [1, 2]), ("k0", [2, 3])], 4)
    calls = [line.split('@"')[1].split('"')[0] for line in text.splitlines() if 'call void @"k' in line]
    # run: k0 k1 k0; run_profiled: the same three between clock readings
    assert calls == ["k0", "k1", "k0", "k0", "k1", "k0"]
    for symbol in (RUN, RUN_REPEAT, RUN_PROFILED):
        assert f'define void @"{symbol}"(' in text
    assert text.count('@"clock_gettime"(') == 1 + 4  # declared once, read before the first and after each call
    with pytest.raises(CompileError, match="storage"):
        executor_ir([("k0", [0, 5])], 4)
    with pytest.raises(CompileError, match="arguments"):
        executor_ir([("k0", [0, 1]), ("k0", [1])], 4)


def test_the_executor_brackets_each_run_with_the_team_hold_when_asked() -> None:
    calls = [("k0", [0, 1]), ("k1", [1, 2])]
    assert HOLD not in executor_ir(calls, 3) and RELEASE not in executor_ir(calls, 3)
    text = executor_ir(calls, 3, hold=True)
    called = [line.split('@"')[1].split('"')[0] for line in text.splitlines() if "call void @" in line]
    # run and run_profiled: hold, the kernels, release (run_repeat calls run)
    assert [c for c in called if c != RUN] == [HOLD, "k0", "k1", RELEASE] * 2


def test_benchmark_times_exactly_what_run_does(chain: tuple[CompiledModel, object], monkeypatch) -> None:
    model, _ = chain
    seen: list[int] = []
    original = model._run_checked

    def counting(arrays):
        seen.append(len(arrays))
        return original(arrays)

    monkeypatch.setattr(model, "_run_checked", counting)
    model.run(**model.random_inputs())
    assert seen == [1]
    stats = model.benchmark(repeat=4, number=3, warmup=2)
    assert len(seen) == 1 + 2 + 4 * 3  # every timed inference goes through the same method as run()
    assert len(stats.costs) == 4 and stats.min > 0


def test_profile_per_call_adds_up_and_matches_tasks(chain: tuple[CompiledModel, object]) -> None:
    model, _ = chain
    per_call = model.profile_calls(repeat=3)
    assert len(per_call) == model.num_kernel_calls and all(t >= 0 for t in per_call)
    rows = model.profile(repeat=3)
    assert sum(r.calls for r in rows) == model.num_kernel_calls
    assert {r.calls for r in rows} == {50}  # two tasks (multiply, add), 50 calls each
    for row in rows:
        assert row.per_call == pytest.approx(row.seconds / 50)
    assert sum(r.share for r in rows) == pytest.approx(1.0)


def test_profiled_runs_compute_the_same_outputs() -> None:
    mod = parse_module(MLP)
    model = relay_tune.build(mod)
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((2, 16)).astype("float32"),
              "w": rng.standard_normal((8, 16)).astype("float32"),
              "b": rng.standard_normal(8).astype("float32")}
    want = [np.asarray(v) for v in Interpreter(mod).run(inputs)]
    first = model.run(**inputs)
    model.profile(repeat=2, inputs=inputs)
    model.benchmark(repeat=2, inputs=inputs)
    second = model.run(**inputs)
    for got_a, got_b, expected in zip(first, second, want):
        np.testing.assert_allclose(got_a, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got_a, got_b)


def test_a_loaded_model_gets_its_executor_again(tmp_path: Path) -> None:
    mod = parse_module(MLP)
    model = relay_tune.build(mod)
    inputs = model.random_inputs(seed=5)
    path = model.save(tmp_path / "mlp.rtmod")
    again = load(path)
    for got, want in zip(again.run(**inputs), model.run(**inputs)):
        np.testing.assert_array_equal(got, want)
    assert len(again.profile_calls(repeat=1)) == again.num_kernel_calls


def test_two_models_with_the_same_kernel_names_run_side_by_side() -> None:
    # Kernel names repeat between builds (k0_..., k1_...); each executor must call its own model's kernels.
    small = relay_tune.build(parse_module(chain_text((1, 8), 4)), opt_level=0)
    other = relay_tune.build(parse_module(MLP))
    x = np.arange(8, dtype="float32").reshape(1, 8) - 4
    want = np.asarray(Interpreter(parse_module(chain_text((1, 8), 4))).run({"x": x}))
    np.testing.assert_allclose(small.run(x), want)
    inputs = other.random_inputs(seed=1)
    got = other.run(**inputs)
    np.testing.assert_allclose(got[1], 1 / (1 + np.exp(-got[0])), rtol=1e-5)
    np.testing.assert_allclose(small.run(x), want)


def test_the_executor_runs_parallel_kernels_on_the_fallback_thread_team() -> None:
    # Without libgomp, parallel regions call back into Python from generated code that ctypes entered with the
    # GIL released: the callbacks take it again.
    from relay_tune.codegen.jit import python_thread_team

    mod = parse_module(chain_text((64, 64, 64), 6))  # 2^18 elements each: every kernel above the parallel threshold
    model = relay_tune.build(mod, target="llvm -num-cores=2", opt_level=0, threading_runtime="python")
    x = np.random.default_rng(2).standard_normal((64, 64, 64)).astype("float32")
    want = np.asarray(Interpreter(mod).run({"x": x}))
    team = python_thread_team()
    before = team.regions
    np.testing.assert_allclose(model.run(x), want, rtol=1e-6, atol=1e-6)
    assert team.regions - before == 6  # every kernel ran as a parallel region of the fallback team
    assert len(model.profile_calls(repeat=1)) == 6
