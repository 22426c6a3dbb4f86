"""In-graph fidelity: does what the tuner logs for a kernel predict its time in the model?

    python -m experiments fidelity --onnx resnet50.onnx --log logs/resnet50.jsonl
    python -m experiments fidelity --relay model.relay --log logs/model.jsonl [--repeats 3] [--top 6]

For a model and its tuning log (the model is built from the log, best record per task, and with default
schedules), in one run:

1. per task: the logged time of the record the build picked (fastest repeat of the best record), the kernel's time
   in the model (`CompiledModel.profile`: timestamps the native executor takes between its calls, median over
   runs, in rounds spread over the whole run: `SpreadProfile`), and their ratio;
2. repeat agreement: the best config of the `--top` tasks with the most logged time in the model (time x
   occurrences) measured again `--repeats` times, each by a fresh `LocalRunner` (a fresh measurement process,
   the tuner's own settings); the spread is max / min - 1, and the in-graph time is compared with the median of
   those repeats too (the logged time, a minimum over many noisy records, is biased low);
3. `benchmark()` against `run()` called from Python, and the tuned against the default build end to end, all
   in the same interleaved rounds (`experiments.timing`, medians).

Prints a table and writes `<out>/fidelity_<model>.csv` (one row per task; the whole-model figures are rows whose
task column says so; `--out` defaults to experiments/results).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import relay_tune
from experiments import UsageError
from experiments.timing import interleaved
from relay_tune.compile import resolve_target
from relay_tune.records.database import CurrentSpaces, JsonLinesDatabase
from relay_tune.runtime.model import CompiledModel
from relay_tune.runtime.profile import ProfileComparison, compare_with_logs
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.tuning.tune_model import default_runner


def load(args: argparse.Namespace) -> tuple[object, str]:
    if args.onnx:
        from relay_tune.frontend import from_onnx

        mod, _params = from_onnx(args.onnx)
        return mod, Path(args.onnx).stem
    from relay_tune.text import load_module

    return load_module(args.relay), Path(args.relay).stem


class SpreadProfile:
    """The model's profile taken in rounds spread over the whole run (one round now, one after each config measured
    again), each task's in-graph time the median of its rounds. On this shared VM the host sometimes runs the
    process at half speed for seconds at a time (both cores this process's, nothing else running, per
    /proc/stat): one profile of half a second then doubled every kernel's in-graph time (in four of five runs of
    one evening), while rounds spread over minutes outvote such an episode."""

    def __init__(self, model: CompiledModel, log: str, inputs: dict, tasks: list, runs_per_round: int = 3) -> None:
        self.model, self.log, self.inputs, self.tasks = model, log, inputs, tasks
        self.runs_per_round = runs_per_round
        self.rounds: list[list[ProfileComparison]] = []
        self.take()

    def take(self) -> None:
        self.rounds.append(compare_with_logs(self.model, [self.log], repeat=self.runs_per_round,
                                             inputs=self.inputs, tasks=self.tasks))

    def result(self) -> list[ProfileComparison]:
        rows = []
        for first in self.rounds[0]:
            same = [r for found in self.rounds for r in found if r.profile.task == first.profile.task]
            seconds = statistics.median(r.profile.seconds for r in same)
            rows.append(ProfileComparison(replace(first.profile, seconds=seconds), first.logged))
        return sorted(rows, key=lambda r: -r.profile.seconds)


def repeat_agreement(tasks: dict[str, object], log: str, keys: list[str], repeats: int,
                     between: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """Per task key, the best config's cost measured `repeats` times, each in a fresh measurement process (records
    of another schedule space, which the build passes over, left out)."""
    database = CurrentSpaces(JsonLinesDatabase([log]), tasks.values())
    found: dict[str, list[float]] = {}
    for key in keys:
        task = tasks.get(key)
        if task is None:
            continue
        best = database.best(key, task.target, k=1)
        if not best:
            continue
        artifact = task.build(best[0].config)
        costs = []
        for _ in range(repeats):
            runner = default_runner()  # a new runner starts a new measurement process
            try:
                result = runner.run(task, artifact)
            finally:
                runner.close()
            if result.costs:
                costs.append(min(result.costs))
        found[key] = costs
        between()
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--onnx", help="the model as an ONNX file")
    source.add_argument("--relay", help="the model as Relay text")
    parser.add_argument("--log", required=True, help="its tuning log")
    parser.add_argument("--target", default="native")
    parser.add_argument("--repeats", type=int, default=3, help="fresh measurement processes per config")
    parser.add_argument("--top", type=int, default=6, help="tasks whose best config is measured again")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the end-to-end timing")
    parser.add_argument("--profile-rounds", type=int, default=7,
                        help="profile rounds (of 3 runs each) at least, one after each config measured again")
    parser.add_argument("--number", type=int, default=5, help="inferences per engine and round")
    parser.add_argument("--out", type=Path, default=Path("experiments/results"), help="folder of the CSV")


def run(args: argparse.Namespace) -> int:
    for path in (args.onnx or args.relay, args.log):
        if not Path(path).is_file():
            raise UsageError(f"no such file: {path}")

    mod, name = load(args)
    target = resolve_target(args.target)
    tuned = relay_tune.build(mod, target=target, logs=args.log)
    default = relay_tune.build(mod, target=target)
    inputs = tuned.random_inputs(seed=0)
    tasks = {t.key: t for t in tasks_from_module(mod, target)}
    profile = SpreadProfile(tuned, args.log, inputs, list(tasks.values()))
    comparison = profile.result()  # the first round ranks the tasks
    ranked = sorted((r for r in comparison if r.profile.key and r.logged),
                    key=lambda r: -(r.logged or 0) * r.profile.calls)
    agreement = repeat_agreement(tasks, args.log, [r.profile.key for r in ranked[: args.top]], args.repeats,
                                 between=profile.take)
    while len(profile.rounds) < args.profile_rounds:
        time.sleep(1.0)
        profile.take()
    comparison = profile.result()

    rows = []
    print(f"{'task':48s} {'calls':>5s} {'logged us':>10s} {'in-graph us':>11s} {'ratio':>6s} {'repeats us':>24s} "
          f"{'spread':>7s}")
    for r in comparison:
        costs = agreement.get(r.profile.key, [])
        spread = max(costs) / min(costs) - 1 if len(costs) > 1 else None
        row = {"task": r.profile.description, "key": r.profile.key, "tuned": r.profile.tuned, "calls": r.profile.calls,
               "logged_us": (r.logged or 0) * 1e6 or None, "in_graph_us": r.profile.per_call * 1e6,
               "ratio": r.ratio, "repeat_costs_us": " ".join(f"{c * 1e6:.1f}" for c in costs),
               "repeat_spread": spread}
        rows.append(row)
        logged = f"{row['logged_us']:.1f}" if row["logged_us"] else "-"
        ratio = f"{r.ratio:.3f}" if r.ratio else "-"
        print(f"{r.profile.description[:48]:48s} {r.profile.calls:5d} {logged:>10s} {row['in_graph_us']:11.1f} "
              f"{ratio:>6s} {row['repeat_costs_us'][:24]:>24s} {'' if spread is None else f'{spread:.1%}':>7s}")
    ratios = [r.ratio for r in comparison if r.ratio]
    within = sum(1 for x in ratios if 1 / 1.15 <= x <= 1.15)
    spreads = [max(c) / min(c) - 1 for c in agreement.values() if len(c) > 1]
    # The logged time is the fastest repeat of the fastest of many records: a minimum over noisy measurements, so
    # biased low (the more trials, the more). The same config measured again in fresh processes has no such bias.
    remeasured = [r.profile.per_call / statistics.median(agreement[r.profile.key]) for r in comparison
                  if agreement.get(r.profile.key)]
    within_remeasured = sum(1 for x in remeasured if 1 / 1.15 <= x <= 1.15)
    timed = interleaved({"run": lambda: tuned.run(**inputs), "tuned": tuned, "default": default},
                        rounds=args.rounds, repeat=args.number, inputs=inputs)
    run_s, bench_s = timed["run"].median, timed["tuned"].median
    tuned_s, default_s = bench_s, timed["default"].median
    summary = {
        "tasks within 15% of logged": f"{within} of {len(ratios)}",
        "worst in-graph / logged": f"{max(ratios, key=lambda x: abs(x - 1)):.3f}" if ratios else "-",
        "repeat spread (max over tasks)": f"{max(spreads):.1%}" if spreads else "-",
        "measured again: within 15% of in-graph": f"{within_remeasured} of {len(remeasured)}",
        "in-graph / measured again": " ".join(f"{x:.3f}" for x in remeasured) or "-",
        "run() ms": f"{run_s * 1e3:.3f}", "benchmark() ms": f"{bench_s * 1e3:.3f}",
        "benchmark / run": f"{bench_s / run_s:.3f}",
        "tuned ms": f"{tuned_s * 1e3:.3f}", "default ms": f"{default_s * 1e3:.3f}",
        "tuned / default": f"{tuned_s / default_s:.3f}",
    }
    print()
    for key, value in summary.items():
        print(f"{key:40s} {value}")
        rows.append({"task": f"[model] {key}", "logged_us": None, "in_graph_us": None, "ratio": value})
    args.out.mkdir(parents=True, exist_ok=True)
    out_path = args.out / f"fidelity_{name}.csv"
    fields = ["task", "key", "tuned", "calls", "logged_us", "in_graph_us", "ratio", "repeat_costs_us", "repeat_spread"]
    with out_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k) for k in fields})
    print(f"\nwrote {out_path}")
    return 0
