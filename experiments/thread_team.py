"""The native thread team against libgomp: the same builds run on each, timed interleaved, on an idle host and while
busy processes take the cores.

    python -m experiments thread-team [--models light_resnet50,light_densenet121,light_squeezenet]
                                      [--busy 0,2] [--threads 2] [--rounds 5] [--repeat 3] [--settle 0.2]
                                      [--onnxruntime] [--csv PATH]

Every workload is built once (default schedules, `--threads` cores) and loaded twice into this process: with
`threading_runtime="openmp"` (libgomp, `GOMP_SPINCOUNT` as relay-tune sets it) and `"native"`
(`relay_tune.codegen.thread_team`, same spin count). Workloads: the `--models` of `python -m experiments models`,
`pools` (three 5x5 stride-1 max pools on a 1x128x10x10 map, NCHW8c after layout planning), `conv1x1` (a 1x1
convolution 128 -> 128 channels on 10x10), and `region` (one tiny parallel kernel, 64 elements: what dispatching a
parallel region costs; timed as 1,000 regions back to back in generated code, reported per region). For each
`--busy` level N the script starts N processes that spin on the CPUs, waits a moment, times every workload's
engines in the same interleaved rounds (`experiments.timing`; each engine waits up to `--settle` seconds for the
process to go idle first), then stops them. Printed per level and workload: the load average (`/proc/loadavg`) when
the level began, each engine's median and spread, and native / openmp (below 1: the native team is faster), then the
geometric mean of those ratios per level.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.timing import Samples, TimedCallable, interleaved, write_rows

RUNTIMES = ("openmp", "native")
REGIONS_PER_CALL = 1000  # the `region` workload: parallel regions per timed call

# Relay text of the small workloads from the measurements that motivated the team.
_POOLS = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 128, 10, 10), float32]) {
  %0 = nn.max_pool2d(%x, pool_size=[5, 5], padding=[2, 2, 2, 2]);
  %1 = nn.max_pool2d(%0, pool_size=[5, 5], padding=[2, 2, 2, 2]);
  nn.max_pool2d(%1, pool_size=[5, 5], padding=[2, 2, 2, 2])
}
"""
_CONV1X1 = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 128, 10, 10), float32], %w: Tensor[(128, 128, 1, 1), float32]) {
  nn.conv2d(%x, %w, channels=128, kernel_size=[1, 1])
}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="light_resnet50,light_densenet121,light_squeezenet",
                        help="comma-separated networks of `python -m experiments models` ('' for none)")
    parser.add_argument("--busy", default="0,2",
                        help="busy processes spinning beside the engines, one timing level each (default 0,2)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per level (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per engine and round (default 3)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="seconds an engine waits at most for the process to go idle (default 0.2)")
    parser.add_argument("--onnxruntime", action="store_true", help="also time onnxruntime on the --models")
    parser.add_argument("--native-spins", default="",
                        help="more native engines, one per idle spin count (e.g. 0,100000): `native_spinN` runs the "
                             "same build with the team's workers spinning N pause iterations before they sleep")
    parser.add_argument("--csv", type=Path, help="write one row per level and workload to this CSV file")


def run(args: argparse.Namespace) -> int:
    try:
        levels = [int(n) for n in args.busy.split(",") if n.strip()]
    except ValueError as err:
        raise UsageError(f"--busy takes comma-separated counts of processes: {err}") from err
    if not levels or min(levels) < 0 or args.threads < 1 or args.rounds < 1 or args.repeat < 1:
        raise UsageError("--busy needs counts >= 0; --threads, --rounds and --repeat at least 1")
    try:
        spins = [int(n) for n in args.native_spins.split(",") if n.strip()]
    except ValueError as err:
        raise UsageError(f"--native-spins takes comma-separated spin counts: {err}") from err
    workloads = build_workloads([m for m in args.models.split(",") if m], args.threads, args.onnxruntime)
    if spins:
        workloads = {name: with_spins(workload, spins) for name, workload in workloads.items()}
    rows: list[dict[str, Any]] = []
    for busy in levels:
        with busy_processes(busy):
            time.sleep(0.5 if busy else 0.0)  # let the spinners take their cores
            load = Path("/proc/loadavg").read_text().split()[0]
            print(f"\n== {busy} busy processes, load average {load} (uptime), {args.threads} threads", flush=True)
            for name, (engines, inputs, scale) in workloads.items():
                timed = interleaved(engines, rounds=args.rounds, repeat=args.repeat, inputs=inputs,
                                    settle_s=args.settle)
                rows.append(report(name, busy, load, timed, scale))
        level = [row for row in rows if row["busy"] == busy]
        for key in [k for k in level[0] if k.endswith("_over_openmp")]:
            geomean = math.exp(sum(math.log(row[key]) for row in level) / len(level))
            print(f"   geometric mean {key.removesuffix('_over_openmp')} / openmp with {busy} busy: {geomean:.3f}")
    if args.csv is not None:
        columns = {key: "" for row in rows for key in row}  # engines differ between workloads
        write_rows(args.csv, [{**columns, **row} for row in rows])
    return 0


def report(name: str, busy: int, load: str, timed: dict[str, Samples], scale: float) -> dict[str, Any]:
    """Print one workload's line and return its CSV row: milliseconds per call, or with `scale` (calls per timed
    sample, the `region` workload) microseconds per region."""
    per_region = scale != 1
    unit, label_unit = (1e-6 * scale, "us") if per_region else (1e-3, "ms")
    row: dict[str, Any] = {"workload": name, "busy": busy, "loadavg": load}
    parts = []
    for label, samples in timed.items():
        row[f"{label}_{label_unit}"] = round(samples.median / unit, 4)
        parts.append(f"{label} {samples.describe(unit=unit, label=label_unit)}")
    ratios = []
    for label in timed:
        if label.startswith("native"):
            row[f"{label}_over_openmp"] = float(f"{timed[label].median / timed['openmp'].median:.4g}")
            ratios.append(f"{label}/openmp {row[f'{label}_over_openmp']:.4g}")
    per = " (per region)" if per_region else ""
    print(f"  {name}{per}: {', '.join(parts)}; {', '.join(ratios)}", flush=True)
    return row


class _Spinning:
    """An engine timed with the native team's workers spinning `spin` iterations when idle (set before its turn;
    the default is put back for the engines after it)."""

    def __init__(self, engine: Any, spin: int) -> None:
        self.engine, self.spin = engine, spin

    def _set(self, spin: int) -> None:
        from relay_tune.codegen.jit import native_thread_team

        native_thread_team().spin = spin

    def benchmark(self, repeat: int = 3, inputs: Any = None) -> Any:
        from relay_tune.codegen.jit import DEFAULT_GOMP_SPINCOUNT
        from relay_tune.codegen.thread_team import spin_count_from_environment

        self._set(self.spin)
        try:
            if hasattr(self.engine, "benchmark"):
                return self.engine.benchmark(repeat=repeat, inputs=inputs)
            return TimedCallable(self.engine).benchmark(repeat=repeat)
        finally:
            self._set(spin_count_from_environment(DEFAULT_GOMP_SPINCOUNT))


def with_spins(workload: Workload, spins: list[int]) -> Workload:
    """`workload` with one more native engine per spin count."""
    engines, inputs, scale = workload
    more = {f"native_spin{spin}": _Spinning(engines["native"], spin) for spin in spins}
    return {**engines, **more}, inputs, scale


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes that spin on the CPUs while the block runs."""
    context = multiprocessing.get_context("spawn")  # not forked: no copy of this process's thread teams
    spinners = [context.Process(target=_spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join()


Workload = tuple[dict[str, Any], dict[str, np.ndarray] | None, float]


def build_workloads(models: list[str], threads: int, with_onnxruntime: bool) -> dict[str, Workload]:
    """Per workload: its engines (one per runtime, plus onnxruntime where asked), the inputs they are timed on, and
    the calls per timed call."""
    from relay_tune.text import parse_module

    rng = np.random.default_rng(0)
    workloads: dict[str, Workload] = {"region": region_workload(threads)}
    workloads["pools"] = model_workload(parse_module(_POOLS), {}, threads)
    weight = rng.standard_normal((128, 128, 1, 1)).astype(np.float32)
    workloads["conv1x1"] = model_workload(parse_module(_CONV1X1), {"w": weight}, threads)
    if models:
        from experiments.models import ort_session, random_inputs
        from relay_tune.frontend import from_onnx
        from relay_tune.testing.onnx_light import LIGHT, light_model
        from relay_tune.testing.onnx_zoo import RELATIVES, SMALL, ZOO

        known: dict[str, Callable[[], Any]] = {**ZOO, **RELATIVES, **SMALL,
                                                **{f"light_{n}": (lambda n=n: light_model(n)) for n in LIGHT}}
        unknown = [m for m in models if m not in known]
        if unknown:
            raise UsageError(f"unknown network(s) {', '.join(unknown)}; choose from {', '.join(known)}")
        for name in models:
            onnx_model = known[name]()
            mod, _ = from_onnx(onnx_model)  # the weights are constants of `mod`
            engines, _, scale = model_workload(mod, {}, threads)
            inputs = random_inputs(onnx_model, 0)
            if with_onnxruntime:
                session = ort_session(onnx_model, threads)
                engines = {"onnxruntime": lambda s=session, i=inputs: s.run(None, i), **engines}
            workloads[name] = (engines, inputs, scale)
    return workloads


def model_workload(mod: Any, params: dict[str, Any], threads: int) -> Workload:
    """`mod` built once for `threads` cores and loaded on each runtime; checked to give the same outputs."""
    import relay_tune
    from relay_tune.runtime.vm import load_model
    from relay_tune.target import Target

    built = relay_tune.build(mod, target=Target.host(num_cores=threads), params=params or None)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.rtmod"
        built.save(path)
        engines = {runtime: load_model(path, threading_runtime=runtime) for runtime in RUNTIMES}
    inputs = built.random_inputs()
    outputs = [np.asarray(_first(engine.run(**inputs))) for engine in engines.values()]
    if not np.array_equal(outputs[0], outputs[1]):
        raise AssertionError("the model's outputs differ between the runtimes")
    return engines, inputs, 1.0


def _first(result: Any) -> Any:
    return result[0] if isinstance(result, (list, tuple)) else result


def region_workload(threads: int) -> Workload:
    """One parallel kernel of 64 elements, run `REGIONS_PER_CALL` times back to back in generated code per call."""
    from relay_tune.codegen.jit import load_object
    from relay_tune.codegen.llvm import compile_object
    from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Store
    from relay_tune.target import Target

    i = LoopVar("i")
    a, out = Buffer("a", (64,)), Buffer("out", (64,))
    func = PrimFunc("tiny_region", (a, out), For(i, 64, Store(out, (i,), a[i] * 2.0), ForKind.PARALLEL))
    obj = compile_object([func], Target.host(num_cores=max(2, threads)))
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    engines: dict[str, Any] = {}
    for runtime in RUNTIMES:
        kernel = load_object(obj, [func], threading_runtime=runtime).get(func.name)
        packed = kernel.pack([x, y])
        engines[runtime] = (lambda k=kernel, p=packed: k.repeat(p, REGIONS_PER_CALL))
    return engines, None, float(REGIONS_PER_CALL)

