"""`relay_tune.build`: targets, params, tuned-schedule lookup and logs, run-time weight packing, parallel compiles,
and what it refuses."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import BuildWarning, bind_params, resolve_target
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import IRModule
from relay_tune.kernel.compute import primitive_compute
from relay_tune.kernel.schedule import Split
from relay_tune.passes import extract_tasks, optimize
from relay_tune.runtime.model import PACKING_TASK, CompiledModel
from relay_tune.target import Target
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import constant_inputs
from relay_tune.type_infer import infer_types
from search_space.defaults import default_steps

RNG = np.random.default_rng(3)

MLP = """#[version = "0.0.5"]
def @main(%x: Tensor[(3, 40), float32], %w1: Tensor[(24, 40), float32], %b1: Tensor[(24), float32],
          %w2: Tensor[(5, 24), float32]) {
  %0 = nn.dense(%x, %w1);
  %1 = nn.bias_add(%0, %b1);
  %2 = nn.relu(%1);
  %3 = nn.dense(%2, %w2);
  sigmoid(%3)
}
"""


def mlp_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "w1": (0.2 * rng.standard_normal((24, 40))).astype("float32"),
        "b1": rng.standard_normal(24).astype("float32"),
        "w2": (0.2 * rng.standard_normal((5, 24))).astype("float32"),
    }


@pytest.fixture(scope="module")
def mlp() -> IRModule:
    return parse_module(MLP)


def check(model: CompiledModel, mod: IRModule, params: dict[str, np.ndarray] | None = None) -> None:
    params = params or {}
    inputs = model.random_inputs(seed=11)
    expected = evaluate(mod, {**inputs, **params})
    np.testing.assert_allclose(model.run(**inputs), expected, rtol=1e-4, atol=1e-5)  # type: ignore[arg-type]


def task_keys(mod: IRModule, params: dict[str, np.ndarray]) -> dict[str, Any]:
    fused = optimize(infer_types(bind_params(infer_types(mod), params)))
    return {t.key: t for t in extract_tasks(fused)}


# ---------------------------------------------------------------------------------------------------------------------
# targets and parameters
# ---------------------------------------------------------------------------------------------------------------------


def test_target_strings_default_to_this_machine() -> None:
    host = Target.host()
    assert resolve_target("llvm") == host
    assert resolve_target(None) == host
    assert resolve_target("native") == host
    one_core = resolve_target("llvm -num-cores=1")
    assert one_core.mcpu == host.mcpu and one_core.mattr == host.mattr and one_core.num_cores == 1
    generic = resolve_target("llvm -mcpu=x86-64")
    assert generic.mcpu == "x86-64" and generic.mattr == () and generic.num_cores == host.num_cores
    explicit = Target("llvm", "haswell", ("+avx2",), 3)
    assert resolve_target(explicit) is explicit
    assert resolve_target("cuda -arch=sm_80").kind == "cuda"  # GPU models have a runtime of their own
    with pytest.raises(RelayTuneError):
        resolve_target("llvm -bogus=1")


def test_params_become_constants_and_are_checked(mlp: IRModule) -> None:
    model = relay_tune.build(mlp, params=mlp_params())
    assert model.input_names == ["x"]
    check(model, mlp, mlp_params())
    with pytest.raises(RelayTuneError, match="unknown input"):
        relay_tune.build(mlp, params={"nope": np.zeros(1, "float32")})
    with pytest.raises(RelayTuneError, match="expected shape"):
        relay_tune.build(mlp, params={"w1": np.zeros((40, 24), "float32")})
    with pytest.raises(RelayTuneError, match="expected dtype"):
        relay_tune.build(mlp, params={"b1": np.zeros(24, "float64")})


def test_weights_given_at_run_time_are_packed_by_a_kernel(mlp: IRModule) -> None:
    # A schedule that reads an input weight packed gets a packing kernel that runs before it on every run: the
    # untuned build's default does (search_space.cpu.task_workload), and so does a record with such steps (here:
    # the template's default as if the weights were constants).
    assert sum(c.task == PACKING_TASK for c in relay_tune.build(mlp).plan.calls) == 2
    check(relay_tune.build(mlp), mlp)
    tasks = task_keys(mlp, {})
    host = resolve_target("llvm")
    model = relay_tune.build(mlp, logs=lambda key, _t: [
        s.to_json() for s in default_steps(primitive_compute(tasks[key].func), host, constants=None)])
    assert model.input_names == ["x", "w1", "b1", "w2"]
    packers = [c for c in model.plan.calls if c.task == PACKING_TASK]
    assert packers, "the steps read the dense weights packed"
    check(model, mlp)
    assert any(r.description == "weight packing" for r in model.profile(repeat=1))


def test_a_function_opt_level_zero_and_let_bindings() -> None:
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(2, 7), float32], %y: Tensor[(2, 7), float32]) {
  let %a = add(%x, %y);
  let %b = multiply(%a, %a);
  subtract(%b, %x)
}
""")
    for level in (0, 3):
        model = relay_tune.build(mod["main"], opt_level=level)
        check(model, mod)
    assert len(relay_tune.build(mod, opt_level=0).plan.calls) == 3


