"""The GPU runtime: clear errors without a GPU, whole models through `relay_tune.build(target="cuda")` on the
emulated device, GPU tuning tasks, and (only where a CUDA GPU is present) real launches against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Function, IRModule, TensorType, Var, op
from relay_tune.op.registry import get_op
from relay_tune.runtime import cuda as cuda_runtime
from relay_tune.runtime.cuda import CudaUnavailableError, EmulatedDevice, GPUModel, cuda_available
from relay_tune.target import Target
from relay_tune.tuning.cuda_runner import CudaRunner
from relay_tune.tuning.gpu_task import GPUTask, gpu_tasks
from relay_tune.type_infer import infer_types
from search_space.decode import config_to_steps

GPU_MISSING = cuda_available()
needs_gpu = pytest.mark.skipif(GPU_MISSING is not None, reason=f"no CUDA GPU: {GPU_MISSING}")
RNG = np.random.default_rng(11)


def call(name: str, *args: object, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))  # type: ignore[arg-type]


def small_mlp() -> tuple[IRModule, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """dense + bias + relu, dense, softmax: three kernels of three families, weights bound as constants."""
    x = Var("x", TensorType((4, 32), "float32"))
    w1 = Var("w1", TensorType((64, 32), "float32"))
    b1 = Var("b1", TensorType((64,), "float32"))
    w2 = Var("w2", TensorType((16, 64), "float32"))
    hidden = call("nn.relu", call("nn.bias_add", call("nn.dense", x, w1), b1))
    body = call("nn.softmax", call("nn.dense", hidden, w2))
    mod = infer_types(IRModule({"main": Function((x, w1, b1, w2), body)}))
    params = {"w1": RNG.standard_normal((64, 32)).astype("float32") * 0.2,
              "b1": RNG.standard_normal(64).astype("float32"),
              "w2": RNG.standard_normal((16, 64)).astype("float32") * 0.2}
    inputs = {"x": RNG.standard_normal((4, 32)).astype("float32")}
    return mod, params, inputs


@pytest.fixture
def emulated_gpu(monkeypatch: pytest.MonkeyPatch) -> EmulatedDevice:
    device = EmulatedDevice()
    monkeypatch.setattr(cuda_runtime.driver, "cuda_device", lambda ordinal=0: device)
    return device


# ---------------------------------------------------------------------------------------------------
# without a GPU
# ---------------------------------------------------------------------------------------------------


@pytest.mark.skipif(GPU_MISSING is None, reason="a CUDA GPU is present")
def test_no_gpu_is_one_clear_error() -> None:
    with pytest.raises(CudaUnavailableError) as info:
        cuda_runtime.cuda_device()
    message = str(info.value)
    assert "GPU" in message or "cuda-python" in message
    assert "\n" not in message and "Traceback" not in message
    assert isinstance(info.value, RelayTuneError)


@pytest.mark.skipif(GPU_MISSING is None, reason="a CUDA GPU is present")
def test_build_for_cuda_without_a_gpu_cross_compiles_and_running_needs_a_gpu() -> None:
    mod, params, inputs = small_mlp()
    model = relay_tune.build(mod, target="cuda", params=params)
    assert isinstance(model, cuda_runtime.PTXModel) and ".target sm_90" in model.module.ptx
    with pytest.raises(CudaUnavailableError, match="needs an NVIDIA GPU"):
        model.run(**inputs)


@pytest.mark.skipif(GPU_MISSING is None, reason="a CUDA GPU is present")
def test_cuda_runner_without_a_gpu_raises_unavailable() -> None:
    mod, _, _ = small_mlp()
    task = gpu_tasks(mod, check_ptxas=False)[0]
    artifact = task.build(task.default_config())
    with CudaRunner(startup_timeout=120) as runner, pytest.raises(CudaUnavailableError):
        runner.run(task, artifact)


# ---------------------------------------------------------------------------------------------------
# the emulated GPU: the whole runtime path without hardware
# ---------------------------------------------------------------------------------------------------


def test_build_for_cuda_runs_a_model_on_the_emulated_gpu(emulated_gpu: EmulatedDevice) -> None:
    mod, params, inputs = small_mlp()
    model = relay_tune.build(mod, target="cuda -arch=sm_90", params=params)
    assert isinstance(model, GPUModel)
    assert model.module.arch == "sm_90" and len(model.plan.calls) == 3
    got = model.run(**inputs)
    want = evaluate(mod, [inputs["x"], params["w1"], params["b1"], params["w2"]])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # inputs by position, and a second run reuses the buffers
    np.testing.assert_allclose(model.run(inputs["x"]), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(RelayTuneError, match="expected float32"):
        model.run(x=np.zeros((4, 31), "float32"))


def test_gpu_task_builds_ptx_artifacts_for_its_configs() -> None:
    mod, _, _ = small_mlp()
    tasks = gpu_tasks(mod)
    assert len(tasks) == 3
    dense = next(t for t in tasks if "dense" in t.description and "relu" in t.description)
    config = dense.default_config()
    assert dense.space.is_valid(config)
    artifact = dense.build(config)
    assert artifact.code.startswith(b"//") and b".entry" in artifact.code
    assert artifact.info["gpu_function"].kernels
    roles = [a.role for a in artifact.args]
    assert roles.count("output") == 1 and roles.count("input") == 3
    packed = [a for a in artifact.args if a.layout]
    assert packed and packed[0].layout[0].op == "transpose"
    # the build is deterministic and the task pickles (it travels to builder processes)
    import pickle

    clone = pickle.loads(pickle.dumps(dense))
    assert clone.build(config).code == artifact.code


def test_gpu_task_artifacts_compute_the_reference_on_the_emulated_gpu() -> None:
    from relay_tune.codegen.nvptx import PTXModule
    from relay_tune.tuning.task import apply_layout

    mod, _, _ = small_mlp()
    tasks = gpu_tasks(mod, check_ptxas=False)
    assert tasks
    for task in tasks:
        rng = np.random.default_rng(0)
        config = task.space.sample(rng)
        artifact = task.build(config)
        inputs = [rng.standard_normal(s.shape).astype(s.dtype) for s in task.input_specs()]
        want = task.reference(inputs)
        # rebuild the loop nests (artifacts carry PTX only) and run them on the emulated device
        from relay_tune.compile.primitive import lower_primitive
        primfunc, _ = lower_primitive(task.func, Target.parse(task.target), task.steps(config), name="kernel")
        from relay_tune.codegen.nvptx import build_ptx

        module: PTXModule = build_ptx([primfunc], task.target)
        device = EmulatedDevice()
        arrays = [apply_layout(inputs[a.index], a.layout) for a in artifact.args if a.role == "input"]
        (got,) = cuda_runtime.run_function(device, device.load(module), "kernel", arrays)
        np.testing.assert_allclose(got, want[0], rtol=1e-4, atol=1e-4, err_msg=task.description)


def test_tuning_logs_for_cuda_become_gpu_schedules() -> None:
    mod, _, _ = small_mlp()
    task = gpu_tasks(mod)[0]
    steps = config_to_steps(task.func, task.default_config().to_dict(), Target.parse(task.target))
    assert any(getattr(s, "KIND", "") == "bind" for s in steps)


# ---------------------------------------------------------------------------------------------------
# a real GPU (skipped here)
# ---------------------------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.gpu
def test_model_on_the_gpu_matches_the_interpreter() -> None:
    mod, params, inputs = small_mlp()
    model = relay_tune.build(mod, target="cuda", params=params)
    want = evaluate(mod, [inputs["x"], params["w1"], params["b1"], params["w2"]])
    np.testing.assert_allclose(model.run(**inputs), want, rtol=1e-4, atol=1e-5)
    assert min(model.benchmark(repeat=3, number=3)) > 0


@needs_gpu
@pytest.mark.gpu
def test_cuda_runner_measures_a_gpu_task() -> None:
    mod, _, _ = small_mlp()
    task = gpu_tasks(mod)[0]
    with CudaRunner() as runner:
        result = runner.run(task, task.build(task.default_config()))
    assert result.error_kind is None, result.error_msg
    assert result.costs and min(result.costs) > 0


def test_gpu_task_is_a_tune_task() -> None:
    from relay_tune.tuning.task import TuneTask

    mod, _, _ = small_mlp()
    assert isinstance(gpu_tasks(mod)[0], TuneTask)
    assert isinstance(GPUTask, type)


def _random_inputs(mod: IRModule, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.name_hint: rng.standard_normal(tuple(int(d) for d in p.checked_type.shape)).astype(
        p.checked_type.dtype) for p in mod["main"].params}


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "squeezenet1_1", "inception_block", "densenet_block",
                                  "lstm", "dcgan", "bert_layer"])
def test_zoo_models_on_the_gpu_match_the_interpreter(name: str) -> None:
    """Every family's default GPU schedule, inside whole models at test size, against the interpreter."""
    from relay_tune.testing import zoo

    mod = zoo.small(name)
    model = relay_tune.build(mod, target="cuda")
    inputs = _random_inputs(mod, 3)
    want = evaluate(mod, inputs)
    got = model.run(**inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        w = np.asarray(w)
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * max(1.0, float(np.max(np.abs(w)))))


@needs_gpu
@pytest.mark.gpu
def test_gpu_model_file_runs_again_on_the_gpu(tmp_path: object) -> None:
    from pathlib import Path

    from relay_tune.runtime.cuda import load_gpu_model

    mod, params, inputs = small_mlp()
    model = relay_tune.build(mod, target="cuda", params=params)
    path = model.save(Path(str(tmp_path)) / "mlp.rtmod")
    again = load_gpu_model(path)
    np.testing.assert_array_equal(again.run(**inputs), model.run(**inputs))


@needs_gpu
@pytest.mark.gpu
def test_cuda_runner_rejects_a_wrong_result() -> None:
    """A kernel whose output disagrees with the reference is a failed measurement, never a winner."""
    from relay_tune.records.measure import ErrorKind

    mod, _, _ = small_mlp()
    task = gpu_tasks(mod)[0]
    artifact = task.build(task.default_config())
    with CudaRunner() as runner:
        runner._data_for(task)
        inputs, expected = runner._data[task.key]
        assert expected is not None
        runner._data[task.key] = (inputs, [e + 1.0 for e in expected])
        result = runner.run(task, artifact)
    assert result.error_kind is ErrorKind.WRONG_RESULT, result
