"""How fast are the default (untuned) kernels? Dense, batch_matmul, conv2d and depthwise conv2d against numpy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python experiments/bench_ops.py [--rounds 5] [--only conv]

Every workload is a relay call wrapped in a primitive function and built through the whole path
(compute -> default schedule -> loop nest -> LLVM), exactly as a model build does. Baselines, measured in
the same run and alternating with our kernels: numpy's matmul (OpenBLAS) for dense and batch_matmul, and
im2col + numpy matmul for the convolutions (the im2col copy is part of the baseline, as it would be in a
framework that convolves that way). Both run single-core and on all cores: threadpoolctl limits numpy's
BLAS threads, the target's core count limits ours. Each figure is the median over rounds; packed weights
are prepared once, outside the timing, as a model runtime does for constants.

OpenBLAS worker threads spin for a while after each call and would steal cycles from the next
measurement, so the script pauses between the two libraries. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the
environment can make numpy pick a slower kernel: unset them for a fair baseline (as above).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from relay_tune.codegen.jit import time_kernel
from relay_tune.compile.primitive import build_primitive
from relay_tune.ir import Call, Function, IRModule, TensorType, Var, op
from relay_tune.op.registry import get_op
from relay_tune.target import Target
from relay_tune.type_infer import infer_types


@dataclass
class Workload:
    name: str
    group: str  # dense | batch_matmul | conv | depthwise
    op_name: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: dict[str, object]
    flops: float
    baseline: Callable[[list[np.ndarray]], Callable[[], object]]  # inputs -> a closure computing the result


def matmul_baseline(inputs: list[np.ndarray]) -> Callable[[], object]:
    a, w = inputs
    out = np.empty((a.shape[0], w.shape[0]), a.dtype)
    wt = w.T
    return lambda: np.matmul(a, wt, out=out)


def batch_matmul_baseline(inputs: list[np.ndarray]) -> Callable[[], object]:
    x, y = inputs
    yt = y.transpose(0, 2, 1)
    out = np.empty((x.shape[0], x.shape[1], y.shape[1]), x.dtype)
    return lambda: np.matmul(x, yt, out=out)


def im2col_baseline(stride: int, pad: int, groups: int) -> Callable[[list[np.ndarray]], Callable[[], object]]:
    """im2col (a strided window view gathered into columns) then one (batched) BLAS matmul."""

    def make(inputs: list[np.ndarray]) -> Callable[[], object]:
        data, weight = inputs
        n, c, h, w = data.shape
        o, cg, kh, kw = weight.shape
        oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
        padded = np.zeros((n, c, h + 2 * pad, w + 2 * pad), data.dtype)
        kernel = weight.reshape(groups, o // groups, cg * kh * kw)

        def run() -> np.ndarray:
            padded[:, :, pad:pad + h, pad:pad + w] = data
            windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(2, 3))
            windows = windows[:, :, ::stride, ::stride][:, :, :oh, :ow]  # (n, c, oh, ow, kh, kw)
            cols = windows.reshape(n, groups, cg, oh * ow, kh * kw).transpose(0, 1, 3, 2, 4)
            cols = np.ascontiguousarray(cols).reshape(n, groups, oh * ow, cg * kh * kw)
            return np.matmul(kernel, cols.transpose(0, 1, 3, 2))  # (n, groups, o/groups, pixels)

        return run

    return make


def conv(name: str, c: int, hw: int, o: int, k: int, stride: int = 1, pad: int = 0, groups: int = 1) -> Workload:
    out = (hw + 2 * pad - k) // stride + 1
    flops = 2.0 * o * out * out * (c // groups) * k * k
    return Workload(name, "depthwise" if groups > 1 else "conv", "nn.conv2d",
                    ((1, c, hw, hw), (o, c // groups, k, k)),
                    {"strides": (stride, stride), "padding": (pad, pad), "groups": groups}, flops,
                    im2col_baseline(stride, pad, groups))


WORKLOADS = [
    Workload("dense 1024x1024x1024", "dense", "nn.dense", ((1024, 1024), (1024, 1024)), {}, 2.0 * 1024**3,
             matmul_baseline),
    Workload("batch_matmul 12x128x64 . 12x128x64^T (GPT-2 q.k)", "batch_matmul", "nn.batch_matmul",
             ((12, 128, 64), (12, 128, 64)), {"transpose_b": True}, 2.0 * 12 * 128 * 128 * 64,
             batch_matmul_baseline),
    conv("conv2d 1x64x56x56 3x3 -> 64", 64, 56, 64, 3, pad=1),
    conv("conv2d 1x256x56x56 1x1 -> 64", 256, 56, 64, 1),
    conv("conv2d 1x512x28x28 1x1 -> 128", 512, 28, 128, 1),
    conv("conv2d 1x128x28x28 3x3 -> 128", 128, 28, 128, 3, pad=1),
    conv("conv2d 1x256x14x14 3x3 -> 256", 256, 14, 256, 3, pad=1),
    conv("conv2d 1x512x7x7 3x3 -> 512", 512, 7, 512, 3, pad=1),
    conv("conv2d 1x3x224x224 7x7 s2 -> 64", 3, 224, 64, 7, stride=2, pad=3),
    conv("depthwise 1x144x56x56 3x3", 144, 56, 144, 3, pad=1, groups=144),
    conv("depthwise 1x144x56x56 3x3 s2", 144, 56, 144, 3, stride=2, pad=1, groups=144),
    conv("depthwise 1x960x7x7 3x3", 960, 7, 960, 3, pad=1, groups=960),
]


def primitive(workload: Workload) -> Function:
    params = tuple(Var(f"p{i}", TensorType(s, "float32")) for i, s in enumerate(workload.shapes))
    body = Call(op(workload.op_name), params, get_op(workload.op_name).make_attrs(workload.attrs))
    return infer_types(IRModule({"main": Function(params, body)}))["main"].with_attrs(Primitive=1)


def time_numpy(fn: Callable[[], object], threads: int, min_seconds: float, repeat: int) -> float:
    with threadpool_limits(limits=threads, user_api="blas"):
        fn()  # warm-up (thread start, page faults)
        number = 1
        while True:
            start = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
            number = max(number + 1, min(number * 10, math.ceil(number * min_seconds / max(elapsed, 1e-9) * 1.2)))
        costs = [elapsed / number]
        for _ in range(repeat - 1):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            costs.append((time.perf_counter() - start) / number)
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="alternating measurement rounds")
    parser.add_argument("--settle", type=float, default=0.2, help="seconds to pause between libraries")
    parser.add_argument("--min-ms", type=float, default=100.0, help="minimum duration of one timing repeat")
    parser.add_argument("--only", default="", help="run workloads whose name contains this text")
    args = parser.parse_args()

    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            print(f"warning: {name}={os.environ[name]} is set; numpy may run a slower BLAS kernel. For a fair "
                  f"baseline run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python {__file__}")
    host = Target.host()
    cores = host.num_cores
    print(f"target: llvm -mcpu={host.mcpu} ({host.vector_lanes()} float32 lanes), {cores} cores")
    for info in threadpool_info():
        if info.get("user_api") == "blas":
            print(f"numpy BLAS: {info.get('internal_api')} {info.get('version')}, kernel {info.get('architecture')}, "
                  f"{info.get('num_threads')} threads")
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")

    rng = np.random.default_rng(0)
    thread_counts = sorted({1, cores})
    rows = []
    for workload in WORKLOADS:
        if args.only and args.only not in workload.name:
            continue
        func = primitive(workload)
        inputs = [rng.uniform(-1, 1, s).astype("float32") for s in workload.shapes]
        kernels = {}
        compile_seconds = 0.0
        for threads in thread_counts:
            start = time.perf_counter()
            kernels[threads] = build_primitive(func, host.with_cores(threads))
            compile_seconds = time.perf_counter() - start
        expected = np.asarray(kernels[thread_counts[0]](*inputs))
        baseline = workload.baseline(inputs)
        reference = np.asarray(baseline()).reshape(expected.shape)
        error = float(np.abs(expected - reference).max())
        assert error < 1e-3 * math.sqrt(workload.flops / expected.size), f"{workload.name}: wrong result ({error})"
        prepared = {}
        for threads, kernel in kernels.items():
            outputs = [np.empty(s, d) for s, d in zip(kernel.packing.output_shapes, kernel.packing.output_dtypes)]
            prepared[threads] = (kernel, kernel.packing.kernel_arguments(inputs, outputs))  # packs weights once
        results: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for threads in thread_counts:
                kernel, kernel_args = prepared[threads]
                time.sleep(args.settle)
                cost = statistics.median(time_kernel(kernel.kernel, kernel_args, number=1, repeat=3,
                                                     min_repeat_ms=args.min_ms))
                results.setdefault(("ours", threads), []).append(cost)
                time.sleep(args.settle)
                cost = time_numpy(baseline, threads, args.min_ms / 1000.0, repeat=3)
                results.setdefault(("numpy", threads), []).append(cost)
        for threads in thread_counts:
            ours = workload.flops / statistics.median(results[("ours", threads)]) / 1e9
            base = workload.flops / statistics.median(results[("numpy", threads)]) / 1e9
            rows.append((workload.name, threads, ours, base, compile_seconds))
            print(f"  {workload.name:52s} {threads} core(s): {ours:7.1f} GFLOPS vs numpy {base:7.1f}  "
                  f"ratio {ours / base:5.2f}", flush=True)

    print(f"\ndefault schedules, float32 GFLOPS (median of {args.rounds} rounds); baseline: numpy matmul "
          f"(dense, batch_matmul) or im2col + numpy matmul (convolutions)")
    print(f"{'workload':52s} {'cores':>5} {'relay-tune':>11} {'numpy':>9} {'ratio':>6} {'compile':>8}")
    for name, threads, ours, base, compile_seconds in rows:
        print(f"{name:52s} {threads:>5} {ours:11.1f} {base:9.1f} {ours / base:6.2f} {compile_seconds * 1e3:6.0f}ms")
    print(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
