"""How fast is generated code? The dense template's default kernel against numpy's BLAS, plus compile times.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python experiments/bench_codegen_dense.py [--size 1024]

The kernel is what relay-tune builds for an untuned `nn.dense` of two n x n matrices with a constant weight: the
dense template of `search_space.cpu` at its default config (weight packed into column panels two vectors wide once,
ahead of time; a register tile of up to 8 rows x 2 vectors; k unrolled 4x; parallel over the tiles when the target
has several cores). It is timed on one core and on all cores, alternating with numpy's matmul in the same process
(threadpoolctl limits the BLAS threads and reports which BLAS kernel runs). Each figure is the median over rounds.
Compile times are those of the same kernel and of the default ResNet-50 3x3 convolution kernel.

OpenBLAS worker threads spin for a while after each call and would steal cycles from the next
measurement, so the script pauses between the two libraries. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in
the environment can select a slower BLAS kernel: unset them for a fair baseline (as above).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from relay_tune.codegen.jit import time_kernel
from relay_tune.codegen.llvm import compile_object
from relay_tune.compile.primitive import build_primitive
from relay_tune.target import Target
from relay_tune.tuning.operator_tasks import dense, resnet50_conv3x3


def gflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9


def time_numpy(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int, number: int, repeat: int) -> float:
    with threadpool_limits(limits=threads, user_api="blas"):
        np.matmul(a, b, out=out)  # warm-up (thread start, page faults)
        costs = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                np.matmul(a, b, out=out)
            costs.append((time.perf_counter() - start) / number)
    return statistics.median(costs)


def median_compile_seconds(funcs: list, target: Target, times: int = 5) -> tuple[float, dict[str, float]]:
    totals, stages = [], {}
    for _ in range(times):
        stages = {}
        start = time.perf_counter()
        compile_object(funcs, target, timings=stages)
        totals.append(time.perf_counter() - start)
    return statistics.median(totals), stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024, help="M = N = K")
    parser.add_argument("--rounds", type=int, default=7, help="alternating measurement rounds")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds to pause between libraries")
    args = parser.parse_args()
    n = args.size
    flops = 2.0 * n**3

    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            print(f"warning: {name}={os.environ[name]} is set; numpy may run a slower BLAS kernel")
    host = Target.host()
    cores = host.num_cores
    print(f"target: llvm -mcpu={host.mcpu} ({host.vector_lanes()} float32 lanes), {cores} cores")
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for info in threadpool_info():
        if info.get("user_api") == "blas":
            print(f"numpy BLAS: {info.get('internal_api')} {info.get('version')}, kernel "
                  f"{info.get('architecture')}, {info.get('num_threads')} threads")

    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    out = np.zeros((n, n), np.float32)
    expected = np.zeros((n, n), np.float32)
    with threadpool_limits(limits=1, user_api="blas"):
        np.matmul(a, b, out=expected)

    # nn.dense computes x @ w.T: the weight is b transposed
    weight = np.ascontiguousarray(b.T)
    kernels = {}
    funcs = {}
    for threads in sorted({1, cores}):
        target = host.with_cores(threads)
        task = dense(n, n, n, target=str(target))
        print(f"{threads} core(s): default config {dict(task.default_config())}")
        compiled = build_primitive(task.func, target, task.steps(task.default_config()))
        arguments = compiled.packing.kernel_arguments([a, weight], [out], {1: compiled.packing.pack_input(1, weight)})
        kernels[threads] = (compiled.kernel, arguments)
        funcs[threads] = compiled.prim_func
        compiled.kernel(*arguments)
        error = float(np.abs(out - expected).max())
        assert error < 1e-2 * np.sqrt(n), f"generated matmul is wrong (max error {error})"
    number = max(1, int(0.2 / (flops / 100e9)))

    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for threads, (kernel, arguments) in kernels.items():
            time.sleep(args.settle)
            cost = statistics.median(time_kernel(kernel, arguments, number=number, repeat=3))
            results.setdefault(("relay-tune", threads), []).append(cost)
            time.sleep(args.settle)
            cost = time_numpy(a, b, out, threads, number, repeat=3)
            results.setdefault(("numpy", threads), []).append(cost)

    print(f"\nfp32 matmul {n}x{n}x{n}: GFLOPS, median of {args.rounds} rounds (min-max)")
    print(f"{'threads':>8} {'relay-tune':>22} {'numpy':>22}")
    for threads in kernels:
        cells = []
        for library in ("relay-tune", "numpy"):
            values = [gflops(flops, c) for c in results[(library, threads)]]
            cells.append(f"{statistics.median(values):7.1f} ({min(values):5.1f}-{max(values):5.1f})")
        print(f"{threads:>8} {cells[0]:>22} {cells[1]:>22}")

    print("\ncompile time (lower + parse + O3 + object code), median of 5:")
    conv = resnet50_conv3x3(target=str(host))
    conv_func = conv.lower(conv.default_config())
    for label, chosen in ((f"dense {n}^3", [funcs[cores]]), ("conv2d 1x64x56x56 -> 64, 3x3", [conv_func])):
        total, stages = median_compile_seconds(chosen, host)
        detail = ", ".join(f"{k[:-2]} {v * 1e3:.0f} ms" for k, v in stages.items())
        print(f"  {label}: {total * 1e3:.0f} ms ({detail})")
    print(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
