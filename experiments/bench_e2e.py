"""End-to-end latency: a model compiled by relay-tune against onnxruntime, same machine, same thread count.

(For the set of well-known networks built in-process, see `bench_onnx_e2e.py`; this script takes any ONNX file.)

    python experiments/bench_e2e.py MODEL.onnx [--log logs/model.jsonl ...] [--threads N] [--repeat 50]
    python experiments/bench_e2e.py --example small_cnn            # no download: built with onnx.helper

Both engines run in this process on the same seeded random inputs. relay-tune imports the model
(`relay_tune.frontend.from_onnx`), compiles it with `relay_tune.build` (default schedules, or the best
records of the given tuning logs), and its outputs are compared with onnxruntime's before any timing is
reported. Each engine is warmed up, then timed one inference at a time; the script prints median and
minimum latency of each and the ratio relay-tune / onnxruntime (below 1: relay-tune is faster).

Threads: onnxruntime gets `intra_op_num_threads=N` (one inter-op thread, sequential execution) and
relay-tune a host target with `num_cores=N`; N defaults to the cores this process may use.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@dataclass
class Timing:
    name: str
    setup_s: float
    samples_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)


def time_runs(fn: Callable[[], Any], warmup: int, repeat: int, min_total_s: float) -> list[float]:
    """Per-inference wall times (ms): `warmup` untimed runs, then at least `repeat` runs and `min_total_s` s."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < repeat or time.perf_counter() - started < min_total_s:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def random_inputs(mod: Any, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs for every parameter of `@main` (normal floats, small non-negative integers)."""
    from relay_tune.ir.types import TensorType

    rng = np.random.default_rng(seed)
    inputs = {}
    for param in mod["main"].params:
        ty = param.type_annotation
        if not isinstance(ty, TensorType) or not ty.is_static:
            raise SystemExit(f"input {param.name_hint} has type {ty}; give a static shape with --shape")
        shape = tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]
        if np.dtype(ty.dtype).kind == "f":
            inputs[param.name_hint] = rng.standard_normal(shape).astype(ty.dtype)
        elif ty.dtype == "bool":
            inputs[param.name_hint] = rng.random(shape) < 0.5
        else:
            inputs[param.name_hint] = rng.integers(0, 4, size=shape).astype(ty.dtype)
    return inputs


def as_list(result: Any) -> list[np.ndarray]:
    if isinstance(result, dict):
        return [np.asarray(v) for v in result.values()]
    if isinstance(result, (tuple, list)):
        return [np.asarray(v) for v in result]
    return [np.asarray(result)]


def compare(name: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float) -> bool:
    if len(got) != len(want):
        print(f"  {name}: {len(got)} outputs, onnxruntime has {len(want)}")
        return False
    ok = True
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            print(f"  {name} output {i}: shape {g.shape}, onnxruntime {w.shape}")
            ok = False
            continue
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        close = np.allclose(g, w, rtol=rtol, atol=atol)
        print(f"  {name} output {i} {tuple(g.shape)}: max abs diff {max_abs:.3g} -> {'match' if close else 'MISMATCH'}")
        ok = ok and close
    return ok


