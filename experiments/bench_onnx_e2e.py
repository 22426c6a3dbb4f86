"""Whole networks from ONNX: relay-tune against onnxruntime, same machine, same threads, same run.

    python experiments/bench_onnx_e2e.py [--models resnet50,mobilenet_v2,...] [--threads 2] [--rounds 15]
                                         [--log logs/resnet50.jsonl ...] [--csv experiments/results/onnx_e2e.csv]

The networks (`experiments/onnx_zoo.py`, built with onnx.helper, random weights at a trained network's scale):
ResNet-50 v1, MobileNet v2, SqueezeNet 1.1, a ShuffleNet v2-style net, DenseNet-121, VGG-16, an Inception-style
net and one BERT-base encoder layer (sequence 128). For each network:

1. onnxruntime runs it (`intra_op_num_threads=T`, sequential execution, all graph optimisations);
2. relay-tune imports it, builds it with default schedules (and, with `--log`, a second time from the best records
   of those tuning logs), and every build's output is checked against onnxruntime's (and, with `--interpreter`,
   the reference interpreter's);
3. the engines are timed in interleaved rounds, each engine (each build) in a block per round: wait until the
   process is idle (see below), one untimed inference, then `--per-round` timed ones. The table reports medians
   over all timed inferences and the ratio to onnxruntime (below 1: relay-tune is faster). In each round
   relay-tune's builds also share one more block and alternate single inferences in it (default, tuned, tuned,
   default, ...), so a slow spell of the host falls on both alike: per tuned build, the median of the paired
   ratios tuned / default of adjacent runs (`tuned_vs_default`) and whether the two builds are the same code
   (`tuned_same_build`: identical object code, or no kernel with a tuned record, as when the build's in-graph
   check keeps every default schedule): then any difference between their columns is the host's noise, not
   tuning.

Spinning threads. Both engines keep worker threads that spin after a run, waiting for the next one: libgomp's
team (bounded by relay-tune, `relay_tune.codegen.jit.DEFAULT_GOMP_SPINCOUNT`) and onnxruntime's intra-op pool
(by default it keeps spinning after `run` returns: about 60 ms on this 2-core machine, onnxruntime 1.32). With 2
threads on 2 cores, an engine timed while the other's workers still spin shares its cores with them, and a parallel
kernel waited at its end for a descheduled thread: measured run by run, SqueezeNet took 30 ms right after an
onnxruntime run and 12 ms after one with spinning off. So before each block the
benchmark *settles*: it waits until the process used less than 5% of one core over 10 ms (all threads: the
process's CPU clock), at most `--settle` seconds, and reports how long each engine's threads kept spinning after it
(`spin ms`, the median wait after that engine's blocks). onnxruntime is timed twice, with its default spinning
(`ort ms`, the baseline of the ratios) and with `session.intra_op.allow_spinning=0` (`ort-nospin ms`).
`--settle 0` times the blocks back to back: each engine then meets the other's spinning threads, which is
what the executor's tolerance to a busy core is measured with.

Columns: `default` is `CompiledModel.run` (the native executor); `py loop` runs the same build's kernels from a
Python loop of ctypes calls over the same buffers, as models ran before the native executor, for comparison in
the same run; `tuned` appears with `--log`. A CSV with one row per network goes to `--csv`.

`--layout-planning on|off|both` builds with graph-level layout planning (`relay_tune.passes.PlanLayouts`: blocked
NCHW16c convolution chains) on, off, or both ways, timed in the same interleaved rounds; the builds with planning on
are labelled `default_lp` and `tuned_lp`. Without the option the builds take the library's default.
`--winograd MODE ...` builds once per Winograd setting (`relay_tune.build(..., winograd=MODE)`: off, auto, on, f2,
f4), labelled `default_wg<MODE>` (and `tuned_wg<MODE>`), timed in the same rounds.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from onnx_zoo import ZOO  # noqa: E402
from timing import settle  # noqa: E402


def ort_session(model: Any, threads: int, spinning: bool = True) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def python_loop(model: Any, inputs: dict[str, np.ndarray]) -> Callable[[], None]:
    """One inference as models ran before the native executor: bind the buffers, then one ctypes call per kernel
    from Python (the same kernels, slots and arena as `model.run`)."""
    arrays = model._check_inputs((), inputs)
    outputs = model._new_outputs()
    model._bind(arrays, outputs)
    slots = model._executor.slots
    calls = []
    for call in model.plan.calls:
        address = model._kernels[call.kernel].address
        fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(call.args))(address)
        calls.append((fn, [slots[model.plan.values[v].storage] for v in call.args]))

    def run() -> None:
        model._bind(arrays, outputs)
        for fn, args in calls:
            fn(*args)

    run.keep = (arrays, outputs)  # type: ignore[attr-defined]  # the buffers the addresses point into
    return run


def matches(name: str, got: np.ndarray, want: np.ndarray, rtol: float) -> tuple[bool, float]:
    """Close relative to the output's own scale (deep nets reorder float sums; logits can be large)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        print(f"  {name}: shape {got.shape}, onnxruntime {want.shape}")
        return False, math.inf
    scale = max(float(np.abs(want).max()), 1e-6)
    error = float(np.abs(got - want).max()) / scale
    return error <= rtol, error


