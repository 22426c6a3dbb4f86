"""End-to-end latency against tuning wall time: how fast does whole-model tuning pay off?

    python -m experiments curve                                # ResNet-50 and MobileNet v2, 4 variants each
    python -m experiments curve --models resnet50 --variants gradient --trials 2000   # the must-show run
    python -m experiments curve --models tiny_resnet50 --trials 48 --checkpoint-s 5   # a minute or two

Each run tunes one model with `relay_tune.tuning.tune_model` (the library call behind `relay-tune MODEL`; the
ONNX models of `relay_tune.testing.onnx_zoo` are saved to a temporary folder and imported as `relay-tune` imports
them), with one of the VARIANTS: the gradient task scheduler or round-robin over the tasks (`--scheduler`), with
or without `--transfer-from` the log of a smaller relative (ResNet-18 for ResNet-50, MobileNet v1 for v2, tuned
first by the same script with the gradient scheduler), and "gradient-probe", the gradient scheduler whose
warm-up round measures only each task's default schedule (`warmup_trials=1`).

Curve points. Every record of the log carries the time it was measured; the tuning time of a record is the time
since its session started, plus the tuning time of the log's earlier sessions (so a run tuned in several pieces
has one clock). At every `--checkpoint-s` of tuning time, and at the end of the run, the model is built from the
records measured until then (the fastest record of each task, default schedules for tasks without one; built as
the tuner builds its result, `check_tuned_records`: a record slower in the graph than the default kernel is
dropped, and the default build is kept if it is faster end to end; `--no-check-tuned` builds every record) and the
scheduler's estimate is taken (sum over tasks of weight x best time measured so far). All builds of a model (the
default build and every checkpoint of every variant) are timed end to end together at the end, in interleaved
rounds (`experiments.timing.interleaved`, median), so every point sees the same machine; each build's
output is checked against the numpy reference interpreter first.

Outputs in `--out` (default experiments/results/tuning_curve): `curve.csv` (one row per model, variant and
checkpoint), `tuning_curve.png` (end-to-end latency and the estimate against minutes of tuning), and on stdout per
run the time it took to reach 90% of its end-to-end improvement (default build -> the run's last checkpoint).

Long runs on a shared machine: `--piece-s S` stops this invocation after S seconds of tuning in all; running the
same command again continues the unfinished runs from their logs (`--stage tune` only tunes, `--stage curve` only
builds and times the curves from the logs there).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.timing import interleaved

VARIANTS: dict[str, dict[str, Any]] = {
    "gradient": {"scheduler": "gradient"},
    "round-robin": {"scheduler": "round-robin"},
    "gradient-transfer": {"scheduler": "gradient", "transfer": True},
    "round-robin-transfer": {"scheduler": "round-robin", "transfer": True},
    "gradient-probe": {"scheduler": "gradient", "warmup_trials": 1},
}
DEFAULT_VARIANTS = ("gradient", "round-robin", "gradient-transfer", "round-robin-transfer")

# model -> the smaller relative whose log the transfer variants warm the cost model with
SOURCES = {"resnet50": "resnet18", "mobilenet_v2": "mobilenet_v1", "tiny_resnet50": "tiny_resnet18"}
MODELS = ("resnet50", "mobilenet_v2", "resnet18", "mobilenet_v1", "tiny_resnet50", "tiny_resnet18")
SHARE = 0.9


def load_model(name: str, folder: Path) -> Any:
    """A type-checked Relay module of `name`: an ONNX network of `relay_tune.testing.onnx_zoo`, saved to `folder` and
    imported from the file; or a small ResNet of `relay_tune.testing.zoo` ("tiny_...", for quick runs)."""
    if name.startswith("tiny_resnet"):
        from relay_tune.testing import zoo

        return zoo.resnet(int(name.removeprefix("tiny_resnet")), image=32, width=8, num_classes=10)
    import onnx

    from relay_tune.frontend import from_onnx
    from relay_tune.testing.onnx_zoo import network

    path = folder / f"{name}.onnx"
    if not path.is_file():
        onnx.save(network(name), str(path))
    mod, _ = from_onnx(path)
    return mod


def run_name(model: str, variant: str) -> str:
    return f"{model}.{variant}"


# ---------------------------------------------------------------------------------------------------------------
# Tuning
# ---------------------------------------------------------------------------------------------------------------


def tuning_seconds(log: Path) -> float:
    """Tuning time spent on `log` so far (sessions summed, see `tuning_clock`)."""
    clock = tuning_clock(log)
    return clock[-1][0] if clock else 0.0


def tuning_clock(log: Path) -> list[tuple[float, Any]]:
    """(tuning seconds, record) for every record of `log`, in log order: the record's time since its session's
    start, plus the length of the earlier sessions (session start to its last line)."""
    from relay_tune.records.log_format import read_events, read_records

    if not log.is_file():
        return []
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for event in read_events(log):
        if event.event == "session_start":
            starts.setdefault(event.session, event.timestamp)
        ends[event.session] = max(ends.get(event.session, 0.0), event.timestamp)
    records = read_records(log)
    for record in records:
        ends[record.session] = max(ends.get(record.session, 0.0), record.timestamp)
        starts.setdefault(record.session, record.timestamp)
    offset: dict[str, float] = {}
    total = 0.0
    for session in sorted(starts, key=starts.__getitem__):
        offset[session] = total
        total += max(0.0, ends[session] - starts[session])
    return [(offset[r.session] + max(0.0, r.timestamp - starts[r.session]), r) for r in records]


def tune_run(mod: Any, log: Path, variant: str, args: argparse.Namespace, source_log: Path | None,
             seconds_left: float | None) -> bool:
    """Tune (or continue) one run for at most `seconds_left`; True when the run is complete."""
    from relay_tune.tuning.tune_model import BuildOptions, SearchOptions, tune_model

    options = VARIANTS[variant]
    limit = args.max_tuning_s - tuning_seconds(log) if args.max_tuning_s else None
    if limit is not None and limit <= 0:
        return True
    bounds = [x for x in (limit, seconds_left) if x is not None]
    timeout = min(bounds) if bounds else None
    transfer = [source_log] if options.get("transfer") and source_log is not None else []
    print(f"tuning {log.stem}: {args.trials} trials" + (f", {timeout:.0f} s at most" if timeout else "")
          + (f", transfer from {source_log.name}" if transfer else ""), flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search = SearchOptions(seed=args.seed, timeout=timeout, scheduler=options["scheduler"],
                               warmup_trials=options.get("warmup_trials"), transfer_from=transfer,
                               batch_size=args.batch)
        result = tune_model(mod, args.target, args.trials, log, search=search,
                            build=BuildOptions(measure_latency=False))
    done = result.summary.trials_done
    print(f"  {done} trials in the log, {tuning_seconds(log):.0f} s of tuning", flush=True)
    if result.interrupted:
        raise KeyboardInterrupt
    # Complete unless this invocation's piece ended it (the run's own time limit also completes it).
    return not result.timed_out or (limit is not None and (seconds_left is None or limit <= seconds_left))


def tune_all(args: argparse.Namespace, folder: Path) -> bool:
    """Tune every run that is not complete (sources first); False when `--piece-s` ended this invocation."""
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    plan: list[tuple[str, str]] = []
    for model in args.models:
        source = SOURCES.get(model)
        if source and any(VARIANTS[v].get("transfer") for v in args.variants) and (source, "gradient") not in plan:
            plan.append((source, "gradient"))
        plan += [(model, v) for v in args.variants if (model, v) not in plan]
    began = time.monotonic()
    for model, variant in plan:
        log = logs / f"{run_name(model, variant)}.jsonl"
        marker = log.with_suffix(".done")
        if marker.exists():
            continue
        left = None if args.piece_s is None else args.piece_s - (time.monotonic() - began)
        if left is not None and left <= 0:
            return False
        source = SOURCES.get(model)
        source_log = logs / f"{run_name(source, 'gradient')}.jsonl" if source else None
        if tune_run(load_model(model, folder), log, variant, args, source_log, left):
            marker.write_text("complete\n")
        else:
            return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Curves
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Point:
    model: str
    variant: str
    seconds: float
    trials: int
    estimate_s: float | None
    tasks_without_record: int
    built: Any = None
    e2e_s: float | None = None


def checkpoints(total: float, every: float) -> list[float]:
    """Tuning times to take points at: 0, every `every` seconds, and the end."""
    points = [0.0]
    while points[-1] + every < total:
        points.append(points[-1] + every)
    return [*points, total] if total > 0 else points


def curve_points(model: str, variant: str, mod: Any, tasks: Sequence[Any], log: Path, every: float,
                 target: Any, builds: dict[tuple[str, ...], Any], check: Any, check_tuned: bool = True
                 ) -> list[Point]:
    """One point per checkpoint of `log`: the model built from the records so far (builds with the same configs
    are shared through `builds`, whose key () is the default build), the scheduler's estimate. check_tuned: build
    as the tuner does (`check_tuned_records`: a record slower in the graph than the default kernel is not used,
    and the default build is kept when it is faster end to end); False: every record as it is."""
    from relay_tune.compile import BuildWarning, build, check_tuned_records
    from relay_tune.records.database import MemoryDatabase
    from relay_tune.tuning.tune_model import _chosen_configs, best_steps_lookup

    clock = tuning_clock(log)
    total = clock[-1][0] if clock else 0.0
    points: list[Point] = []
    for at in checkpoints(total, every):
        so_far = [r for t, r in clock if t <= at + 1e-9]
        database = MemoryDatabase(so_far)
        estimate, missing = 0.0, 0
        for task in tasks:
            best = [r.cost for r in database.records(task.key, task.target) if r.ok and r.cost is not None]
            if best:
                estimate += task.weight * min(best)
            else:
                missing += 1
        configs = _chosen_configs(tasks, database)
        key = tuple(sorted(configs.items()))
        if key not in builds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BuildWarning)
                lookup = best_steps_lookup(tasks, database=database)
                builds[key] = (check_tuned_records(mod, target, None, lookup, default=builds[()]) if check_tuned
                               else build(mod, target, logs=lookup))
            check(builds[key])
        points.append(Point(model, variant, at, len(so_far), estimate if not missing else None, missing,
                            builds[key]))
    return points


def reference_check(mod: Any, rtol: float) -> Any:
    """A function that checks a build's output against the numpy reference interpreter (computed once)."""
    from relay_tune.interpreter import Interpreter

    state: dict[str, Any] = {}

    def check(model: Any) -> None:
        if "inputs" not in state:
            state["inputs"] = model.random_inputs(seed=0)
            state["want"] = np.asarray(Interpreter(mod).run(state["inputs"]))
        got = np.asarray(model.run(**state["inputs"]))
        scale = float(np.max(np.abs(state["want"]))) or 1.0
        np.testing.assert_allclose(got, state["want"], rtol=rtol, atol=rtol * scale)

    return check


