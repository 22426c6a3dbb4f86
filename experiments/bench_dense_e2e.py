"""Dense models end to end: the model against its tuned kernel's logged time and against numpy, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python experiments/bench_dense_e2e.py \
        [--trials-small 100] [--trials-large 200] [--log-small S.jsonl] [--log-large L.jsonl] [--rounds 15]

Two models:

- *dense_relu_256*: `relu(dense(data 256x512, weight 512x512))`, the weight a model constant (packed once at build);
- *dense_1024_input*: `dense(a 1024x1024, b 1024x1024)` with the weight `b` an input of the model (a schedule that
  reads it packed packs it on every run, and the tuner's measurement of that schedule includes the packing).

Each is tuned with the given budget into a log under logs/ (or taken from `--log-*`; with a log
whose budget is already spent nothing new is measured), built from that log and with default schedules, and its
outputs checked against numpy. Then, in interleaved rounds, each engine runs a block of back-to-back inferences
(at least `--per-round` calls and `--block-ms` milliseconds, as the tuner's runner times a kernel) and the block's
median is kept: the tuned model (`CompiledModel.run`, what a caller gets), the default model, and numpy's matmul
(+ relu). OpenBLAS's threads spin for a while after each call and our kernels' threads briefly too, so every
block starts once the process has *settled*: its threads together used less than 5% of one core over 10 ms
(`--settle`, at most that many seconds; the median wait after each engine is printed as its spin time). Printed
and written to experiments/results/dense_e2e.csv: medians over rounds, the logged time of the tuned kernel (the
fastest repeat of the best record, what the build picks, and the median of that record's repeats), the kernel's
in-graph time (`CompiledModel.profile`), and the ratios model / logged kernel and numpy / model (above 1: the
model is faster than numpy).
threadpoolctl reports which OpenBLAS kernel numpy runs; OPENBLAS_CORETYPE in the environment can pin a slower one
(unset it, as above, for numpy at its best).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from timing import settle  # noqa: E402

import relay_tune  # noqa: E402
from relay_tune.compile import bind_params, kernel_calls  # noqa: E402
from relay_tune.kernel.lower import lower  # noqa: E402
from relay_tune.kernel.schedule import Schedule  # noqa: E402
from relay_tune.records.database import JsonLinesDatabase  # noqa: E402
from relay_tune.runtime.profile import compare_with_logs  # noqa: E402
from relay_tune.text import parse_module  # noqa: E402
from relay_tune.tuning.tune_model import tune_model  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"

SMALL = """#[version = "0.0.5"]
def @main(%data: Tensor[(256, 512), float32], %weight: Tensor[(512, 512), float32]) {
  %0 = nn.dense(%data, %weight, units=512);
  nn.relu(%0)
}
"""

LARGE = """#[version = "0.0.5"]
def @main(%a: Tensor[(1024, 1024), float32], %b: Tensor[(1024, 1024), float32]) {
  nn.dense(%a, %b, units=1024)
}
"""


def blas_kernel() -> str:
    from threadpoolctl import threadpool_info

    found = [f"{i.get('internal_api')} {i.get('architecture', '')} ({i.get('num_threads')} threads)"
             for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(found) or "unknown"


def interleaved(engines: dict[str, Callable[[], object]], rounds: int, per_round: int, block: float, limit: float
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per call of each engine and how long the process kept spinning after its blocks (medians). Per
    round each engine, once the process has settled, runs a block of back-to-back calls (at least `per_round`
    and at least `block` seconds, as the tuner's runner times a kernel: the first calls after an idle pause wake
    sleeping threads and refill caches, which a short block would mostly measure); the block's median call is
    kept, and the median over rounds reported. Engines take turns within each round, so drift hits them alike."""
    for run in engines.values():
        run()
        run()
    samples: dict[str, list[float]] = {name: [] for name in engines}
    spins: dict[str, list[float]] = {name: [] for name in engines}
    clock = time.perf_counter
    names = list(engines)
    for _ in range(rounds):
        for position, (name, run) in enumerate(engines.items()):
            spins[names[position - 1]].append(settle(limit))  # the wait is the previous engine's spinning
            run()  # the first call after the pause wakes the thread team; the timed calls follow it
            times: list[float] = []
            began = clock()
            while len(times) < per_round or clock() - began < block:
                start = clock()
                run()
                times.append(clock() - start)
            samples[name].append(statistics.median(times))
    return ({name: statistics.median(values) for name, values in samples.items()},
            {name: statistics.median(values) for name, values in spins.items()})