def first_output(result: Any) -> np.ndarray:
    while isinstance(result, tuple | list):
        result = result[0]
    return np.asarray(result)


def build_plan(args: argparse.Namespace) -> list[tuple[str, list[str] | None, bool | None, str | None]]:
    """(label, logs, layout_planning, winograd) of every build to time: default schedules, and tuned ones with
    `--log`, with layout planning as `--layout-planning` says and Winograd as `--winograd` (None: the library's
    default)."""
    choices: dict[str | None, list[bool | None]] = {None: [None], "off": [False], "on": [True], "both": [False, True]}
    builds: list[tuple[str, list[str] | None, bool | None, str | None]] = []
    for planning in choices[args.layout_planning]:
        for winograd in getattr(args, "winograd", None) or [None]:
            suffix = ("_lp" if planning else "") + (f"_wg{winograd}" if winograd else "")
            builds.append((f"default{suffix}", None, planning, winograd))
            if args.log:
                builds.append((f"tuned{suffix}", args.log, planning, winograd))
    return builds


def first_label(args: argparse.Namespace) -> str:
    """The build whose kernels the `py loop` column runs from Python."""
    return build_plan(args)[0][0]


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    onnx_model = ZOO[name]()
    row: dict[str, Any] = {"model": name}
    mod, _ = from_onnx(onnx_model)
    shape = tuple(d.dim_value for d in onnx_model.graph.input[0].type.tensor_type.shape.dim)
    x = np.random.default_rng(args.seed).standard_normal(shape).astype(np.float32)
    session = ort_session(onnx_model, args.threads)
    want = session.run(None, {"input": x})[0]
    target = Target.host(num_cores=args.threads)

    quiet = ort_session(onnx_model, args.threads, spinning=False)
    runners: dict[str, Callable[[], Any]] = {"onnxruntime": lambda: session.run(None, {"input": x}),
                                             "ort-nospin": lambda: quiet.run(None, {"input": x})}
    ok = True
    builds: dict[str, Any] = {}
    for label, logs, planning, winograd in build_plan(args):
        start = time.perf_counter()
        # The tuned build is what `relay-tune build --log` and the tuner's final build make: records whose kernels
        # are slower in the graph than the default ones are dropped (`--no-check-tuned`: every record is used).
        check = logs is not None and not args.no_check_tuned
        compiled = relay_tune.build(mod, target=target, logs=logs, check_tuned=check, layout_planning=planning,
                                    winograd=winograd)
        row[f"{label}_build_s"] = round(time.perf_counter() - start, 2)
        decided = compiled.build_info.get("tuned_check")
        if decided:  # what the build's own in-graph check saw: records dropped, and tuned / default end to end
            prefix = "" if label == "tuned" else f"{label}_"
            row[f"{prefix}check_rejected"] = f"{len(decided['rejected'])} of {len(decided['tasks'])}"
            row[f"{prefix}check_ratio"] = round(decided["tuned_e2e_s"] / decided["default_e2e_s"], 3)
            row[f"{prefix}check_kept_default"] = decided["kept_default"]
        good, error = matches(label, first_output(compiled.run(input=x)), want, args.rtol)
        row[f"{label}_error"] = f"{error:.2e}"
        ok = ok and good
        runners[label] = (lambda m: lambda: m.run(input=x))(compiled)
        builds[label] = compiled
        if label == first_label(args):
            runners["py loop"] = python_loop(compiled, {"input": x})
            row["kernel_calls"] = compiled.num_kernel_calls
    if args.interpreter:
        from relay_tune.interpreter import Interpreter

        good, error = matches("interpreter", first_output(Interpreter(mod).run({"input": x})), want, args.rtol)
        row["interpreter_error"] = f"{error:.2e}"
        ok = ok and good
    row["matches"] = ok

    samples, spins, pairs = time_interleaved(runners, builds, args)
    base = statistics.median(samples["onnxruntime"])
    for label, values in samples.items():
        row[f"{label}_ms"] = round(statistics.median(values) * 1e3, 3)
        row[f"{label}_spin_ms"] = round(statistics.median(spins[label]) * 1e3, 1)
        if label != "onnxruntime":
            row[f"{label}_ratio"] = round(statistics.median(values) / base, 3)
    for label, ratios in pairs.items():  # paired: each tuned run over the default run next to it
        row[f"{label}_vs_default"] = round(statistics.median(ratios), 3)
        row[f"{label}_same_build"] = same_build(builds[label], builds[label.replace("tuned", "default")])
    return row


