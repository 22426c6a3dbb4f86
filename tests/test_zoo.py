"""The model zoo (`relay_tune.testing.zoo`): every model type-checks, prints to Relay text and parses back, builds
with default schedules and computes what the reference interpreter computes; its activations stay O(1); at the real
size each network has its published signature and parameter count. Also: the memory plan and saving/loading of a
built model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter, evaluate
from relay_tune.ir import Call, Constant, FuncType, IRModule, TensorType, post_order
from relay_tune.runtime.model import CompiledModel
from relay_tune.testing import zoo
from relay_tune.text import load_module, parse_module, print_module

NAMES = list(zoo.MODELS)
HEAVY = {"resnet50", "bert_layer"}  # full-size interpreter runs of several seconds


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[IRModule, CompiledModel]]:
    """Small models built once per test module, by name (several tests look at the same build)."""

    class Builds(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> tuple[IRModule, CompiledModel]:
            mod = zoo.small(name)
            self[name] = (mod, relay_tune.build(mod))
            return self[name]

    return Builds()


def leaves(value: object) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in leaves(item)]
    assert isinstance(value, np.ndarray)
    return [value]


def assert_agrees(model: CompiledModel, mod: IRModule, seed: int = 0) -> None:
    inputs = model.random_inputs(seed)
    expected = leaves(evaluate(mod, inputs))
    got = leaves(model.run(**inputs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * scale)


# ---------------------------------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------------------------------


def test_registry_has_every_network_and_names_what_it_lacks() -> None:
    assert set(NAMES) == {
        "resnet18", "resnet50", "mobilenet_v1", "mobilenet_v2", "squeezenet1_1", "inception_block",
        "densenet_block", "lstm", "dcgan", "bert_layer",
    }
    assert all(zoo.MODELS[n].name == n and zoo.MODELS[n].description for n in NAMES)
    with pytest.raises(KeyError, match="no zoo model 'vgg16'; the zoo has resnet18"):
        zoo.small("vgg16")
    with pytest.raises(ValueError, match="ResNet depth must be one of"):
        zoo.resnet(20)
    with pytest.raises(ValueError, match="power of two"):
        zoo.dcgan(image=48)


def test_parameters_depend_on_the_seed_only() -> None:
    assert zoo.small("lstm", seed=3) == zoo.small("lstm", seed=3)
    assert zoo.small("lstm", seed=3) != zoo.small("lstm", seed=4)
    assert zoo.small("lstm", seed=3).main.checked_type == zoo.small("lstm", seed=4).main.checked_type


# ---------------------------------------------------------------------------------------------------------------
# small sizes: types, text, build, numbers
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_small_model_type_checks_and_round_trips_through_text(name: str) -> None:
    mod = zoo.small(name)
    for node in post_order(mod.main):  # built already typed: every node has its type
        assert node.has_type() or not isinstance(node, (Call, Constant))
    constants: list[np.ndarray] = []
    text = print_module(mod, constants_out=constants)
    again = parse_module(text, name, constants)
    assert again == mod
    assert print_module(again, constants_out=[]) == text


def test_write_saves_text_and_parameters_that_load_back_exactly(tmp_path: Path) -> None:
    mod = zoo.small("densenet_block")
    path = zoo.write(mod, tmp_path / "densenet.relay")
    assert (tmp_path / "densenet.params.npz").is_file()
    assert load_module(path) == mod


@pytest.mark.parametrize("name", NAMES)
def test_small_model_builds_and_agrees_with_interpreter(
    built: dict[str, tuple[IRModule, CompiledModel]], name: str
) -> None:
    mod, model = built[name]
    assert_agrees(model, mod, seed=0)
    assert_agrees(model, mod, seed=1)
    report = model.memory_report()
    assert report.arena_bytes <= report.naive_bytes
    assert model.build_info["kernels"] == len({c.kernel for c in model.plan.calls})


def _activation_rms(mod: IRModule, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """Root mean square of the (first) output of every operator call while the interpreter runs `mod` on N(0, 1)
    inputs."""
    seen: list[tuple[str, float]] = []
    apply_op = Interpreter._apply_op

    def spy(self: Interpreter, call: Call, name: str, args: list[object]) -> object:
        out = apply_op(self, call, name, args)  # type: ignore[arg-type]
        first = np.asarray(out[0] if isinstance(out, tuple) else out)
        if first.dtype.kind == "f" and first.size > 1:
            seen.append((name, float(np.sqrt(np.mean(np.square(first, dtype=np.float64))))))
        return out

    monkeypatch.setattr(Interpreter, "_apply_op", spy)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(p.checked_type.shape).astype("float32") for p in mod.main.params]  # type: ignore[union-attr]
    Interpreter(mod).run(inputs)
    return seen


def _assert_order_one(seen: list[tuple[str, float]]) -> None:
    assert len(seen) > 5
    low, high = min(seen, key=lambda s: s[1]), max(seen, key=lambda s: s[1])
    # 1/sqrt(seq) is a softmax row's RMS; 20 leaves room for logits, never for a blow-up through depth
    assert low[1] > 0.01 and high[1] < 20, (low, high)


@pytest.mark.parametrize("name", NAMES)
def test_small_model_activations_stay_order_one(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_order_one(_activation_rms(zoo.small(name), monkeypatch))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in NAMES])
def test_full_model_activations_stay_order_one(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the real depth and width too: batch-norm statistics follow the activations that reach them."""
    _assert_order_one(_activation_rms(zoo.full(name), monkeypatch))


