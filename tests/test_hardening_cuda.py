"""CUDA without a GPU: cross-compiling to a model file of PTX (checked by ptxas when installed), running it says
a GPU is needed; the GPU runner is a `Runner` like the CPU one."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.nvptx import assemble_ptx, find_ptxas
from relay_tune.interpreter import evaluate
from relay_tune.runtime import cuda as cuda_runtime
from relay_tune.runtime.cuda import EmulatedDevice, PTXModel, cuda_available, read_gpu_model
from relay_tune.text import parse_module
from relay_tune.tuning.cuda_runner import CudaRunner
from relay_tune.tuning.runner import LocalRunner, Runner

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "relay_tune" / "examples" / "small_cnn.relay"
GPU_MISSING = cuda_available()
no_gpu_only = pytest.mark.skipif(GPU_MISSING is None, reason="a CUDA GPU is present")
CLI = "import sys; from relay_tune.cli import main; sys.exit(main())"
SMALL = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 16), float32], %w: Tensor[(8, 16), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.relu(%0);
  nn.softmax(%1, axis=1)
}
"""
RNG = np.random.default_rng(5)


def relay_tune_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_gpu_and_cpu_runners_share_the_runner_interface() -> None:
    with CudaRunner() as gpu, LocalRunner() as cpu:
        assert isinstance(gpu, Runner) and isinstance(cpu, Runner)


@no_gpu_only
@pytest.mark.parametrize("target", ["cuda", "cuda -arch=sm_80", "cuda -arch=sm_75", "cuda -arch=sm_90a"])
def test_cli_cross_compiles_for_cuda_and_run_says_a_gpu_is_needed(target: str, tmp_path: Path) -> None:
    out = tmp_path / "gpu.rtmod"
    build = relay_tune_cli("build", EXAMPLE, "--target", target, "-o", out, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    arch = target.split("=")[1] if "=" in target else "sm_90"
    assert f"to PTX for {arch}" in build.stdout and "Traceback" not in build.stderr
    with zipfile.ZipFile(out) as archive:
        ptx = archive.read("module.ptx").decode()
    assert f".target {arch}" in ptx and ".entry" in ptx
    if find_ptxas() is not None:
        assert "assembled by" in build.stdout
        report = assemble_ptx(ptx, arch)  # the file's PTX assembles (ptxas on PATH)
        assert len(report.kernels) == ptx.count(".entry")
    run = relay_tune_cli("run", out, cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.startswith("relay-tune: ") and "needs an NVIDIA GPU" in run.stderr
    assert "Traceback" not in run.stderr


def test_gpu_model_file_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A model built on the emulated GPU saves to the same file format; read back, PTX and launch plans are equal,
    and the model's outputs (on the emulator) match the reference interpreter."""
    device = EmulatedDevice()
    monkeypatch.setattr(cuda_runtime.driver, "cuda_device", lambda ordinal=0: device)
    monkeypatch.setattr(cuda_runtime.driver, "cuda_available", lambda: None)
    mod = parse_module(SMALL)  # small: the emulator runs every GPU thread in Python
    weights = RNG.standard_normal((8, 16), "float32")
    model = relay_tune.build(mod, target="cuda -arch=sm_80", params={"w": weights})
    assert isinstance(model, cuda_runtime.GPUModel)
    inputs = {"x": RNG.standard_normal((2, 16), "float32")}
    got = model.run(**inputs)
    expected = evaluate(mod, {**inputs, "w": weights})
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-4, atol=1e-5)
    path = model.save(tmp_path / "m.rtmod")
    back = read_gpu_model(path)
    assert isinstance(back, PTXModel)
    assert back.module.ptx == model.module.ptx and back.module.functions == model.module.functions
    assert back.plan.to_json() == model.plan.to_json() and str(back.target) == "cuda -arch=sm_80"
    assert all(np.array_equal(a, b) for a, b in zip(back.constants, model._host_constants))


def test_damaged_gpu_model_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.rtmod"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("manifest.json", '{"format": "relay-tune-gpu-model", "format_version": 1}')
    result = relay_tune_cli("run", path, cwd=tmp_path)
    assert result.returncode == 1 and "damaged GPU model file" in result.stderr and "Traceback" not in result.stderr
