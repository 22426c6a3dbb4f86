"""Programs with control flow compiled for the virtual machine (`relay_tune.runtime.vm`), against the interpreter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import relay_tune
from relay_tune.cli import main
from relay_tune.compile import model_tasks, resolve_target
from relay_tune.errors import RelayTuneError, UnsupportedError
from relay_tune.interpreter import Interpreter
from relay_tune.ir import IRModule
from relay_tune.passes import optimize
from relay_tune.runtime.model import CompiledModel, ModelInputError
from relay_tune.runtime.vm import VMError, VMModel, load_model, load_vm
from relay_tune.testing import control_flow as cf
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types


def typed(text: str) -> IRModule:
    return infer_types(parse_module(text))


def random_inputs(model: VMModel | CompiledModel, seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Non-zero random floats (scaled), the model's own integers for counters."""
    rng = np.random.default_rng(seed)
    inputs = model.random_inputs(seed)
    for name, value in inputs.items():
        if value.dtype.kind == "f":
            inputs[name] = (rng.uniform(0.1, 1.0, value.shape) * rng.choice([-1, 1], value.shape)
                            * scale).astype(value.dtype)
    return inputs


def leaves(value: Any) -> list[np.ndarray]:
    return [x for v in value for x in leaves(v)] if isinstance(value, tuple) else [np.asarray(value)]


def assert_matches(mod: IRModule, model: VMModel | CompiledModel, inputs: dict[str, np.ndarray]) -> None:
    expected = Interpreter(mod).run(dict(inputs))
    got = model.run(**inputs)
    assert isinstance(got, tuple) == isinstance(expected, tuple)
    for want, have in zip(leaves(expected), leaves(got), strict=True):
        assert have.shape == want.shape and have.dtype == want.dtype
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)


def ops(model: VMModel) -> list[str]:
    return [i.op for f in model.program.functions for i in f.code]


def test_if_on_a_data_dependent_condition_takes_both_branches() -> None:
    mod = typed(cf.BRANCH)
    model = relay_tune.build(mod)
    assert isinstance(model, VMModel) and "if" in ops(model)
    assert len(model.program.kernels) >= 5  # condition (sum, greater), one kernel per branch, the join's add
    signs = set()
    for seed in range(6):
        inputs = random_inputs(model, seed)
        inputs["x"] = np.abs(inputs["x"]) * (1 if seed % 2 else -1)
        signs.add(bool(inputs["x"].sum() > 0))
        assert_matches(mod, model, inputs)
    assert signs == {True, False}


@pytest.mark.parametrize("native", [True, False])
def test_recursive_loop_matches_the_interpreter(native: bool, tmp_path: Path) -> None:
    mod = typed(cf.LOOP)
    built = relay_tune.build(mod)
    assert isinstance(built, VMModel) and {"invoke", "tail"} <= set(ops(built))
    model = load_vm(built.save(tmp_path / "loop.rtmod"), native_loops=native)
    assert any(loop is not None for loop in model._loops) == native  # @loop is a plain loop: native when allowed
    for seed in range(3):
        assert_matches(mod, model, random_inputs(model, seed, scale=0.5))


def test_loop_passing_a_parameter_on_to_another_runs_instruction_by_instruction() -> None:
    mod = typed(cf.FIBONACCI)
    model = relay_tune.build(mod)
    assert isinstance(model, VMModel) and all(loop is None for loop in model._loops)
    for seed in range(3):
        assert_matches(mod, model, random_inputs(model, seed))


def test_non_tail_recursion_uses_frames_not_the_python_stack() -> None:
    mod = typed(cf.NESTED)
    model = relay_tune.build(mod)
    assert isinstance(model, VMModel)
    for n in (0, 1, 5):
        inputs = random_inputs(model, n)
        inputs["n"] = np.array(n, "int32")
        assert_matches(mod, model, inputs)
    x = random_inputs(model, 7)["x"]
    expected = x.copy()
    for _ in range(3000):  # deeper than Python's recursion limit
        expected = expected * np.float32(0.5) + np.sin(x)
    np.testing.assert_allclose(model.run(x=x, n=np.array(3000, "int32")), expected, rtol=1e-5, atol=1e-5)


