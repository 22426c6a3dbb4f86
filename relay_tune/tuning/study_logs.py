"""`relay-tune logs` on a tuning database, and `relay-tune logs plot`.

    relay-tune logs --storage postgresql://tuner@db/tuning              # summary of a (running) study
    relay-tune logs export --storage postgresql://tuner@db/tuning -o all.jsonl
    relay-tune logs plot logs/model.jsonl -o curves.png                 # or --storage URL

A database's records are read through an export to a temporary log, so the summary of a study is exactly the
summary of its exported log; the database adds what a log cannot know: the live workers (from the claims table:
what each one is measuring now, what it recorded, its last heartbeat) and the Optuna studies' trial states.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from relay_tune.errors import RelayTuneError
from relay_tune.records.log_format import LogEvent, TuningRecord, read_events, read_records
from relay_tune.tuning.distributed import export_records, live_workers, redact, study_overview

__all__ = ["LOG_ACTIONS", "STORAGE_ACTIONS", "latency_curve", "plot_curves", "storage_summary"]


@contextlib.contextmanager
def _exported(url: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="relay-tune-logs-") as folder:
        path = Path(folder) / "storage.jsonl"
        export_records(url, path)
        yield path


def storage_summary(args: argparse.Namespace, console: Any, summarise: Callable[[argparse.Namespace, Any], int]) -> int:
    """The summary of a study: `summarise` (the command line's log summary) over its exported records, then what
    only the database knows. The summary is passed in so that this layer never imports the command line."""
    with _exported(args.storage) as path:
        inner = argparse.Namespace(**{**vars(args), "logs": [str(path)], "label": redact(args.storage)})
        summarise(inner, console)
        budgets = [e.data.get("total_trials") for e in read_events(path) if e.event == "session_start"]
    workers = live_workers(args.storage)
    measuring = [w for w in workers if w["in_flight"] and not w["stale"]]
    dead = [w for w in workers if w["stale"]]
    recent = len(workers) - len(measuring) - len(dead)
    console.print(f"{len(measuring)} worker(s) measuring now on {len({w['host'] for w in measuring})} host(s), "
                  f"{sum(w['in_flight'] for w in measuring)} config(s) claimed")
    if recent:
        console.print(f"{recent} more active lately (a record within the grace period, no claim now: waiting for "
                      f"the last claims of others, or finished)")
    if dead:
        console.print(f"{len(dead)} dead (no heartbeat for the grace period: their claims return to the pool at "
                      f"the next claim of any worker)")
    for worker in workers:
        state = "dead" if worker["stale"] else "measuring" if worker["in_flight"] else "no claim"
        console.print(f"  {worker['worker']} (host {worker['host']}): {state}, {worker['in_flight']} claimed, "
                      f"{worker['recorded']} recorded, last heartbeat or record {worker['last_beat_s']:.1f} s ago",
                      markup=False, highlight=False)
    overview = study_overview(args.storage)
    running = sum(s["states"].get("RUNNING", 0) for s in overview)
    failed = sum(s["states"].get("FAIL", 0) for s in overview)
    budget = f"; budget of the latest session: {budgets[-1]} trials" if budgets and budgets[-1] is not None else ""
    console.print(f"{len(overview)} Optuna studies: {running} trial(s) RUNNING, {failed} failed or given up "
                  f"(stale claims included){budget}")
    return 0


def storage_export(args: argparse.Namespace, console: Any) -> int:
    if not args.output:
        raise RelayTuneError("logs export needs -o OUT.jsonl")
    if Path(args.output).exists() and not args.force:
        raise RelayTuneError(f"{args.output} exists; choose another output or pass --force to replace it")
    count = export_records(args.storage, args.output)
    console.print(f"wrote {count} record(s) of {redact(args.storage)} to {args.output}")
    return 0


def export_without_storage(args: argparse.Namespace, console: Any) -> int:
    raise RelayTuneError("logs export reads a tuning database: relay-tune logs export --storage URL -o OUT.jsonl "
                         "(to combine log files, use logs merge)")


def plot_command(args: argparse.Namespace, console: Any) -> int:
    if not args.output:
        raise RelayTuneError("logs plot needs -o FILE.png")
    with contextlib.ExitStack() as stack:
        sources: list[str | os.PathLike[str]] = list(args.logs)
        if args.storage:
            sources.append(stack.enter_context(_exported(args.storage)))
        records, events = read_records(sources), read_events(sources)
        if not any(r.ok for r in records):
            raise RelayTuneError("nothing to plot: no valid measurement in " + ", ".join(map(str, sources)))
        path = plot_curves(records, events, args.output)
    console.print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Curves
# ---------------------------------------------------------------------------------------------------------------


def task_weights(events: Sequence[LogEvent]) -> dict[tuple[str, str], int]:
    """(workload key, target) -> occurrences in the model, from the session headers (1 when unknown)."""
    weights: dict[tuple[str, str], int] = {}
    for event in events:
        if event.event == "session_start":
            for task in event.data.get("tasks", []):
                weights[(str(task.get("workload_key")), str(task.get("target")))] = int(task.get("weight", 1))
    return weights


def best_so_far(records: Sequence[TuningRecord]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per (workload key, target): (timestamp, best valid cost so far) at each improvement, in time order."""
    curves: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for record in sorted(records, key=lambda r: r.timestamp):
        cost = record.cost
        if cost is None:
            continue
        curve = curves.setdefault((record.workload_key, record.target), [])
        if not curve or cost < curve[-1][1]:
            curve.append((record.timestamp, cost))
    return curves


def latency_curve(records: Sequence[TuningRecord], events: Sequence[LogEvent]) -> list[tuple[float, float]]:
    """(timestamp, estimated model latency) after each measurement, from the moment every task that has a valid
    measurement at all has one (tasks never measured validly are left out: they run default code either way).

    The estimate is the sum over tasks of occurrences x best time so far: the model's time in its kernels.
    """
    weights = task_weights(events)
    keys = {(r.workload_key, r.target) for r in records if r.ok}
    best: dict[tuple[str, str], float] = {}
    curve: list[tuple[float, float]] = []
    for record in sorted(records, key=lambda r: r.timestamp):
        key = (record.workload_key, record.target)
        cost = record.cost
        if cost is not None and key in keys and (key not in best or cost < best[key]):
            best[key] = cost
        if len(best) == len(keys):
            curve.append((record.timestamp, sum(weights.get(k, 1) * c for k, c in best.items())))
    return curve


def plot_curves(records: Sequence[TuningRecord], events: Sequence[LogEvent],
                output: str | os.PathLike[str]) -> Path:
    """Two panels over wall time: best-so-far time of each task (relative to its first valid measurement, the
    default schedule when the run measured it first) and the estimated end-to-end latency."""
    try:
        import matplotlib
    except ImportError:
        raise RelayTuneError("logs plot needs matplotlib: pip install 'relay-tune[analysis]'") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    start = min(r.timestamp for r in records)
    descriptions = {(r.workload_key, r.target): r.description or r.workload_key[:12] for r in records}
    fig, (tasks_ax, model_ax) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    for key, curve in sorted(best_so_far(records).items(), key=lambda item: descriptions[item[0]]):
        first = curve[0][1]
        xs = [(t - start) / 60 for t, _ in curve]
        ys = [first / c for _, c in curve]
        end = (max(r.timestamp for r in records) - start) / 60
        tasks_ax.step([*xs, end], [*ys, ys[-1]], where="post", label=f"{descriptions[key][:48]} "
                      f"({curve[-1][1] * 1e6:.1f} us)")
    tasks_ax.set_ylabel("speedup of the best kernel so far\nover the task's first valid one")
    tasks_ax.set_title("best so far per task")
    tasks_ax.grid(alpha=0.3)
    tasks_ax.legend(fontsize=7, loc="upper left")
    latency = latency_curve(records, events)
    if latency:
        model_ax.step([(t - start) / 60 for t, _ in latency], [v * 1e6 for _, v in latency], where="post")
        model_ax.set_title(f"estimated end-to-end latency (sum over tasks of occurrences x best kernel time): "
                           f"{latency[0][1] * 1e6:.1f} -> {latency[-1][1] * 1e6:.1f} us")
    else:
        model_ax.set_title("estimated end-to-end latency: not every task has a valid kernel yet")
    model_ax.set_ylabel("us per inference")
    model_ax.set_xlabel(f"minutes since the first measurement ({len(records)} measurements)")
    model_ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


Action = Callable[[argparse.Namespace, Any], int]
STORAGE_ACTIONS: dict[str, Action] = {"export": storage_export, "plot": plot_command}  # and storage_summary
LOG_ACTIONS: dict[str, Action] = {"export": export_without_storage, "plot": plot_command}