def test_relay_tune_build_is_the_compilers_function(mlp: IRModule) -> None:
    """`relay_tune.build` is a plain function (the compile package's `build`), also once that package is imported."""
    import types

    import relay_tune.compile as compile_package

    assert relay_tune.build is compile_package.build and relay_tune.bind_params is compile_package.bind_params
    assert isinstance(relay_tune.build, types.FunctionType) and type(compile_package) is types.ModuleType
    model = relay_tune.build(mlp, params=mlp_params())
    assert isinstance(model, CompiledModel)


def test_unsupported_programs_are_refused_and_branches_run() -> None:
    branching = parse_module("""#[version = "0.0.5"]
def @main(%c: bool, %x: Tensor[(3), float32]) {
  if (%c) { add(%x, %x) } else { multiply(%x, %x) }
}
""")
    model = relay_tune.build(branching)  # control flow: the virtual machine (tests/test_relay_vm.py)
    x = np.array([1.5, -2.0, 3.0], "float32")
    np.testing.assert_array_equal(model.run(c=np.array(True), x=x), x + x)
    np.testing.assert_array_equal(model.run(c=np.array(False), x=x), x * x)
    dynamic = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(?, 3), float32]) { add(%x, %x) }
""")
    with pytest.raises(RelayTuneError):
        relay_tune.build(dynamic)
    with pytest.raises(RelayTuneError, match="no @main"):
        relay_tune.build(IRModule({"other": branching["main"]}))


# ---------------------------------------------------------------------------------------------------------------------
# tuned schedules
# ---------------------------------------------------------------------------------------------------------------------


def test_lookup_supplies_steps_per_task(mlp: IRModule) -> None:
    params = mlp_params()
    tasks = task_keys(mlp, params)
    host = resolve_target("llvm")
    asked: list[tuple[str, str]] = []

    def lookup(key: str, target: Target) -> list[Any] | None:
        asked.append((key, str(target)))
        # An unscheduled kernel for the first task, the default steps (as JSON) for the others.
        if key == next(iter(tasks)):
            return []
        return [s.to_json() for s in default_steps(primitive_compute(tasks[key].func), target)]

    model = relay_tune.build(mlp, params=params, logs=lookup)
    assert sorted(asked) == sorted((k, str(host)) for k in tasks)
    assert all(t.tuned for t in model.plan.tasks)
    assert model.build_info["tuned_tasks"] == len(tasks)
    check(model, mlp, params)


def test_untuned_tasks_are_listed_in_one_warning(mlp: IRModule) -> None:
    params = mlp_params()
    first = next(iter(task_keys(mlp, params)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = relay_tune.build(mlp, params=params, logs=lambda key, _t: [] if key == first else None)
    build_warnings = [w for w in caught if issubclass(w.category, BuildWarning)]
    assert len(build_warnings) == 1
    assert "1 of 2 tasks" in str(build_warnings[0].message)
    assert [t.tuned for t in model.plan.tasks] == [True, False]
    with pytest.raises(RelayTuneError, match="no tuning record"):
        relay_tune.build(mlp, params=params, logs=lambda _k, _t: None, require_tuned=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        relay_tune.build(mlp, params=params)  # no logs given: nothing to warn about


def test_steps_that_no_longer_apply_fall_back_to_the_default(mlp: IRModule) -> None:
    params = mlp_params()
    bad = [Split(stage="no_such_stage", loop="i", factors=(None, 4))]
    with pytest.warns(BuildWarning, match="does not apply"):
        model = relay_tune.build(mlp, params=params, logs=lambda _k, _t: bad)
    assert not any(t.tuned for t in model.plan.tasks)
    check(model, mlp, params)


def test_tuning_logs_by_path(mlp: IRModule, tmp_path: Path) -> None:
    from relay_tune.tuning import TuningRecord
    from search_space import Config

    params = mlp_params()
    tasks = task_keys(mlp, params)
    target = str(resolve_target("llvm"))
    log = tmp_path / "tuning.jsonl"
    lines = []
    for key, task in tasks.items():
        steps = [s.to_json() for s in default_steps(primitive_compute(task.func), Target.parse(target),
                                                    constant_inputs(task))]
        for cost, chosen in ((2e-3, []), (1e-3, steps)):  # the faster record (default steps) must win
            lines.append(TuningRecord(key, target, Config({"steps": json.dumps(chosen)}), (cost,)).to_json())
    other_target = TuningRecord(next(iter(tasks)), "llvm -mcpu=znver4 -num-cores=7", Config({"steps": "[]"}), (1e-9,))
    log.write_text("\n".join([*lines, other_target.to_json()]) + "\n")
    model = relay_tune.build(mlp, params=params, logs=[str(log)])
    assert all(t.tuned for t in model.plan.tasks)
    # The winners are the default steps, which read the dense weights packed into panels (rank 3).
    constants = [v for v in model.plan.values if model.plan.storages[v.storage].kind == "constant"]
    assert sum(len(v.shape) == 3 for v in constants) == 2
    check(model, mlp, params)

    no_steps = tmp_path / "knobs.jsonl"
    no_steps.write_text(TuningRecord(next(iter(tasks)), target, Config({"tile": 8}), (1e-3,)).to_json() + "\n")
    # a record that is no point of the task's schedule space (another version's) is passed over, with a warning
    with pytest.warns(BuildWarning, match="2 of 2 tasks have no tuning record"):
        passed_over = relay_tune.build(mlp, params=params, logs=no_steps)
    assert not any(t.tuned for t in passed_over.plan.tasks)
    check(passed_over, mlp, params)
    bad_steps = tmp_path / "bad-steps.jsonl"
    bad_steps.write_text(TuningRecord(next(iter(tasks)), target, Config({"steps": "[{"}), (1e-3,)).to_json() + "\n")
    with pytest.raises(RelayTuneError, match="steps are not valid JSON"):  # a hand-pinned schedule that is broken
        relay_tune.build(mlp, params=params, logs=bad_steps)
    with pytest.raises(RelayTuneError, match="no such file"):
        relay_tune.build(mlp, params=params, logs=tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------------------------------------------------
# compiling in parallel
# ---------------------------------------------------------------------------------------------------------------------


def test_parallel_compile_splits_kernels_over_objects(mlp: IRModule, tmp_path: Path) -> None:
    params = mlp_params()
    serial = relay_tune.build(mlp, params=params, jobs=1)
    parallel = relay_tune.build(mlp, params=params, jobs=2)
    assert len(serial.object_code) == 1 and len(parallel.object_code) == 2
    x = RNG.standard_normal((3, 40)).astype("float32")
    np.testing.assert_array_equal(serial.run(x), parallel.run(x))
    loaded = relay_tune.runtime.load(parallel.save(tmp_path / "two_objects.rtmod"))
    np.testing.assert_array_equal(loaded.run(x), parallel.run(x))
