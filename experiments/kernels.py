"""Default (untuned) kernels against numpy: dense, batch_matmul, conv2d and depthwise conv2d, GFLOPS.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m experiments kernels [--rounds 5] [--only conv]

Every workload is a relay call wrapped in a primitive function and built through the whole path
(compute -> default schedule -> loop nest -> LLVM), exactly as a model build does. Baselines, measured in
the same run and alternating with our kernels: numpy's matmul (OpenBLAS) for dense and batch_matmul, and
im2col + numpy matmul for the convolutions (the im2col copy is part of the baseline, as it would be in a
framework that convolves that way). Both run single-core and on all cores: threadpoolctl limits numpy's
BLAS threads, the target's core count limits ours. Both are timed in interleaved rounds
(`experiments.timing`), each sample at least `--min-ms` long; each figure is the median. Packed weights are
prepared once, outside the timing, as a model runtime does for constants. Every kernel's result is checked against
the baseline's first.

OpenBLAS worker threads spin for a while after each call and would steal cycles from the next measurement, so
each engine waits for an idle process before its turn (`--settle`). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the
environment can make numpy pick a slower kernel: unset them for a fair baseline (as above).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from experiments import UsageError
from experiments.timing import TimedCallable, interleaved
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
    # the CRNN's classifier (ddddocr): 32 time steps by a 33 MB weight of 8210 = 2 x 5 x 821 columns
    Workload("dense 32x1024x8210 (CRNN classifier)", "dense", "nn.dense", ((32, 1024), (8210, 1024)), {},
             2.0 * 32 * 1024 * 8210, matmul_baseline),
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


def calls_per_sample(call: Callable[[], object], min_seconds: float) -> int:
    """How many back-to-back calls last at least `min_seconds` (after one warm-up call)."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, math.ceil(min_seconds / once))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="at most this many seconds to wait for an idle process before each engine's turn")
    parser.add_argument("--min-ms", type=float, default=100.0, help="minimum duration of one timed sample")
    parser.add_argument("--only", default="", help="run the workloads whose name contains this text")


def run(args: argparse.Namespace) -> int:
    workloads = [w for w in WORKLOADS if args.only in w.name]
    if not workloads:
        raise UsageError(f"no workload name contains {args.only!r}; names: {', '.join(w.name for w in WORKLOADS)}")
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            print(f"warning: {name}={os.environ[name]} is set; numpy may run a slower BLAS kernel. For a fair "
                  f"baseline run: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m experiments kernels")
    host = Target.host()
    print(f"target: llvm -mcpu={host.mcpu} ({host.vector_lanes()} float32 lanes), {host.num_cores} cores")
    for info in threadpool_info():
        if info.get("user_api") == "blas":
            print(f"numpy BLAS: {info.get('internal_api')} {info.get('version')}, kernel {info.get('architecture')}, "
                  f"{info.get('num_threads')} threads")
    rows = [row for workload in workloads for row in bench_workload(workload, host, args)]
    print(f"\ndefault schedules, float32 GFLOPS (median of {args.rounds} interleaved rounds); baseline: numpy "
          f"matmul (dense, batch_matmul) or im2col + numpy matmul (convolutions)")
    print(f"{'workload':52s} {'cores':>5} {'relay-tune':>11} {'numpy':>9} {'ratio':>6} {'compile':>8}")
    for name, threads, ours, base, compile_seconds in rows:
        print(f"{name:52s} {threads:>5} {ours:11.1f} {base:9.1f} {ours / base:6.2f} {compile_seconds * 1e3:6.0f}ms")
    return 0


def bench_workload(workload: Workload, host: Target, args: argparse.Namespace
                   ) -> list[tuple[str, int, float, float, float]]:
    """(name, threads, our GFLOPS, numpy's GFLOPS, compile seconds) on one core and on all of them."""
    rng = np.random.default_rng(0)
    func = primitive(workload)
    inputs = [rng.uniform(-1, 1, s).astype("float32") for s in workload.shapes]
    baseline = workload.baseline(inputs)
    rows = []
    for threads in sorted({1, host.num_cores}):
        start = time.perf_counter()
        built = build_primitive(func, host.with_cores(threads))
        compile_seconds = time.perf_counter() - start
        expected = np.asarray(built(*inputs))
        error = float(np.abs(expected - np.asarray(baseline()).reshape(expected.shape)).max())
        if error >= 1e-3 * math.sqrt(workload.flops / expected.size):
            raise AssertionError(f"{workload.name}: wrong result (largest error {error})")
        outputs = [np.empty(s, d) for s, d in zip(built.packing.output_shapes, built.packing.output_dtypes)]
        # packs weights once; `packed` holds bare addresses, so the arrays must outlive every call (a freed 33 MB
        # packed weight is unmapped at once)
        arguments = built.packing.kernel_arguments(inputs, outputs)
        packed = built.kernel.pack(arguments)

        def ours(kernel: object = built.kernel, packed: object = packed, arguments: object = arguments) -> None:
            kernel.repeat(packed, 1)  # type: ignore[attr-defined]

        with threadpool_limits(limits=threads, user_api="blas"):
            engines = {name: TimedCallable(call, calls_per_sample(call, args.min_ms / 1000.0))
                       for name, call in (("ours", ours), ("numpy", baseline))}
            samples = interleaved(engines, rounds=args.rounds, repeat=1, settle_s=args.settle)
        gflops = {name: workload.flops / s.median / 1e9 for name, s in samples.items()}
        rows.append((workload.name, threads, gflops["ours"], gflops["numpy"], compile_seconds))
        print(f"  {workload.name:52s} {threads} core(s): {gflops['ours']:7.1f} GFLOPS "
              f"(±{100 * samples['ours'].spread / 2:.1f}%) vs numpy {gflops['numpy']:7.1f} "
              f"(±{100 * samples['numpy'].spread / 2:.1f}%)  ratio {gflops['ours'] / gflops['numpy']:5.2f}", flush=True)
    return rows
