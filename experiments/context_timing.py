"""The runner's timing against the model's: each task's best kernel timed back to back (the runner before it timed
kernels in their model context) and in context (`relay_tune.runtime.context`), beside its time in the model.

    python experiments/context_timing.py --onnx resnet50.onnx --log resnet50.jsonl [--rounds 5] [--match winograd]

In one process, for every task of the model with a record in the log (the build's pick, the best record of the
task's current space): the model is built from the log and profiled (`CompiledModel.profile`, the executor's
timestamps between kernel calls); each task's kernel is loaded and prepared as the runner's measurement worker does
(`relay_tune.tuning.runner._prepare`: weights rotating through 64 MiB of copies), and timed four ways in the same
interleaved rounds, as the tuner's runner sizes a timing (at least 40 ms a repeat):

- back to back: the kernel called again and again on the same activations (`in_context=False`);
- in context, timestamps: before each call a parallel producer step rewrites the activation inputs; only the time
  between the timestamps around each kernel call counts (what the runner now logs);
- in context, subtracted: the same loop timed from outside, less the same loop around a kernel that does nothing
  (producer steps and timestamps alone), per call;
- outputs written: in context, timestamps, but the outputs written by the team like the inputs instead of evicted
  (the alternative to evicting them: arena memory used recently rather than long ago).

Per round each task's in-graph time is the median of 3 profiled model runs; the table reports medians over rounds
(microseconds) and the ratios in-graph / runner. Writes experiments/results/context_timing_<model>.csv.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

import relay_tune  # noqa: E402
from relay_tune.compiler import resolve_target  # noqa: E402
from relay_tune.runtime.context import context_loop, production  # noqa: E402
from relay_tune.tuning.database import CurrentSpaces, JsonLinesDatabase  # noqa: E402
from relay_tune.tuning.relay_task import tasks_from_module  # noqa: E402
from relay_tune.tuning.runner import (  # noqa: E402
    DEFAULT_TOLERANCES,
    PRODUCER_SHIFT,
    KernelLoader,
    TimingOptions,
    WeightCopies,
    _prepare,
    _produced_positions,
    _Timed,
    context_step,
    random_inputs,
)
from relay_tune.tuning.tune_model import COLD_WEIGHTS_BYTES  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"
VARIANTS = ("back_to_back", "in_context", "subtracted", "outputs_written")


class Subtracted:
    """The in-context loop timed from outside, less the loop around a kernel that does nothing."""

    def __init__(self, timed: _Timed, artifact: Any, weights: set[int]) -> None:
        buffers, table = timed.keep[0], timed.keep[1]
        self.timed, self.loop = timed, context_loop()
        self.rows = table if table is not None else np.asarray([[b.ctypes.data for b in buffers]], dtype=np.uint64)
        self.step = context_step(artifact, buffers, weights, {})

    def time_repeat(self) -> float:
        number, clock = self.timed.number, time.perf_counter
        self.timed.run_many(1)
        start = clock()
        self.timed.run_many(number)
        middle = clock()
        self.loop.run(self.loop.noop, self.rows, 0, number, self.step)
        return ((middle - start) - (clock() - middle)) / number


class OutputsWritten:
    """In context, but the outputs written by the team like the inputs (from their current values) instead of evicted:
    arena memory that the rest of the model used recently rather than long ago."""

    def __init__(self, timed: _Timed, artifact: Any, weights: set[int], repeat_entry: Any) -> None:
        buffers, table = timed.keep[0], timed.keep[1]
        self.timed, self.loop, self.repeat = timed, context_loop(), repeat_entry
        self.rows = table if table is not None else np.asarray([[b.ctypes.data for b in buffers]], dtype=np.uint64)
        written = _produced_positions(artifact, weights, {})
        written += [p for p, arg in enumerate(artifact.args) if arg.role == "output"]
        self.step = production([buffers[p] for p in written], shift=PRODUCER_SHIFT)

    def time_repeat(self) -> float:
        number = self.timed.number
        self.loop.run(self.repeat, self.rows, 0, 1, self.step)
        return self.loop.run(self.repeat, self.rows, 0, number, self.step) * 1e-9 / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--target", default="native")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--match", default="", help="comma-separated substrings of the task descriptions to time")
    args = parser.parse_args()
    from relay_tune.frontend import from_onnx

    mod, _params = from_onnx(args.onnx)
    name = Path(args.onnx).stem
    target = resolve_target(args.target)
    model = relay_tune.build(mod, target=target, logs=args.log)
    inputs = model.random_inputs(seed=0)
    tasks = {t.key: t for t in tasks_from_module(mod, target)}
    database = CurrentSpaces(JsonLinesDatabase([args.log]), tasks.values())
    wanted = [w for w in args.match.split(",") if w]

    loader, copies = KernelLoader(), WeightCopies()
    timers: dict[str, dict[str, Any]] = {}
    for key, task in tasks.items():
        if wanted and not any(w in task.description for w in wanted):
            continue
        best = database.best(key, task.target, k=1)
        if not best:
            continue
        artifact = task.build(best[0].config)
        function, repeat_entry = loader.load(artifact)
        data = random_inputs(task.input_specs(), 0)
        weights = set(getattr(task, "weight_inputs", ()))
        found: dict[str, Any] = {}
        for variant, in_context in (("back_to_back", False), ("in_context", True)):
            timing = TimingOptions(number=1, repeat=1, min_repeat_ms=40.0, cold_weights_bytes=COLD_WEIGHTS_BYTES,
                                   in_context=in_context)
            timed = _prepare(artifact, function, repeat_entry, data, None, DEFAULT_TOLERANCES, timing,
                             loader.prologue, sorted(weights), copies, key)
            if not isinstance(timed, _Timed):
                raise SystemExit(f"{task.description}: {timed}")
            found[variant] = timed
        found["subtracted"] = Subtracted(found["in_context"], artifact, weights)
        found["outputs_written"] = OutputsWritten(found["in_context"], artifact, weights, repeat_entry)
        timers[key] = found

    samples: dict[str, dict[str, list[float]]] = {k: {v: [] for v in (*VARIANTS, "in_graph")} for k in timers}
    calls: dict[str, int] = {}
    descriptions: dict[str, str] = {}
    for number in range(args.rounds):
        for row in model.profile(repeat=3, inputs=inputs):
            if row.key in samples:
                samples[row.key]["in_graph"].append(row.per_call)
                calls[row.key], descriptions[row.key] = row.calls, row.description
        for key, found in timers.items():
            samples[key]["back_to_back"].append(found["back_to_back"].time_repeat(warm_call=True))
            samples[key]["in_context"].append(found["in_context"].time_repeat(warm_call=True))
            samples[key]["subtracted"].append(found["subtracted"].time_repeat())
            samples[key]["outputs_written"].append(found["outputs_written"].time_repeat())
        print(f"round {number + 1} of {args.rounds}", file=sys.stderr)

    rows = []
    for key, found in samples.items():
        if not found["in_graph"]:
            continue
        median = {v: statistics.median(s) * 1e6 for v, s in found.items()}
        rows.append({"task": descriptions[key], "calls": calls[key], "in_graph_us": median["in_graph"],
                     **{f"{v}_us": median[v] for v in VARIANTS},
                     **{f"ratio_{v}": median["in_graph"] / median[v] for v in VARIANTS}})
    rows.sort(key=lambda r: -r["in_graph_us"] * r["calls"])
    print(f"{'task':56s} {'in-graph':>9s} {'b2b':>8s} {'context':>8s} {'subtr.':>8s} {'out.wr.':>8s}  "
          "ratios in-graph / runner")
    for r in rows:
        print(f"{r['task'][:56]:56s} {r['in_graph_us']:9.1f} {r['back_to_back_us']:8.1f} {r['in_context_us']:8.1f} "
              f"{r['subtracted_us']:8.1f} {r['outputs_written_us']:8.1f}  "
              + " ".join(f"{r[f'ratio_{v}']:.2f}" for v in VARIANTS))
    for variant in VARIANTS:
        ratios = [r[f"ratio_{variant}"] for r in rows]
        within = sum(1 for x in ratios if 1 / 1.15 <= x <= 1.15)
        print(f"{variant:14s} within 15% of in-graph: {within} of {len(ratios)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"context_timing_{name}.csv"
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