def test_let_bound_closure_called_twice_and_tuples() -> None:
    mod = typed(cf.CLOSURES)
    model = relay_tune.build(mod)
    assert isinstance(model, VMModel)
    assert {"closure", "call_closure", "tuple", "field"} <= set(ops(model))
    for seed in range(3):
        assert_matches(mod, model, random_inputs(model, seed))


def test_recursive_let_bound_closure() -> None:
    mod = typed(cf.RECURSIVE_CLOSURE)
    model = relay_tune.build(mod)
    closures = [i for f in model.program.functions for i in f.code if i.op == "closure"]  # type: ignore[union-attr]
    assert closures and closures[0].self_slot >= 0
    for k in (0, 1, 4):
        inputs = random_inputs(model, k)
        inputs["k"] = np.array(k, "int32")
        assert_matches(mod, model, inputs)


def test_rnn_unrolled_and_recursive_agree() -> None:
    recursive, unrolled = typed(cf.rnn_recursive(steps=64, hidden=24, features=10)), \
        typed(cf.rnn_unrolled(steps=64, hidden=24, features=10))
    vm, graph = relay_tune.build(recursive), relay_tune.build(unrolled)
    assert isinstance(vm, VMModel) and isinstance(graph, CompiledModel)
    assert any(loop is not None for loop in vm._loops)
    inputs = random_inputs(vm, 0, scale=0.3)
    assert_matches(recursive, vm, inputs)
    assert_matches(unrolled, graph, inputs)
    np.testing.assert_allclose(vm.run(**inputs), graph.run(**inputs), rtol=1e-5, atol=1e-5)
    assert vm.benchmark(repeat=2, inputs=inputs).median > 0


def test_programs_without_control_flow_keep_the_static_graph_plan() -> None:
    mod = typed(cf.HEADER + "def @main(%x: Tensor[(3, 4), float32]) { tanh(add(%x, 1f)) }")
    assert isinstance(relay_tune.build(mod), CompiledModel)


def test_tasks_include_kernels_inside_branches_and_functions() -> None:
    target = resolve_target("llvm")
    fused = optimize(typed(cf.LOOP))
    descriptions = " ".join(t.description for t in model_tasks(fused, target).kernels)
    assert "dense" in descriptions and "less" in descriptions  # both inside @loop
    branch = " ".join(t.description for t in model_tasks(optimize(typed(cf.BRANCH)), target).kernels)
    assert "exp" in branch and "sigmoid" in branch
    # the tuner sees the same tasks
    from relay_tune.tuning.relay_task import tasks_from_module

    assert len(tasks_from_module(typed(cf.LOOP), target)) == len(model_tasks(fused, target).kernels)


def test_save_and_load(tmp_path: Path) -> None:
    mod = typed(cf.CLOSURES)
    model = relay_tune.build(mod)
    path = model.save(tmp_path / "closures.rtmod")
    loaded = load_model(path)
    assert isinstance(loaded, VMModel)
    inputs = random_inputs(model, 3)
    for want, have in zip(leaves(model.run(**inputs)), leaves(loaded.run(**inputs)), strict=True):
        np.testing.assert_array_equal(have, want)
    static = relay_tune.build(typed(cf.HEADER + "def @main(%x: Tensor[(3), float32]) { exp(%x) }"))
    assert isinstance(load_model(static.save(tmp_path / "static.rtmod")), CompiledModel)


def test_clear_errors() -> None:
    model = relay_tune.build(typed(cf.BRANCH))
    with pytest.raises(ModelInputError, match="expected shape"):
        model.run(x=np.zeros((2, 2), "float32"), y=np.zeros((3, 5), "float32"))
    with pytest.raises(ModelInputError, match="missing input"):
        model.run(x=np.zeros((3, 5), "float32"))
    with pytest.raises(VMError, match="static graphs only"):
        model.profile()
    returns_function = typed(cf.HEADER + "def @main(%x: Tensor[(2), float32]) { fn (%y: Tensor[(2), float32]) "
                                         "{ add(%x, %y) } }")
    with pytest.raises(VMError, match="returned a VMClosure"):
        relay_tune.build(returns_function).run(x=np.ones(2, "float32"))
    tuple_input = typed(cf.HEADER + "def @main(%t: (Tensor[(2), float32], Tensor[(2), float32])) { "
                                    "if (greater(sum(%t.0), 0f)) { %t.0 } else { %t.1 } }")
    with pytest.raises(UnsupportedError, match="static shape"):
        relay_tune.build(tuple_input)
    assert issubclass(VMError, RelayTuneError)


