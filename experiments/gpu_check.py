"""One-shot check of the CUDA back end on a machine with an NVIDIA GPU; prints one table at the end.

    python -m experiments gpu-check [--trials 200] [--budget-s 470] [--skip-models] [--csv gpu_check.csv]

1. every registered operator, compiled with its default GPU schedule, run on the GPU and compared with the
   reference interpreter (the operator table of tests/test_codegen_nvptx.py);
2. the corpus ResNet-50, MobileNet v2 and GPT-2 MLP extract built with `relay_tune.build(target="cuda")`,
   compared with the interpreter on the same random inputs, and timed;
3. ResNet-50 v1 and MobileNet v2 imported from ONNX (`relay_tune.testing.onnx_zoo`, batch 1), built for the
   GPU, compared with onnxruntime's output, and their latency against onnxruntime's CUDA provider when it is
   installed and against torchvision's ResNet-50 / MobileNet v2 (cuDNN, fp32, TF32 off; same architectures, other
   random weights) when torch sees the GPU, timed in the same interleaved rounds (`experiments.timing`);
4. dense 4096x4096x4096 fp32 tuned through the tuning driver (GPUTask + CudaRunner), tuning throughput in trials
   per minute, its GFLOPS against torch (cuBLAS, TF32 off) in the same run, else cupy, else ours alone.

Every part is guarded: a failure becomes a row of the table, never the end of the check. Sections stop early
when the overall budget (default 470 s) runs short. Exit status 1 when a row failed (on a machine without an
NVIDIA GPU: the device row).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from experiments.timing import interleaved

REPO = Path(__file__).resolve().parent.parent

ROWS: list[tuple[str, str, str]] = []
START = time.monotonic()


def row(check: str, status: str, detail: str = "") -> None:
    ROWS.append((check, status, detail))
    print(f"[{time.monotonic() - START:6.1f}s] {status:5} {check}: {detail}", flush=True)


def left(budget: float) -> float:
    return budget - (time.monotonic() - START)


def short(err: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip().replace("\n", " ")
    return text[:300]


def print_table() -> None:
    width = max((len(c) for c, _, _ in ROWS), default=10)
    print("\n" + "=" * 100)
    print(f"{'check':<{width}}  {'result':<5}  detail")
    print("-" * 100)
    for check, status, detail in ROWS:
        print(f"{check:<{width}}  {status:<5}  {detail}")
    counts = {s: sum(1 for _, st, _ in ROWS if st == s) for s in ("PASS", "FAIL", "SKIP", "INFO")}
    print("-" * 100)
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"in {time.monotonic() - START:.0f} s")


# ---------------------------------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------------------------------


def check_device() -> Any:
    from relay_tune.codegen.nvptx import find_ptxas
    from relay_tune.runtime.cuda import cuda_device

    device = cuda_device()
    import llvmlite

    driver_version = device.drv.cuDriverGetVersion()[1]
    row("device", "INFO", f"{device.name} ({device.arch}), driver API {driver_version}; ptxas: "
        f"{find_ptxas() or 'not installed'}; llvmlite {llvmlite.__version__}, numpy {np.__version__}")
    return device


def load_op_table() -> Any:
    spec = importlib.util.spec_from_file_location("nvptx_cases", REPO / "tests" / "test_codegen_nvptx.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_operators(device: Any, budget: float) -> None:
    import re

    from relay_tune.codegen.nvptx import build_ptx
    from relay_tune.interpreter import evaluate
    from relay_tune.runtime.cuda import run_function

    try:
        cases = load_op_table()
    except Exception as err:
        row("operators", "SKIP", f"cannot load the operator table: {short(err)}")
        return
    passed, failed = 0, []
    arch_target = f"cuda -arch={device.arch}" if device.arch in _known_archs() else "cuda -arch=sm_90"
    for name in cases.OP_NAMES:
        if left(budget) < 200:
            failed.append(f"{name}: out of time")
            continue
        try:
            params, body = cases._op_case(name)
            func, mod = cases.primitive(params, body)
            kname = re.sub(r"\W", "_", name)
            primfunc, packing = cases.lower_gpu(func, kname)
            module = build_ptx([primfunc], arch_target)
            loaded = device.load(module)
            inputs = cases.inputs_for(func.params)
            want = evaluate(mod, inputs)
            wants = want if isinstance(want, tuple) else (want,)
            n_out = len(packing.output_shapes)
            args = packing.kernel_arguments(inputs, [np.empty(s, d) for s, d in zip(packing.output_shapes,
                                                                                    packing.output_dtypes)])
            got = run_function(device, loaded, kname, args[: len(args) - n_out])
            outs = [p for p in packing.params if p.role == "output"]
            for p, g in zip(outs, got):
                np.testing.assert_allclose(g, np.asarray(wants[p.index]), rtol=5e-4, atol=5e-4)
            passed += 1
        except Exception as err:
            failed.append(f"{name}: {short(err)[:160]}")
    status = "PASS" if not failed else "FAIL"
    row(f"operators vs interpreter ({passed + len(failed)})", status,
        f"{passed} agree" + (f"; failures: {' | '.join(failed[:6])}" if failed else ""))


def _known_archs() -> tuple[str, ...]:
    from relay_tune.codegen.nvptx import KNOWN_ARCHS

    return KNOWN_ARCHS


def corpus_dir() -> Path | None:
    for candidate in (os.environ.get("RELAY_TUNE_CORPUS", ""), REPO / "shared" / "relay_corpus",
                      REPO.parent / "shared" / "relay_corpus"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def check_models(device: Any, budget: float) -> None:
    import relay_tune
    from relay_tune.interpreter import evaluate
    from relay_tune.text import load_module
    from relay_tune.type_infer import infer_types

    root = corpus_dir()
    if root is None:
        row("models", "SKIP", "Relay corpus not found (set RELAY_TUNE_CORPUS)")
        return
    for stem, label in (("tvm_menagerie_resnet50", "ResNet-50"), ("tvm_menagerie_mobilenet", "MobileNet v2"),
                        ("tvm_menagerie_gpt2_extract", "GPT-2 MLP extract")):
        if left(budget) < 170:
            row(f"model {label}", "SKIP", "out of time")
            continue
        try:
            mod = infer_types(load_module(root / f"{stem}.relay"))
            t0 = time.perf_counter()
            model = relay_tune.build(mod, target=f"cuda -arch={device.arch}" if device.arch in _known_archs()
                                     else "cuda")
            build_s = time.perf_counter() - t0
            rng = np.random.default_rng(0)
            inputs = {}
            for p in mod["main"].params:
                ty = p.checked_type
                shape = tuple(int(d) for d in ty.shape)
                inputs[p.name_hint] = (rng.standard_normal(shape).astype(ty.dtype) if ty.dtype.startswith("float")
                                       else rng.integers(0, 4, shape).astype(ty.dtype))
            got = model.run(**inputs)
            want = evaluate(mod, [inputs[p.name_hint] for p in mod["main"].params])
            gots = got if isinstance(got, tuple) else (got,)
            wants = want if isinstance(want, tuple) else (want,)
            worst = 0.0
            for g, w in zip(gots, wants):
                w = np.asarray(w, dtype=np.float64)
                scale = max(1.0, float(np.max(np.abs(w))))
                worst = max(worst, float(np.max(np.abs(np.asarray(g, np.float64) - w))) / scale)
            latency = interleaved({"relay-tune": model}, rounds=5, repeat=5, inputs=inputs)["relay-tune"].median
            status = "PASS" if worst < 1e-3 else "FAIL"
            row(f"model {label}", status, f"max rel. error {worst:.2e}; {len(model.plan.calls)} calls; "
                f"{latency * 1e3:.2f} ms/inference (untuned); build {build_s:.1f} s")
        except Exception as err:
            row(f"model {label}", "FAIL", short(err))


def _torch_engine(name: str, shape: tuple[int, ...]) -> Callable[[], object] | None:
    """One batch-1 inference of torchvision's model of the same architecture on the GPU (cuDNN, fp32, TF32 off),
    synchronised, so that its wall time is the inference's; None without torch or a GPU torch sees."""
    try:
        import torch
        import torchvision
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    net = getattr(torchvision.models, name)(weights=None).eval().cuda()
    x = torch.randn(*shape, device="cuda")

    def infer() -> None:
        with torch.inference_mode():
            net(x)
        torch.cuda.synchronize()

    for _ in range(10):  # cuDNN picks its algorithms in the first calls
        infer()
    return infer