def time_to_share(points: Sequence[Point], default_s: float, share: float, field: str = "e2e_s") -> float | None:
    """Tuning seconds until the latency (`field`: "e2e_s" measured, "estimate_s" the scheduler's) first achieved
    `share` of the run's improvement (`default_s` -> its last point); None without an improvement."""
    values = [getattr(p, field) for p in points]
    final = values[-1]
    if final is None or final >= default_s:
        return None
    goal = default_s - share * (default_s - final)
    for point, value in zip(points, values):
        if value is not None and value <= goal:
            return point.seconds
    return None


def curves(args: argparse.Namespace, folder: Path) -> list[tuple[Point, float]]:
    from relay_tune.compile import build, resolve_target
    from relay_tune.tuning.hostlock import measurement_lock
    from relay_tune.tuning.relay_task import tasks_from_module

    target = resolve_target(args.target)
    rows: list[tuple[Point, float]] = []
    for model in args.models:
        mod = load_model(model, folder)
        tasks = tasks_from_module(mod, target)
        check = reference_check(mod, args.rtol)
        default = build(mod, target)
        check(default)
        builds: dict[tuple[str, ...], Any] = {(): default}
        points: list[Point] = []
        for variant in args.variants:
            log = args.out / "logs" / f"{run_name(model, variant)}.jsonl"
            if not log.is_file():
                print(f"{model} {variant}: no log in {log.parent}; tune it first (--stage tune)")
                continue
            points += curve_points(model, variant, mod, tasks, log, args.checkpoint_s, target, builds, check,
                                   check_tuned=not args.no_check_tuned)
        distinct = list({id(b): b for b in builds.values()}.values())
        print(f"{model}: timing {len(distinct)} builds end to end, {args.rounds} interleaved rounds", flush=True)
        with measurement_lock():
            samples = interleaved({str(i): b for i, b in enumerate(distinct)}, rounds=args.rounds)
        by_id = {id(b): samples[str(i)].median for i, b in enumerate(distinct)}
        default_s = by_id[id(default)]
        for point in points:
            point.e2e_s = by_id[id(point.built)]
            rows.append((point, default_s))
        print(f"{model}: default schedules {default_s * 1e3:.2f} ms")
        for variant in args.variants:
            mine = [p for p in points if p.variant == variant]
            if not mine:
                continue
            last = mine[-1]
            assert last.e2e_s is not None
            speedup = default_s / last.e2e_s
            reach = time_to_share(mine, default_s, SHARE)
            print(f"  {variant}: {last.trials} trials, {last.seconds / 60:.1f} min of tuning -> "
                  f"{last.e2e_s * 1e3:.2f} ms end to end ({speedup:.3f}x); {SHARE:.0%} of that improvement after "
                  + (f"{reach / 60:.1f} min" if reach is not None else "- (no improvement)")
                  + (f" (an improvement under {args.noise:.0%}: within the timing noise)"
                     if reach is not None and speedup < 1 + args.noise else ""))
            estimated = [p for p in mine if p.estimate_s is not None]
            if estimated and estimated[-1].estimate_s is not None:
                first, final = estimated[0].estimate_s, estimated[-1].estimate_s
                assert first is not None
                at = time_to_share(estimated, first, SHARE, "estimate_s")
                print(f"  {'':>{len(variant)}}  scheduler's estimate {first * 1e3:.2f} -> {final * 1e3:.2f} ms "
                      f"({first / final:.3f}x); {SHARE:.0%} of that improvement after "
                      + (f"{at / 60:.1f} min" if at is not None else "- (no improvement)"))
    return rows