def test_cli_build_and_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "loop.relay"
    source.write_text(cf.LOOP)
    output = tmp_path / "loop.rtmod"
    assert main(["build", str(source), "-o", str(output)]) == 0
    assert "virtual machine" in capsys.readouterr().out
    result = tmp_path / "out.npz"
    assert main(["run", str(output), "--output", str(result), "--repeat", "2"]) == 0
    printed = capsys.readouterr().out
    assert "output 0: [2, 7] float32" in printed and "latency" in printed
    model = load_model(output)
    inputs = model.random_inputs(0)
    expected = Interpreter(typed(cf.LOOP)).run(inputs)
    with np.load(result) as archive:
        np.testing.assert_allclose(archive["output_0"], expected, rtol=1e-5, atol=1e-5)


def test_list_adt_built_by_recursion_and_summed_with_match(tmp_path: Path) -> None:
    mod = typed(cf.LIST_SUM)
    built = relay_tune.build(mod)
    assert isinstance(built, VMModel) and {"construct", "if_tag", "fail"} <= set(ops(built))
    model = load_model(built.save(tmp_path / "list.rtmod"))  # constructor tags survive the file
    assert isinstance(model, VMModel)
    for n in (0, 1, 2, 5):
        inputs = random_inputs(model, n)
        inputs["n"] = np.array(n, "int32")
        assert_matches(mod, model, inputs)
    x = random_inputs(model, 9)["x"]
    total, head = model.run(x=x, n=np.array(3, "int32"))
    np.testing.assert_allclose(total, np.tanh(3 * x) + np.tanh(2 * x) + np.tanh(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(head, 3 * x, rtol=1e-6)


def test_list_adt_prints_and_parses_back() -> None:
    from relay_tune.text import print_module

    mod = typed(cf.LIST_SUM)
    text = print_module(mod)
    assert text.index("type List[A] {") < text.index("def @build") and "Cons(%first, Cons(_, _))" in text
    assert typed(text) == mod


def test_adt_errors_are_clear() -> None:
    with pytest.raises(RelayTuneError, match="different types"):
        typed(cf.HEADER + "type T { A, B(float32) }\ndef @main(%t: T) { match (%t) { A => 1f, B(%v) => 1 } }")
    with pytest.raises(RelayTuneError, match="has 1 field"):
        typed(cf.HEADER + "type T { A, B(float32) }\ndef @main(%t: T) { match (%t) { B => 1f } }")
    no_clause = typed(cf.HEADER + "type T { A, B }\ndef @main(%x: float32) {\n"
                                  "  %0 = if (greater(%x, 0f)) { A } else { B };\n"
                                  "  match (%0) { A => %x }\n}")
    model = relay_tune.build(no_clause)
    np.testing.assert_array_equal(model.run(x=np.float32(2)), np.float32(2))
    with pytest.raises(VMError, match="no clause"):
        model.run(x=np.float32(-2))
    returns_list = typed(cf.HEADER + "type T { A(float32) }\ndef @main(%x: float32) { A(%x) }")
    with pytest.raises(VMError, match="algebraic data type"):
        relay_tune.build(returns_list).run(x=np.float32(1))


def test_convolution_loop_and_tuple_kernels_in_branches() -> None:
    conv = typed(cf.CONV_LOOP)
    model = relay_tune.build(conv)
    assert any(loop is not None for loop in model._loops)  # type: ignore[union-attr]
    for seed in range(2):
        assert_matches(conv, model, random_inputs(model, seed, scale=0.3))
    split = typed(cf.SPLIT_BRANCHES)
    model = relay_tune.build(split)
    assert isinstance(model, VMModel)
    for seed in range(4):
        inputs = random_inputs(model, seed)
        inputs["x"] = inputs["x"] * (2.0 if seed % 2 else 0.4)  # both sides of both conditions
        assert_matches(split, model, inputs)