# ---------------------------------------------------------------------------------------------------------------
# real sizes: signatures and parameter counts
# ---------------------------------------------------------------------------------------------------------------

IMAGE = TensorType((1, 3, 224, 224))
CLASSES = TensorType((1, 1000))
FULL = {
    # name: (inputs, output, learned parameters as the reference implementations count them)
    "resnet18": ((IMAGE,), CLASSES, 11_689_512),
    "resnet50": ((IMAGE,), CLASSES, 25_557_032),
    "mobilenet_v1": ((IMAGE,), CLASSES, 4_231_976),
    "mobilenet_v2": ((IMAGE,), CLASSES, 3_504_872),
    "squeezenet1_1": ((IMAGE,), CLASSES, 1_235_496),
    "inception_block": ((TensorType((1, 192, 35, 35)),), TensorType((1, 256, 35, 35)), 255_904),
    "densenet_block": ((TensorType((1, 64, 56, 56)),), TensorType((1, 128, 28, 28)), 368_320),
    "lstm": ((TensorType((10, 1, 512)),), TensorType((10, 1, 512)), 2_099_200),
    "dcgan": ((TensorType((1, 100, 1, 1)),), TensorType((1, 3, 64, 64)), 3_576_704),
    "bert_layer": ((TensorType((1, 128, 768)),), TensorType((1, 128, 768)), 7_087_872),
}


def learned_parameters(mod: IRModule) -> int:
    """Weights, biases and batch-norm scales and shifts; not the running statistics (not learned)."""
    statistics = {
        id(arg) for node in post_order(mod.main) if isinstance(node, Call) and node.op_name == "nn.batch_norm"
        for arg in node.args[3:]
    }
    return sum(
        node.data.size for node in post_order(mod.main)
        if isinstance(node, Constant) and node.data.ndim > 0 and id(node) not in statistics
    )


@pytest.mark.parametrize("name", NAMES)
def test_full_model_signature_and_parameter_count(name: str) -> None:
    inputs, output, parameters = FULL[name]
    mod = zoo.full(name)
    assert mod.main.checked_type == FuncType(inputs, output)
    assert learned_parameters(mod) == parameters


# ---------------------------------------------------------------------------------------------------------------
# built models: memory plan, save and load
# ---------------------------------------------------------------------------------------------------------------


def test_mobilenet_memory_plan_and_save_load(built: dict[str, tuple[IRModule, CompiledModel]], tmp_path: Path) -> None:
    _mod, model = built["mobilenet_v2"]
    report = model.memory_report()
    # Intermediates of a deep chain reuse a few slots: far below one buffer per tensor.
    assert report.intermediate_tensors > 40
    assert report.arena_bytes < 0.3 * report.naive_bytes
    assert report.arena_bytes >= report.lower_bound_bytes

    path = model.save(tmp_path / "mobilenet.rtmod")
    loaded = relay_tune.runtime.load(path)  # links the saved object code (test_runtime_model: without compiling)
    inputs = model.random_inputs(3)
    np.testing.assert_array_equal(loaded.run(**inputs), model.run(**inputs))  # type: ignore[arg-type]
    assert loaded.plan == model.plan


@pytest.mark.slow
def test_full_resnet50_compiles_and_agrees_with_interpreter() -> None:
    mod = zoo.full("resnet50")
    model = relay_tune.build(mod)
    assert_agrees(model, mod)
    report = model.memory_report()
    assert report.arena_bytes < 0.25 * report.naive_bytes