def write_csv(rows: list[tuple[Point, float]], path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["model", "variant", "tuning_s", "trials", "e2e_ms", "default_e2e_ms", "speedup",
                      "estimate_ms", "tasks_without_record"])
        for p, default_s in rows:
            assert p.e2e_s is not None
            out.writerow([p.model, p.variant, f"{p.seconds:.1f}", p.trials, f"{p.e2e_s * 1e3:.4f}",
                          f"{default_s * 1e3:.4f}", f"{default_s / p.e2e_s:.4f}",
                          "" if p.estimate_s is None else f"{p.estimate_s * 1e3:.4f}", p.tasks_without_record])


def plot(rows: list[tuple[Point, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p.model for p, _ in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [(p, d) for p, d in rows if p.model == model]
        default_s = mine[0][1]
        for i, variant in enumerate(dict.fromkeys(p.variant for p, _ in mine)):
            pts = [p for p, _ in mine if p.variant == variant]
            color = f"C{i}"
            minutes = [p.seconds / 60 for p in pts]
            ax.plot(minutes, [p.e2e_s * 1e3 for p in pts if p.e2e_s is not None], "o-", color=color,
                    label=f"{variant} (measured)")
            est = [(m, p.estimate_s * 1e3) for m, p in zip(minutes, pts) if p.estimate_s is not None]
            if est:
                ax.plot(*zip(*est), "--", color=color, alpha=0.6, label=f"{variant} (estimate)")
        ax.axhline(default_s * 1e3, color="grey", lw=0.8, ls=":", label="default schedules")
        ax.set_title(model)
        ax.set_xlabel("tuning time (min)")
        ax.set_ylabel("end-to-end latency (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="resnet50,mobilenet_v2", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--trials", type=int, default=2000, help="trials of each run (the transfer sources too)")
    parser.add_argument("--max-tuning-s", type=float, help="end each run after this much tuning time")
    parser.add_argument("--piece-s", type=float, help="stop this invocation after this much tuning; run again to "
                        "continue")
    parser.add_argument("--checkpoint-s", type=float, default=60.0, help="seconds of tuning between curve points")
    parser.add_argument("--stage", choices=("all", "tune", "curve"), default="all")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, help="trials per round of a task (default: tune_model's)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the end-to-end timing")
    parser.add_argument("--no-check-tuned", action="store_true", help="build every checkpoint from its records as "
                        "they are, without the tuner's in-graph check against the default kernels")
    parser.add_argument("--noise", type=float, default=0.03, help="an end-to-end improvement below this share "
                        "is reported as within the timing noise (default 0.03)")
    parser.add_argument("--rtol", type=float, default=1e-3, help="tolerance of the check against the interpreter")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/tuning_curve"))


def run(args: argparse.Namespace) -> int:
    args.models = [m for m in args.models.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    for name, known in (("model", MODELS), ("variant", VARIANTS)):
        unknown = [x for x in (args.models if name == "model" else args.variants) if x not in known]
        if unknown:
            raise UsageError(f"unknown {name}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.checkpoint_s <= 0 or args.trials < 1:
        raise UsageError("--checkpoint-s must be > 0 and --trials >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.stage in ("all", "tune") and not tune_all(args, folder):
            print(f"stopped after --piece-s {args.piece_s:g} s of tuning; run the same command again to continue")
            return 0
        if args.stage == "tune":
            return 0
        rows = curves(args, folder)
    if not rows:
        print("no curve points")
        return 1
    write_csv(rows, args.out / "curve.csv")
    plot(rows, args.out / "tuning_curve.png")
    print(f"wrote {args.out / 'curve.csv'} and {args.out / 'tuning_curve.png'}")
    return 0