def onnxruntime_session(model_path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def relay_build(mod: Any, threads: int, logs: Sequence[str], target_text: str | None) -> Any:
    import relay_tune
    from relay_tune.target import Target

    build = getattr(relay_tune, "build", None)
    if build is None:
        raise SystemExit("relay_tune.build is not available in this checkout: cannot compile the model")
    target = Target.parse(target_text) if target_text else Target.host(num_cores=threads)
    return build(mod, target=target, logs=list(logs) or None)


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.rpartition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,..., got {text!r}")
    return name, tuple(int(d) for d in dims.split(","))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", type=Path, help="the ONNX model")
    parser.add_argument("--example", choices=("small_cnn", "mlp"), help="benchmark a built-in example model instead")
    parser.add_argument("--batch", type=int, default=1, help="batch size of --example models (default 1)")
    parser.add_argument("--image", type=int, default=32, help="image size of --example small_cnn (default 32)")
    parser.add_argument("--log", action="append", default=[], help="tuning log(s) to build from (default schedules "
                        "otherwise)")
    parser.add_argument("--target", help="relay-tune target string (default: this host with --threads cores)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for both engines (default: the cores available to this process)")
    parser.add_argument("--shape", action="append", default=[], type=parse_shape, metavar="NAME=D0,D1,...",
                        help="fix a graph input's shape (repeatable)")
    parser.add_argument("--repeat", type=int, default=30, help="timed inferences per engine (minimum)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=1.0, help="minimum seconds of timed runs per engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--interpreter", action="store_true",
                        help="also check the reference interpreter's outputs against onnxruntime")
    args = parser.parse_args(argv)

    import onnx

    from relay_tune.frontend import from_onnx

    if args.example:
        from experiments.onnx_models import MODELS

        model_path = Path(tempfile.mkdtemp(prefix="bench_e2e_")) / f"{args.example}.onnx"
        extra = {"image": args.image} if args.example == "small_cnn" else {}
        onnx.save(MODELS[args.example](batch=args.batch, **extra), str(model_path))
    elif args.model is not None:
        model_path = args.model
    else:
        parser.error("give an ONNX model or --example")

    schedules = "tuned from " + ", ".join(args.log) if args.log else "default schedules"
    print(f"model {model_path} | threads {args.threads} | {schedules}")
    t0 = time.perf_counter()
    mod, _params = from_onnx(model_path, shape_overrides=dict(args.shape))
    import_s = time.perf_counter() - t0
    inputs = random_inputs(mod, args.seed)
    print(f"imported in {import_s:.2f} s; inputs: "
          + ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in inputs.items()))

    t0 = time.perf_counter()
    session = onnxruntime_session(model_path, args.threads)
    ort_setup = time.perf_counter() - t0
    feed = {name: inputs[name] for name in (i.name for i in session.get_inputs())}
    expected = as_list(session.run(None, feed))

    t0 = time.perf_counter()
    compiled = relay_build(mod, args.threads, args.log, args.target)
    build_s = time.perf_counter() - t0
    got = as_list(compiled.run(**inputs))

    print("outputs:")
    ok = compare("relay-tune", got, expected, args.rtol, args.atol)
    if args.interpreter:
        from relay_tune.interpreter import evaluate

        ok = compare("interpreter", as_list(evaluate(mod, inputs)), expected, args.rtol, args.atol) and ok

    # Alternate the engines' timing blocks so drifting clocks or thermals do not favour either.
    ort_samples: list[float] = []
    relay_samples: list[float] = []
    for _ in range(2):
        ort_samples += time_runs(lambda: session.run(None, feed), args.warmup, args.repeat // 2, args.min_time / 2)
        relay_samples += time_runs(lambda: compiled.run(**inputs), args.warmup, args.repeat // 2, args.min_time / 2)
    timings = [Timing("onnxruntime", ort_setup, ort_samples), Timing("relay-tune", build_s, relay_samples)]

    print(f"\n{'engine':<12} {'setup s':>8} {'median ms':>10} {'min ms':>8} {'runs':>6}")
    for t in timings:
        print(f"{t.name:<12} {t.setup_s:>8.2f} {t.median_ms:>10.3f} {t.min_ms:>8.3f} {len(t.samples_ms):>6}")
    if hasattr(compiled, "benchmark"):
        # CompiledModel.benchmark: what run() does less the input checks, for reference (it should agree).
        stats = compiled.benchmark(repeat=max(args.repeat, 10), number=1, inputs=inputs)
        print(f"{'(benchmark)':<12} {'':>8} {stats.median * 1e3:>10.3f} {stats.min * 1e3:>8.3f} {len(stats.costs):>6}")
    ratio = timings[1].median_ms / timings[0].median_ms
    best_ratio = timings[1].min_ms / timings[0].min_ms
    print(f"\nrelay-tune / onnxruntime (median latency): {ratio:.2f}x "
          f"({'relay-tune faster' if ratio < 1 else 'onnxruntime faster'}); best-case (min) ratio {best_ratio:.2f}x")
    if os.getloadavg()[0] > len(os.sched_getaffinity(0)):
        print(f"note: load average {os.getloadavg()[0]:.1f} exceeds the {len(os.sched_getaffinity(0))} usable cores; "
              "multi-threaded medians are unreliable (the minimum is the better guide)")
    if not ok:
        print("WARNING: outputs differ beyond tolerance; the timings compare different computations")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
