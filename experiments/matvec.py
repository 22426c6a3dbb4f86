"""Dense layers at batch 1 (matrix-vector products) against the memory bandwidth of a STREAM triad, same run.

    python -m experiments matvec [--rounds 7] [--trials 24] [--only 4096x9216]

A matrix-vector product reads every weight once: its speed is the rate at which the weights stream from memory.
The bar is a STREAM triad `a = b + s * c` measured in the same run on arrays of `--triad-mib` MiB each (far larger
than the last-level cache), compiled by relay-tune's own code generator (the injective family's default schedule:
vectorized, parallel over every core), counted as STREAM counts it (12 bytes per element: two reads and one write of
float32; the write-allocate read of `a` is not counted) and valued, as STREAM does, at its best sample.

The workloads are AlexNet's classifier (fc6 4096x9216, fc7 4096x4096, fc8 1000x4096) and a transformer FFN at
batch 1 (768x3072), each `nn.dense(x[1, K], W[N, K])` with W a model constant, extracted as `relay-tune` extracts
a model's task. Engines, timed in interleaved rounds (`experiments.timing`):

- `default`: the untuned default schedule (`search_space.families.dense`: packed weight panels of
  `MATVEC_CHAINS` vectors, streamed front to back, half of them per core);
- `tiled`: the same at the tiled rule's panel width (two or three vectors: two accumulator chains), the rule a
  one-row dense had before the matrix-vector rule;
- `tuned`: the best config of a short tuning run of the task (`relay_tune.tuning.tune`, `--trials`; 0: skipped);
- `numpy`: `x @ W.T` (OpenBLAS sgemv), its threads limited to the target's cores.

Weights are cold, as in a model whose layers evict each other: every engine cycles through enough copies of its
weights (packed once, ahead of time, as a model build does) to fill `--cold-mib` MiB, so each call reads its
weights from memory even where one copy fits the cache. GB/s counts the weight bytes (N x K x 4) per call. Two
ratios to the triad: best sample to best sample (STREAM's measure), and paired: the median over rounds of each
round's ratio of medians (on a shared host the bandwidth moves with the neighbours' load, and a single best sample
can fall in a quiet moment that the other engine missed). Every kernel's result is checked against numpy's first.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from experiments import UsageError
from experiments.timing import Samples, TimedCallable, interleaved, write_rows
from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import CompiledPrimitive, build_primitive
from relay_tune.ir import Call, Function, IRModule, TensorType, Var, op
from relay_tune.target import Target
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types
from search_space.families.common import split_value
from search_space.families.dense import default_columns

SHAPES: dict[str, tuple[int, int]] = {
    "alexnet fc6 4096x9216": (4096, 9216),
    "alexnet fc7 4096x4096": (4096, 4096),
    "alexnet fc8 1000x4096": (1000, 4096),
    "transformer ffn 768x3072": (768, 3072),
}
"""Workload name -> (N output features, K input features) of `nn.dense` at batch 1."""

TRIAD_BYTES_PER_ELEMENT = 12  # STREAM's count for float32: read b, read c, write a


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--repeat", type=int, default=3, help="samples per engine and round (default 3)")
    parser.add_argument("--trials", type=int, default=24,
                        help="tuning trials per workload for the `tuned` engine (default 24; 0: no tuning)")
    parser.add_argument("--triad-mib", type=int, default=256, help="MiB of each triad array (default 256)")
    parser.add_argument("--cold-mib", type=int, default=256,
                        help="MiB of weight copies each engine cycles through (default 256)")
    parser.add_argument("--min-ms", type=float, default=20.0, help="minimum duration of one timed sample")
    parser.add_argument("--only", default="", help="run the workloads whose name contains this text")
    parser.add_argument("--cores", type=int, default=0, help="cores (default: all of the host's)")
    parser.add_argument("--csv", type=Path, default=None, help="write the table to this CSV file")


def triad_kernel(elements: int, target: Target) -> tuple[CompiledPrimitive, Callable[[], None], list[np.ndarray]]:
    """The triad `a = b + s * c` over `elements` float32, built by relay-tune (default schedule): the kernel, one
    call, and the arrays it keeps alive."""
    b = Var("p0", TensorType((elements,), "float32"))
    c = Var("p1", TensorType((elements,), "float32"))
    s = Var("p2", TensorType((), "float32"))
    body = Call(op("add"), (b, Call(op("multiply"), (s, c))))
    func = infer_types(IRModule({"main": Function((b, c, s), body)}))["main"].with_attrs(Primitive=1)
    built = build_primitive(func, target)
    arrays = [np.full(elements, 1.0, np.float32), np.full(elements, 2.0, np.float32), np.array(3.0, np.float32)]
    out = np.empty(elements, np.float32)
    args = built.packing.kernel_arguments(arrays, [out])
    packed = built.kernel.pack(args)
    built.kernel.repeat(packed, 1)  # touches every page of `a` before the timing
    if not np.all(out == 7.0):
        raise AssertionError("the triad kernel computed a wrong result")
    kernel = built.kernel

    def call() -> None:
        kernel.repeat(packed, 1)

    return built, call, [*args, out]


def dense_task(n: int, k: int, target: Target, weight: np.ndarray) -> Any:
    """The tuning task of `nn.dense(x[1, k], W[n, k])` with W a constant, as `relay-tune` extracts it."""
    from relay_tune.tuning.relay_task import tasks_from_module  # the tuner: a start-up cost only this needs

    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {k}), float32], %w: Tensor[({n}, {k}), float32]) {{
  nn.dense(%x, %w)
}}"""
    mod = infer_types(bind_params(infer_types(parse_module(source)), {"w": weight}))
    (task,) = tasks_from_module(mod, target, layout_planning=False, winograd="off")
    return task