def _ort_cuda_engine(model: Any, inputs: dict[str, np.ndarray]) -> tuple[Callable[[], object] | None, str]:
    """One inference through onnxruntime's CUDA provider, or None and why not."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed"
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return None, f"onnxruntime has no CUDA provider here ({', '.join(providers)})"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    return (lambda: session.run(None, inputs)), "onnxruntime CUDA provider"


def check_onnx_models(device: Any, budget: float) -> None:
    try:
        import onnxruntime as ort

        import relay_tune
        from relay_tune.frontend import from_onnx
        from relay_tune.testing.onnx_zoo import ZOO
    except ImportError as err:
        row("ONNX models", "SKIP", f"needs onnx and onnxruntime: {short(err)}")
        return
    target = f"cuda -arch={device.arch}" if device.arch in _known_archs() else "cuda"
    for key, torch_name in (("resnet50", "resnet50"), ("mobilenet_v2", "mobilenet_v2")):
        if left(budget) < 150:
            row(f"ONNX {key}", "SKIP", "out of time")
            continue
        try:
            model_proto = ZOO[key]()
            mod, _ = from_onnx(model_proto)  # the initializers are the module's constants
            t0 = time.perf_counter()
            model = relay_tune.build(mod, target=target)
            build_s = time.perf_counter() - t0
            (input_info,) = model_proto.graph.input[:1]
            shape = tuple(d.dim_value for d in input_info.type.tensor_type.shape.dim)
            x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
            inputs = {input_info.name: x}
            want = ort.InferenceSession(model_proto.SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, inputs)[0]
            got = model.run(**inputs)
            got = got[0] if isinstance(got, tuple) else got
            scale = max(1.0, float(np.max(np.abs(want))))
            error = float(np.max(np.abs(np.asarray(got, np.float64) - want))) / scale
            engines: dict[str, Any] = {"relay-tune": model}
            ort_engine, ort_note = _ort_cuda_engine(model_proto, inputs)
            if ort_engine is not None:
                engines["onnxruntime-gpu"] = ort_engine
            torch_engine = _torch_engine(torch_name, shape)
            if torch_engine is not None:
                engines[f"torchvision {torch_name} (cuDNN)"] = torch_engine
            timed = interleaved(engines, rounds=7, repeat=10, inputs=inputs)
            ours = timed["relay-tune"].median * 1e3
            parts = [f"max rel. error {error:.2e} vs onnxruntime (CPU)", f"{len(model.plan.calls)} kernels",
                     f"relay-tune {ours:.3f} ms (untuned)", f"build {build_s:.1f} s"]
            if ort_engine is None:
                parts.append(ort_note)
            for name, samples in timed.items():
                if name != "relay-tune":
                    parts.append(f"{name} {samples.median * 1e3:.3f} ms, ratio {ours / (samples.median * 1e3):.2f}")
            row(f"ONNX {key} on the GPU", "PASS" if error < 1e-3 else "FAIL", "; ".join(parts))
        except Exception as err:
            row(f"ONNX {key} on the GPU", "FAIL", short(err))


def dense_task(size: int, arch: str) -> Any:
    from relay_tune.ir import Call, Function, IRModule, TensorType, Var, op
    from relay_tune.op.registry import get_op
    from relay_tune.passes.extract_tasks import extract_tasks
    from relay_tune.tuning.gpu_task import GPUTask
    from relay_tune.type_infer import infer_types

    a = Var("a", TensorType((size, size), "float32"))
    w = Var("w", TensorType((size, size), "float32"))
    body = Call(op("nn.dense"), (a, w), get_op("nn.dense").make_attrs({}))
    mod = infer_types(IRModule({"main": Function((a, w), body)}))
    from relay_tune.passes import optimize

    (spec,) = extract_tasks(optimize(mod))
    return GPUTask.from_spec(spec, f"cuda -arch={arch}")


def check_dense_tuning(device: Any, trials: int, budget: float, log_dir_arg: str | None = None) -> float | None:
    size = 4096
    flops = 2.0 * size**3
    arch = device.arch if device.arch in _known_archs() else "sm_90"
    try:
        task = dense_task(size, arch)
    except Exception as err:
        row("dense 4096^3 tuning", "FAIL", f"task: {short(err)}")
        return None
    best: float | None = None
    source = ""
    if left(budget) > 120:
        try:
            from relay_tune.tuning.builder import LocalBuilder
            from relay_tune.tuning.cuda_runner import CudaRunner
            from relay_tune.tuning.driver import tune

            # The log is the state: tuning in chunks of 40 trials resumes from it each time, so the section stops
            # between chunks when the overall budget runs short and still reports what was measured.
            tune_start = time.monotonic()
            log_dir = Path(log_dir_arg) if log_dir_arg else Path(tempfile.mkdtemp())
            log = log_dir / "dense4096.cuda.jsonl"
            result = None
            with LocalBuilder(n_parallel=min(8, os.cpu_count() or 1), timeout=60) as builder, \
                    CudaRunner(timeout=30, number=3, repeat=3, min_repeat_ms=10) as runner:
                done = 0
                while done < trials:
                    chunk_start = time.monotonic()
                    done = min(trials, done + 40)
                    summary = tune([task], done, log, storage=None, builder=builder, runner=runner, batch_size=8)
                    (result,) = summary.tasks
                    if left(budget) < 90 + 1.5 * (time.monotonic() - chunk_start):
                        break
            assert result is not None
            best = result.best_cost
            source = (f"{result.trials} trials ({result.valid_trials} valid), default "
                      f"{flops / result.default_cost / 1e9:.0f} GFLOPS" if result.default_cost else
                      f"{result.trials} trials ({result.valid_trials} valid)")
            if result.errors:
                source += f", errors {dict(result.errors)}"
            if result.best_config is not None:
                source += f", best {dict(result.best_config.to_dict())}"
            seconds = time.monotonic() - tune_start
            row("GPU tuning throughput", "INFO", f"{result.trials} trials in {seconds:.0f} s: "
                f"{result.trials / seconds * 60:.0f} trials/minute (builds on {min(8, os.cpu_count() or 1)} "
                f"processes; log {log.name})")
        except Exception as err:
            row("dense 4096^3 tuning (driver)", "FAIL", short(err))
    if best is None and left(budget) > 60:
        best, source = _direct_search(device, task, min(trials, 16), budget)
    if best is None:
        row("dense 4096^3 tuning", "FAIL", "no valid kernel measured")
        return None
    row("dense 4096^3 fp32 (relay-tune)", "PASS", f"{flops / best / 1e9:.0f} GFLOPS ({best * 1e3:.2f} ms); {source}")
    return flops / best / 1e9


def _direct_search(device: Any, task: Any, trials: int, budget: float) -> tuple[float | None, str]:
    """Fallback when the driver fails: default + random configs built and timed in this process."""
    from relay_tune.codegen.nvptx import PTXModule
    from relay_tune.runtime.cuda import time_function
    from relay_tune.tuning.task import apply_layout

    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s.shape).astype(s.dtype) for s in task.input_specs()]
    configs = [task.default_config()] + [task.space.sample(rng) for _ in range(trials - 1)]
    best: float | None = None
    for config in configs:
        if left(budget) < 40:
            break
        try:
            artifact = task.build(config)
            function = artifact.info["gpu_function"]
            loaded = device.load(PTXModule(artifact.code.decode(), artifact.info["arch"], (function,)))
            arrays = [apply_layout(inputs[a.index], a.layout) for a in artifact.args if a.role == "input"]
            cost = min(time_function(device, loaded, function.name, arrays, number=3, repeat=3))
            best = cost if best is None else min(best, cost)
        except Exception as err:
            print(f"  config failed: {short(err)}", flush=True)
    return best, f"direct search over {len(configs)} configs (no correctness check)"


def check_reference_blas(ours: float | None) -> None:
    size = 4096
    flops = 2.0 * size**3
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch without CUDA")
        torch.backends.cuda.matmul.allow_tf32 = False
        a = torch.randn(size, size, device="cuda", dtype=torch.float32)
        b = torch.randn(size, size, device="cuda", dtype=torch.float32)

        def product() -> None:
            torch.matmul(a, b)
            torch.cuda.synchronize()  # the wall time of a call is the product's (~0.01 ms of ~3 ms is the sync)

        seconds = interleaved({"cuBLAS": product}, rounds=4, repeat=5)["cuBLAS"].median
        gflops = flops / seconds / 1e9
        ratio = f"; relay-tune reaches {ours / gflops:.0%} of it" if ours else ""
        row("dense 4096^3 fp32 (torch/cuBLAS, TF32 off)", "INFO", f"{gflops:.0f} GFLOPS{ratio}")
        return
    except ImportError:
        pass
    except Exception as err:
        row("dense 4096^3 fp32 (torch)", "FAIL", short(err))
        return
    try:
        import cupy

        a = cupy.random.standard_normal((size, size), dtype=cupy.float32)
        b = cupy.random.standard_normal((size, size), dtype=cupy.float32)

        def cupy_product() -> None:
            a @ b
            cupy.cuda.Device().synchronize()

        seconds = interleaved({"cuBLAS": cupy_product}, rounds=4, repeat=5)["cuBLAS"].median
        gflops = flops / seconds / 1e9
        ratio = f"; relay-tune reaches {ours / gflops:.0%} of it" if ours else ""
        row("dense 4096^3 fp32 (cupy/cuBLAS)", "INFO", f"{gflops:.0f} GFLOPS{ratio}")
    except ImportError:
        row("dense 4096^3 fp32 (cuBLAS)", "SKIP", "neither torch nor cupy is installed: relay-tune's number only")
    except Exception as err:
        row("dense 4096^3 fp32 (cupy)", "FAIL", short(err))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=200, help="tuning trials for dense 4096^3 (default 200)")
    parser.add_argument("--budget-s", type=float, default=470.0, help="overall time budget in seconds")
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--log-dir", help="keep the dense tuning log in this folder (default: a temporary one)")
    parser.add_argument("--csv", type=Path, help="also write the table as CSV (check, result, detail)")


def run(args: argparse.Namespace) -> int:
    global START
    ROWS.clear()
    START = time.monotonic()
    try:
        try:
            device = check_device()
        except Exception as err:
            row("device", "FAIL", short(err))
            return 1
        for section in (lambda: check_operators(device, args.budget_s),
                        lambda: None if args.skip_models else check_models(device, args.budget_s),
                        lambda: None if args.skip_models else check_onnx_models(device, args.budget_s)):
            try:
                section()
            except Exception as err:
                row("section", "FAIL", short(err))
        ours = None
        try:
            ours = check_dense_tuning(device, args.trials, args.budget_s, args.log_dir)
        except Exception as err:
            row("dense 4096^3 tuning", "FAIL", short(err))
        check_reference_blas(ours)
    finally:
        print_table()
        if args.csv is not None:
            import csv

            with open(args.csv, "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["check", "result", "detail"])
                writer.writerows(ROWS)
    return 0 if not any(s == "FAIL" for _, s, _ in ROWS) else 1