def same_build(tuned: Any, default: Any) -> bool:
    """Whether two builds run the same code: identical object code, or no kernel of `tuned` uses a tuned record
    (the build's in-graph check kept the default schedule everywhere)."""
    return tuned.object_code == default.object_code or not any(t.tuned for t in tuned.plan.tasks if t.kernel)


def time_interleaved(runners: dict[str, Callable[[], Any]], builds: dict[str, Any], args: argparse.Namespace
                     ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per inference of every runner, in `args.rounds` interleaved rounds; the seconds each runner's threads
    kept spinning after its block; and per tuned build, the ratios tuned / default of adjacent single runs.

    Every engine (onnxruntime, ort-nospin, the Python loop, each relay-tune build) takes its turn in a block of its
    own, after the process went idle (`settle`) and one untimed inference: its runs follow each other, with its
    weights and activations in cache as in a serving loop, which is what the ratios to onnxruntime compare. Then,
    in the same round, relay-tune's builds share one more block and alternate single inferences (default, tuned,
    tuned, default, ...: each pair's order flips, so neither build always runs first): a slow spell of the host
    falls on both builds alike, and the paired ratios say whether tuning changed anything where the medians of
    separate blocks would report the host's noise as a difference. The alternating runs feed only the paired
    ratios: each run there starts with the other build's data in the caches (MobileNet v2 ran 7.3 ms alternating
    against 5.6 ms back to back), which is fair between the two builds but not against onnxruntime."""
    blocks = [[label] for label in runners]
    if len(builds) > 1:
        blocks.append(list(builds))
    samples: dict[str, list[float]] = {label: [] for label in runners}
    spins: dict[str, list[float]] = {label: [] for label in runners}
    pairs: dict[str, list[float]] = {label: [] for label in builds if label.startswith("tuned")}
    for fn in runners.values():  # warm-up: first-touch page faults, thread pools, caches
        for _ in range(2):
            fn()
    previous = blocks[-1]
    for _ in range(args.rounds):
        for block in blocks:
            # Settle first: the threads of the engine timed before may still be spinning (the wait is charged to
            # that engine's `spin` column). Then one untimed inference each: the first run after another engine
            # meets caches that engine filled.
            waited = settle(args.settle)
            for label in previous:  # builds that share a block share its wait
                spins[label].append(waited)
            for label in block:
                runners[label]()
            for repeat in range(args.per_round):
                order = block if repeat % 2 == 0 else block[::-1]
                seconds: dict[str, float] = {}
                for label in order:
                    start = time.perf_counter()
                    runners[label]()
                    seconds[label] = time.perf_counter() - start
                if len(block) == 1:
                    samples[block[0]].append(seconds[block[0]])
                for label in (lb for lb in pairs if lb in seconds and len(block) > 1):
                    pairs[label].append(seconds[label] / seconds[label.replace("tuned", "default")])
            previous = block
    return samples, spins, pairs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO), help=f"comma-separated subset of {', '.join(ZOO)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--per-round", type=int, default=4,
                        help="inferences per engine per round (relay-tune's builds alternate single inferences)")
    parser.add_argument("--log", action="append", default=[], help="tuning log(s) for the tuned build")
    parser.add_argument("--no-check-tuned", action="store_true", help="build the tuned model from every best record, "
                        "without dropping the ones slower in the graph than the default kernels (as the CLI does)")
    parser.add_argument("--rtol", type=float, default=1e-3, help="largest error relative to the output's scale")
    parser.add_argument("--interpreter", action="store_true", help="also check the reference interpreter (slow)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="longest wait (s) for the process to go idle before each engine's block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout-planning", choices=("on", "off", "both"), default=None,
                        help="build with graph-level layout planning on, off or both ways, timed in the same rounds "
                        "(default: the library's default)")
    parser.add_argument("--winograd", nargs="+", default=None, choices=("off", "auto", "on", "f2", "f4"),
                        help="build once per Winograd setting, timed in the same rounds (default: the library's)")
    parser.add_argument("--csv", type=Path, default=REPO_ROOT / "experiments" / "results" / "onnx_e2e.csv")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    for path in args.log:
        if not os.path.isfile(path):
            parser.error(f"tuning log {path}: no such file")

    print(f"threads {args.threads}; {args.rounds} rounds x {args.per_round} inferences per engine, interleaved; "
          f"load average {os.getloadavg()[0]:.1f} on {len(os.sched_getaffinity(0))} usable cores")
    planned = [label for label, _, _, _ in build_plan(args)]
    labels = [*planned[:1], "py loop", *planned[1:]]
    from relay_tune.codegen.jit import load_libgomp

    load_libgomp()  # before onnxruntime starts any thread: the spin limit is read when libgomp starts
    print("libgomp spin count:", os.environ.get("GOMP_SPINCOUNT", "libgomp's default"),
          "; OMP_WAIT_POLICY:", os.environ.get("OMP_WAIT_POLICY", "unset"))
    header = f"{'model':<15} {'calls':>5} {'ort ms':>8} {'ort-nospin':>10} " + \
        " ".join(f"{lb + ' ms':>11} {'ratio':>6}" for lb in labels)
    print(header + "  spin ms (ort, ours)  match")
    rows = []
    for name in names:
        row = bench_model(name, args)
        rows.append(row)
        cells = " ".join(f"{row[lb + '_ms']:>11.2f} {row[lb + '_ratio']:>6.2f}" for lb in labels)
        print(f"{name:<15} {row['kernel_calls']:>5} {row['onnxruntime_ms']:>8.2f} {row['ort-nospin_ms']:>10.2f} "
              f"{cells}  {row['onnxruntime_spin_ms']:>8.1f} {row[planned[0] + '_spin_ms']:>6.1f}    "
              f"{'yes' if row['matches'] else 'NO'} ({row[planned[0] + '_error']})", flush=True)
        for label in (lb for lb in planned if lb.startswith("tuned")):
            same = row[f"{label}_same_build"]
            print(f"{'':<15} {label} / {label.replace('tuned', 'default')}, paired single runs: "
                  f"{row[label + '_vs_default']:.3f}; same build: "
                  f"{'yes (every kernel has its default schedule: the difference is noise)' if same else 'no'}",
                  flush=True)
        for prefix in ("", "tuned_lp_"):
            if f"{prefix}check_ratio" in row:
                print(f"{'':<15} the {prefix or 'tuned_'}build's in-graph check: {row[prefix + 'check_rejected']} "
                      f"tuned records dropped, tuned / default {row[prefix + 'check_ratio']:.3f} end to end, "
                      f"{'default build kept' if row[prefix + 'check_kept_default'] else 'tuned build kept'}",
                      flush=True)
    for label in labels:
        ratios = [r[f"{label}_ratio"] for r in rows]
        print(f"geometric mean ratio, {label}: {math.exp(statistics.fmean(math.log(v) for v in ratios)):.3f}")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k != "model", k))
    with open(args.csv, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.csv}")
    if os.getloadavg()[0] > len(os.sched_getaffinity(0)):
        print("note: the load average exceeds the usable cores: other processes competed for the CPUs")
    return 0 if all(r["matches"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