def tuned_config(task: Any, trials: int, seed: int = 0) -> Any:
    """The best config of a short tuning run of `task` (the default schedule measured first, as `relay-tune`
    does)."""
    from relay_tune.records.log_format import read_records  # the tuner: a start-up cost only this needs
    from relay_tune.tuning import tune

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "matvec.jsonl"
        tune([task], trials, log, storage=None, seed=seed)
        records = [r for r in read_records(log) if r.workload_key == task.key and r.gflops]
    if not records:
        return task.default_config()
    return max(records, key=lambda r: r.gflops).config


def rotating(calls: Sequence[Callable[[], object]]) -> Callable[[], None]:
    """One call of the next of `calls` in turn (each on its own copy of the weights: cold at its turn)."""
    state = {"next": 0}

    def call() -> None:
        index = state["next"]
        calls[index]()
        state["next"] = (index + 1) % len(calls)

    return call


def kernel_engine(task: Any, config: Any, target: Target, x: np.ndarray, weights: Sequence[np.ndarray],
                  expected: np.ndarray) -> tuple[Callable[[], None], list[Any]]:
    """A call of the kernel of `config`, cycling over `weights` (each packed once), checked against `expected`
    (numpy's product on the first copy); the arrays and argument packs it keeps alive."""
    built = build_primitive(task.func, target, task.steps(config))
    shapes = built.packing.input_shapes
    out = np.empty(built.packing.output_shapes[0], np.float32)
    alive: list[Any] = [out]
    calls = []
    for weight in weights:
        inputs = [weight if i in task.weight_inputs else x for i in range(len(shapes))]
        args = built.packing.kernel_arguments(inputs, [out])
        packed = built.kernel.pack(args)
        alive += [args, packed]
        calls.append(lambda kernel=built.kernel, packed=packed: kernel.repeat(packed, 1))
    calls[0]()
    error = float(np.abs(out.reshape(expected.shape) - expected).max())
    if error > 1e-3 * math.sqrt(x.size):
        raise AssertionError(f"{config!r}: wrong result (largest error {error})")
    return rotating(calls), alive


def calls_per_sample(call: Callable[[], object], min_seconds: float) -> int:
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, math.ceil(min_seconds / once))


