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
  (the alternative to evicting them: arena memory used recently rather than long ago);
- outputs private-evicted: in context, timestamps, the outputs not flushed but pushed out of the cores' private
  caches (each thread reads twice its private cache of scratch first), so they sit in the shared cache, as arena
  memory a few kernels used last (`context_step(outputs_in="private")`);
- outputs half flushed: the same, with the first half of each output flushed from every cache as well
  (`outputs_in="half_flushed"`).

`--variants` picks some of them (back to back and in context are always timed: the runner's two modes).

Per round each task's in-graph time is the median of 3 profiled model runs; the table reports medians over rounds
(microseconds) and the ratios in-graph / runner. Writes experiments/results/context_timing_<model><--suffix>.csv.
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
from relay_tune.compile import resolve_target  # noqa: E402
from relay_tune.records.database import CurrentSpaces, JsonLinesDatabase  # noqa: E402
from relay_tune.runtime.context import Production, context_loop, production  # noqa: E402
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
VARIANTS = ("back_to_back", "in_context", "subtracted", "outputs_written", "outputs_private", "outputs_half_flushed")
SHORT = {"back_to_back": "b2b", "in_context": "context", "subtracted": "subtr.", "outputs_written": "out.wr.",
         "outputs_private": "out.pr.", "outputs_half_flushed": "out.hf."}


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


class OtherStep:
    """In context (timestamps), as many calls as the runner's in-context timing makes, after another producer step."""

    def __init__(self, timed: _Timed, step: Production, repeat_entry: Any) -> None:
        buffers, table = timed.keep[0], timed.keep[1]
        self.timed, self.loop, self.repeat, self.step = timed, context_loop(), repeat_entry, step
        self.rows = table if table is not None else np.asarray([[b.ctypes.data for b in buffers]], dtype=np.uint64)

    def time_repeat(self) -> float:
        number = self.timed.number
        self.loop.run(self.repeat, self.rows, 0, 1, self.step)
        return self.loop.run(self.repeat, self.rows, 0, number, self.step) * 1e-9 / number


FAMILIES = (("contrib_conv2d", "direct conv"), ("batch_matmul", "batch product"),
            ("winograd_input", "wino. input"), ("winograd_output", "wino. output"), ("pool", "pooling"),
            ("layout_transform", "layout"), ("dense", "dense"))


def family(task: str) -> str:
    """The kernel family a task description names (the families the README's fidelity tables count)."""
    return next((name for key, name in FAMILIES if key in task), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--target", default="native")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--match", default="", help="comma-separated substrings of the task descriptions to time")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--suffix", default="", help="appended to the CSV's name")
    args = parser.parse_args()
    variants = tuple(v for v in VARIANTS if v in {*args.variants.split(","), "back_to_back", "in_context"})
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
        timed, buffers = found["in_context"], found["in_context"].keep[0]
        if "subtracted" in variants:
            found["subtracted"] = Subtracted(timed, artifact, weights)
        if "outputs_written" in variants:
            # the outputs written by the team like the inputs (from their current values) instead of evicted
            written = _produced_positions(artifact, weights, {})
            written += [p for p, arg in enumerate(artifact.args) if arg.role == "output"]
            step = production([buffers[p] for p in written], shift=PRODUCER_SHIFT)
            found["outputs_written"] = OtherStep(timed, step, repeat_entry)
        for variant, outputs_in in (("outputs_private", "private"), ("outputs_half_flushed", "half_flushed")):
            if variant in variants:
                found[variant] = OtherStep(timed, context_step(artifact, buffers, weights, {}, outputs_in),
                                           repeat_entry)
        timers[key] = found

    samples: dict[str, dict[str, list[float]]] = {k: {v: [] for v in (*variants, "in_graph")} for k in timers}
    calls: dict[str, int] = {}
    descriptions: dict[str, str] = {}
    for number in range(args.rounds):
        for row in model.profile(repeat=3, inputs=inputs):
            if row.key in samples:
                samples[row.key]["in_graph"].append(row.per_call)
                calls[row.key], descriptions[row.key] = row.calls, row.description
        for key, found in timers.items():
            for variant in variants:
                timer = found[variant]
                samples[key][variant].append(timer.time_repeat(warm_call=True) if isinstance(timer, _Timed)
                                             else timer.time_repeat())
        print(f"round {number + 1} of {args.rounds}", file=sys.stderr)

    rows = []
    for key, found in samples.items():
        if not found["in_graph"]:
            continue
        median = {v: statistics.median(s) * 1e6 for v, s in found.items()}
        rows.append({"task": descriptions[key], "calls": calls[key], "in_graph_us": median["in_graph"],
                     **{f"{v}_us": median[v] for v in variants},
                     **{f"ratio_{v}": median["in_graph"] / median[v] for v in variants}})
    rows.sort(key=lambda r: -r["in_graph_us"] * r["calls"])
    print(f"{'task':56s} {'in-graph':>9s} " + " ".join(f"{SHORT[v]:>8s}" for v in variants)
          + "  ratios in-graph / runner")
    for r in rows:
        print(f"{r['task'][:56]:56s} {r['in_graph_us']:9.1f} " + " ".join(f"{r[f'{v}_us']:8.1f}" for v in variants)
              + "  " + " ".join(f"{r[f'ratio_{v}']:.2f}" for v in variants))
    for variant in variants:
        ratios = [r[f"ratio_{variant}"] for r in rows]
        within = sum(1 for x in ratios if 1 / 1.15 <= x <= 1.15)
        print(f"{variant:20s} within 15% of in-graph: {within} of {len(ratios)}")
        by_family: dict[str, list[float]] = {}
        for r in rows:
            by_family.setdefault(family(r["task"]), []).append(r[f"ratio_{variant}"])
        print("    " + "; ".join(f"{f} {sum(1 for x in xs if 1 / 1.15 <= x <= 1.15)}/{len(xs)} "
                                 f"({min(xs):.2f}-{max(xs):.2f})" for f, xs in by_family.items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"context_timing_{name}{args.suffix}.csv"
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