def logged_median(log: Path, key: str, target_names: list[str]) -> float:
    """The median of the repeats of the best record of `key` (the build takes the record by its fastest repeat)."""
    database = JsonLinesDatabase([str(log)])
    for name in target_names:
        best = database.best(key, name, k=1)
        if best and best[0].costs:
            return statistics.median(best[0].costs)
    return float("nan")


def build_with_plain_packing(mod: object, target: str, log: Path) -> object:
    """The tuned build with its run-time packing kernels as they were before they were scheduled (one serial loop
    nest, what a GPU build still gets), for comparison in the same run."""
    def plain(layout: object, name: str, target: object = None) -> object:
        _source, packed = layout.pack_compute()
        return lower(Schedule([packed]), name)

    with mock.patch.object(kernel_calls, "packing_kernel", plain):
        return relay_tune.build(mod, target=target, logs=str(log))


def tuned_log(name: str, mod: object, trials: int, given: str | None, target: str) -> Path:
    if given:
        return Path(given)
    log = REPO_ROOT / "logs" / f"dense_e2e_{name}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    tune_model(mod, target, trials, log, measure_latency=False)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials-small", type=int, default=100)
    parser.add_argument("--trials-large", type=int, default=200)
    parser.add_argument("--log-small", help="tuning log of the 256x512 model (skips its tuning)")
    parser.add_argument("--log-large", help="tuning log of the 1024^3 model (skips its tuning)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=5, help="at least this many calls per block")
    parser.add_argument("--block-ms", type=float, default=40.0, help="and at least this many milliseconds")
    parser.add_argument("--settle", type=float, default=0.5,
                        help="at most this many seconds of waiting for the process to go idle before each block")
    parser.add_argument("--target", default="native")
    parser.add_argument("--only", choices=("small", "large"))
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    rows = []
    blas = blas_kernel()
    print(f"numpy BLAS: {blas}")
    for name in ("small", "large"):
        if args.only and name != args.only:
            continue
        if name == "small":
            weight = (rng.standard_normal((512, 512)) / np.sqrt(512)).astype(np.float32)
            mod = bind_params(parse_module(SMALL), {"weight": weight})
            data = rng.standard_normal((256, 512)).astype(np.float32)
            inputs = {"data": data}
            wt = np.ascontiguousarray(weight.T)
            out = np.empty((256, 512), np.float32)

            def reference(data: np.ndarray = data, wt: np.ndarray = wt, out: np.ndarray = out) -> np.ndarray:
                np.matmul(data, wt, out=out)
                return np.maximum(out, 0.0, out=out)
            label, trials, given = "dense_relu_256x512x512_const", args.trials_small, args.log_small
        else:
            mod = parse_module(LARGE)
            a = rng.standard_normal((1024, 1024)).astype(np.float32)
            b = rng.standard_normal((1024, 1024)).astype(np.float32)
            inputs = {"a": a, "b": b}
            out = np.empty((1024, 1024), np.float32)

            def reference(a: np.ndarray = a, b: np.ndarray = b, out: np.ndarray = out) -> np.ndarray:
                return np.matmul(a, b.T, out=out)  # b.T: numpy reads the transposed view without a copy
            label, trials, given = "dense_1024_weight_input", args.trials_large, args.log_large

        log = tuned_log(label, mod, trials, given, args.target)
        tuned = relay_tune.build(mod, target=args.target, logs=str(log))
        default = relay_tune.build(mod, target=args.target)
        want = reference().copy()
        for model in (tuned, default):
            np.testing.assert_allclose(model.run(**inputs), want, rtol=1e-3, atol=1e-3)
        # numpy's threads spin for ~0.1 s after the reference ran: profiled next to them, a kernel runs at half speed
        settle(args.settle)
        comparison = [row for row in compare_with_logs(tuned, [log], repeat=30, inputs=inputs) if row.profile.key]
        logged = comparison[0].logged or float("nan")
        in_graph = comparison[0].profile.per_call
        settle(args.settle)
        packing = sum(r.per_call for r in tuned.profile(repeat=30, inputs=inputs) if not r.key)
        logged_med = logged_median(log, comparison[0].profile.key,
                                   list(dict.fromkeys((tuned.target.log_name, str(tuned.target)))))
        engines: dict[str, Callable[[], object]] = {
            "tuned": lambda m=tuned, x=inputs: m.run(**x), "default": lambda m=default, x=inputs: m.run(**x),
            "numpy": reference}
        if any(not c.kernel.startswith("k") for c in tuned.plan.calls):  # the model packs a weight input
            serial = build_with_plain_packing(mod, args.target, log)
            np.testing.assert_allclose(serial.run(**inputs), want, rtol=1e-3, atol=1e-3)
            engines["serial_packing"] = lambda m=serial, x=inputs: m.run(**x)
        times, spins = interleaved(engines, args.rounds, args.per_round, args.block_ms / 1e3, args.settle)
        calls = ", ".join(f"{c.kernel}" for c in tuned.plan.calls)
        row = {
            "model": label, "log": str(log), "calls": calls,
            "tuned_ms": times["tuned"] * 1e3, "default_ms": times["default"] * 1e3, "numpy_ms": times["numpy"] * 1e3,
            "logged_kernel_ms": logged * 1e3, "logged_median_ms": logged_med * 1e3,
            "in_graph_kernel_ms": in_graph * 1e3,
            "in_graph_packing_ms": packing * 1e3,
            "tuned_over_logged": times["tuned"] / logged, "tuned_over_default": times["tuned"] / times["default"],
            "numpy_over_tuned": times["numpy"] / times["tuned"],
            "tuned_spin_ms": spins["tuned"] * 1e3, "default_spin_ms": spins["default"] * 1e3,
            "numpy_spin_ms": spins["numpy"] * 1e3, "blas": blas,
            "serial_packing_ms": times.get("serial_packing", float("nan")) * 1e3,
            "numpy_over_serial_packing": times["numpy"] / times.get("serial_packing", float("nan")),
        }
        rows.append(row)
        print(f"\n{label}: calls {calls}")
        print(f"  tuned model {row['tuned_ms']:.3f} ms | default model {row['default_ms']:.3f} ms | "
              f"numpy {row['numpy_ms']:.3f} ms")
        print(f"  logged kernel {row['logged_kernel_ms']:.3f} ms, median repeat {row['logged_median_ms']:.3f} ms "
              "(with its packing when it packs a run-time input) | "
              f"in graph: kernel {row['in_graph_kernel_ms']:.3f} ms, packing {row['in_graph_packing_ms']:.3f} ms")
        print(f"  tuned / logged {row['tuned_over_logged']:.3f}x | tuned / default {row['tuned_over_default']:.3f}x"
              f" | numpy / tuned {row['numpy_over_tuned']:.3f}x (above 1: faster than numpy)")
        if "serial_packing" in times:
            print(f"  the same build with the packing as one serial loop nest: {row['serial_packing_ms']:.3f} ms, "
                  f"numpy / it {row['numpy_over_serial_packing']:.3f}x")
        print(f"  spinning after each block: tuned {row['tuned_spin_ms']:.1f} ms, "
              f"default {row['default_spin_ms']:.1f} ms, numpy {row['numpy_spin_ms']:.1f} ms")
    out_path = RESULTS / "dense_e2e.csv"
    if out_path.exists():  # keep the other model's row from an earlier run with --only
        with out_path.open(newline="") as handle:
            done = {row["model"] for row in rows}
            rows = [row for row in csv.DictReader(handle) if row.get("model") not in done] + rows
    with out_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