def bench(name: str, n: int, k: int, target: Target, triad: Callable[[], None], triad_bytes: float,
          args: argparse.Namespace) -> list[dict[str, Any]]:
    """One workload's rows: the triad, default, tuned and numpy engines in the same interleaved rounds."""
    rng = np.random.default_rng(n * 31 + k)
    weight_bytes = n * k * 4
    copies = max(2, math.ceil(args.cold_mib * 2**20 / weight_bytes))
    weights = [rng.uniform(-1, 1, (n, k)).astype(np.float32) for _ in range(copies)]
    x = rng.uniform(-1, 1, (1, k)).astype(np.float32)
    expected = x @ weights[0].T
    task = dense_task(n, k, target, weights[0])
    default = task.default_config()
    # the tiled rule's panels (two or three vectors: what a one-row dense ran before the matrix-vector rule)
    tiled_columns = default_columns(n, target.vector_lanes())
    configs = {"default": default, "tiled": default.replace(tile_n=split_value(n, 1, tiled_columns))}
    if args.trials:
        start = time.perf_counter()
        configs["tuned"] = tuned_config(task, args.trials)
        print(f"  tuned in {time.perf_counter() - start:.0f} s: {dict(configs['tuned'])}", flush=True)
    print(f"  default: {dict(configs['default'])}", flush=True)
    engines: dict[str, Callable[[], object]] = {"triad": triad}
    alive: list[Any] = []
    for label, config in configs.items():
        engines[label], kept = kernel_engine(task, config, target, x, weights, expected)
        alive += kept
    out = np.empty((1, n), np.float32)
    engines["numpy"] = rotating([lambda w=w: np.matmul(x, w.T, out=out) for w in weights])
    with threadpool_limits(limits=target.num_cores, user_api="blas"):
        timed = {label: TimedCallable(call, calls_per_sample(call, args.min_ms / 1000.0))
                 for label, call in engines.items()}
        samples = interleaved(timed, rounds=args.rounds, repeat=args.repeat, settle_s=0.2)
    triad = samples["triad"]
    rows = [_row(name, "triad", triad, triad_bytes, triad, triad_bytes, args.repeat, "")]
    for label in engines:
        if label != "triad":
            config = str(dict(configs[label])) if label in configs else "OpenBLAS sgemv"
            rows.append(_row(name, label, samples[label], weight_bytes, triad, triad_bytes, args.repeat, config))
    del alive
    return rows


def _row(name: str, engine: str, samples: Samples, nbytes: float, triad: Samples, triad_bytes: float, repeat: int,
         config: str) -> dict[str, Any]:
    """An engine's GB/s (best and median sample) and its ratios to the triad's: best to best (STREAM's measure), and
    paired, the median over rounds of the ratio of the round's medians (the host's bandwidth moves with its other
    load; a round's engines see the same moment)."""
    best, median = nbytes / min(samples.seconds), nbytes / samples.median
    triad_best = triad_bytes / min(triad.seconds)
    rounds = [(statistics.median(samples.seconds[i:i + repeat]), statistics.median(triad.seconds[i:i + repeat]))
              for i in range(0, len(samples.seconds), repeat)]
    paired = statistics.median((nbytes / own) / (triad_bytes / base) for own, base in rounds)
    return {"workload": name, "engine": engine, "best_gbs": best / 1e9, "median_gbs": median / 1e9,
            "spread": samples.spread, "best_ratio": best / triad_best, "paired_ratio": paired, "config": config}


def run(args: argparse.Namespace) -> int:
    shapes = {name: shape for name, shape in SHAPES.items() if args.only in name}
    if not shapes:
        raise UsageError(f"no workload name contains {args.only!r}; names: {', '.join(SHAPES)}")
    if args.rounds < 1 or args.repeat < 1 or args.triad_mib < 1 or args.cold_mib < 1 or args.trials < 0:
        raise UsageError("--rounds, --repeat, --triad-mib and --cold-mib must be positive, --trials at least 0")
    host = Target.host()
    target = resolve_target(f"llvm -num-cores={args.cores or host.num_cores}")
    elements = args.triad_mib * 2**20 // 4
    _, triad, triad_alive = triad_kernel(elements, target)
    print(f"target: llvm -mcpu={target.mcpu} ({target.vector_lanes()} float32 lanes), {target.num_cores} cores; "
          f"triad: 3 x {args.triad_mib} MiB, relay-tune's code generator, {target.num_cores} threads")
    rows = []
    for name, (n, k) in shapes.items():
        print(f"{name}: weights {n * k * 4 / 2**20:.1f} MiB", flush=True)
        rows += bench(name, n, k, target, triad, TRIAD_BYTES_PER_ELEMENT * elements, args)
    del triad_alive
    print(f"\nGB/s of weight traffic (triad: STREAM's bytes), best and median of {args.rounds} x {args.repeat} "
          "interleaved samples; ratio: best to the triad's best; paired: median over rounds of the round's ratio")
    print(f"{'workload':26s} {'engine':8s} {'best GB/s':>10} {'ratio':>6} {'median GB/s':>12} {'paired':>7} "
          f"{'spread':>7}")
    for row in rows:
        print(f"{row['workload']:26s} {row['engine']:8s} {row['best_gbs']:10.2f} {row['best_ratio']:6.2f} "
              f"{row['median_gbs']:12.2f} {row['paired_ratio']:7.2f} {100 * row['spread'] / 2:6.1f}%")
    if args.csv is not None:
        write_rows(args.csv, rows)
    return 0
