"""`tune`: the tuning loop that ties tasks, search, builder, runner, scheduler and log together.

Each round the scheduler picks a task, its search strategy proposes a batch of unmeasured configs (the task's
default schedule first, so every task has a baseline), the builder compiles them in parallel, and the runner
measures them one at a time. Every measurement is appended to the log the moment it exists, so an interrupt or a
crash loses at most the candidate in flight.

The log is the state: a run with the same log (and storage) resumes. Records of these tasks already in the log
count against `total_trials`, the scheduler's view of each task is rebuilt from them, and the search never
measures a logged config again. Ctrl-C ends the run cleanly and returns the partial summary. Several processes
may tune into the same log and storage at once: they share the budget (re-counted from the log every round, so
the total overshoots by at most one round per extra process) and never measure each other's configs.
"""

from __future__ import annotations

import os
import platform
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import llvmlite
import numpy

from relay_tune.errors import raised_by_interrupt
from relay_tune.records.database import CurrentSpaces, Database, JsonLinesDatabase
from relay_tune.records.log_format import LogEvent, TuningRecord, host_cpu_name
from relay_tune.records.measure import MeasureInput, MeasureResult
from relay_tune.tuning.builder import Builder, LocalBuilder
from relay_tune.tuning.progress import ProgressCallback, TaskInfo, TrialEvent, TunePlan
from relay_tune.tuning.runner import LocalRunner, Runner
from relay_tune.tuning.scheduler import GradientScheduler, TaskProgress, TaskScheduler
from relay_tune.tuning.search import SearchStrategy, StrategyFactory, optuna_search
from relay_tune.tuning.summary import TaskSummary, TuneSummary
from relay_tune.tuning.task import TuneTask
from relay_tune.version import __version__
from search_space import Config

DEFAULT_STORAGE = "default"


def default_storage_path(log_path: str | os.PathLike[str]) -> Path:
    """logs/model.jsonl -> logs/model.optuna.journal (the embedded Optuna storage beside the log)."""
    path = Path(log_path)
    return path.with_name(path.stem + ".optuna.journal")


def _versions() -> dict[str, str]:
    # start-up: optuna takes ~0.2 s to import; `relay_tune.tuning` (the compiler reads its logs) must not pay it
    import optuna

    return {"relay_tune": __version__, "optuna": optuna.__version__, "llvmlite": llvmlite.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()}


def tune(
    tasks: Sequence[TuneTask],
    total_trials: int,
    log_path: str | os.PathLike[str],
    *,
    storage: str | os.PathLike[str] | None = DEFAULT_STORAGE,
    builder: Builder | None = None,
    runner: Runner | None = None,
    strategy: StrategyFactory | None = None,
    scheduler: TaskScheduler | None = None,
    progress: ProgressCallback | None = None,
    batch_size: int = 8,
    seed: int = 0,
    measure_default: bool = True,
    fsync: bool = False,
    database: Database | None = None,
    wait_poll_s: float = 1.0,
) -> TuneSummary:
    """Tune `tasks` with a global budget of `total_trials` measurements, logging to `log_path`.

    storage: Optuna storage for the default search ("default": a journal file beside the log; None: in memory;
    or a path / URL). Ignored when `strategy` is given. builder/runner: default `LocalBuilder()`/`LocalRunner()`
    (created and closed here; ones passed in are left open for reuse). scheduler: default `GradientScheduler`.
    database: where records go (default: the JSON-lines log at `log_path`); a database shared by several
    machines (`relay_tune.tuning.distributed.PostgresDatabase`) makes `total_trials` one budget for all of them.
    wait_poll_s: how often a worker whose share is claimed re-checks the claims of others still in flight.
    """
    tasks = list(tasks)
    if total_trials < 0 or batch_size < 1:
        raise ValueError("total_trials must be >= 0 and batch_size >= 1")
    seen: set[tuple[str, str]] = set()
    for task in tasks:
        if (task.key, task.target) in seen:
            raise ValueError(f"task {task.description!r} appears twice; merge duplicates by adding their weights")
        seen.add((task.key, task.target))

    started = time.monotonic()
    log_path = Path(log_path)
    if database is None:
        database = JsonLinesDatabase(log_path, fsync=fsync)
    # Records written under another schedule space (an older version, a compute that changed) stay in the log but
    # neither count against the budget nor warm the search: those tasks are tuned anew.
    database = CurrentSpaces(database, tasks)
    if strategy is None:
        store = default_storage_path(log_path) if storage == DEFAULT_STORAGE else storage
        strategy = optuna_search(storage=store, seed=seed)
    scheduler = scheduler or GradientScheduler(seed=seed)
    progress = progress or ProgressCallback()
    own_builder, own_runner = builder is None, runner is None
    builder = builder or LocalBuilder()
    runner = runner or LocalRunner()
    session = uuid.uuid4().hex[:12]

    states = [TaskProgress.from_records(i, float(t.weight), database.records(t.key, t.target), batch_size)
              for i, t in enumerate(tasks)]
    for state in states:
        reason = scheduler.stop_reason(state)
        if reason is not None:
            state.stopped = reason
    strategies: list[SearchStrategy | None] = [None] * len(tasks)
    defaults = [t.default_config() for t in tasks]
    spent = sum(s.trials for s in states)
    measured_now = 0
    seconds = Counter[str]()
    interrupted = False

    database.log_event(LogEvent("session_start", session, data={
        "total_trials": total_trials, "trials_in_log": spent, "batch_size": batch_size, "seed": seed,
        "scheduler": getattr(scheduler, "description", type(scheduler).__name__),
        "search": getattr(strategy, "description", repr(strategy)),
        "host_cpu": host_cpu_name(), "versions": _versions(),
        "tasks": [{"workload_key": t.key, "target": t.target, "description": t.description, "weight": t.weight,
                   "flops": t.flops, "space_size": t.space.size(), "default_config": d.to_dict()}
                  for t, d in zip(tasks, defaults)],
    }))
    progress.on_start(TunePlan(
        tuple(TaskInfo(i, t.key, t.description, t.weight, t.flops, t.space.size()) for i, t in enumerate(tasks)),
        total_trials, spent, batch_size, str(log_path), session))

    def estimate() -> tuple[float | None, int]:
        parts = [s.weight * s.best_cost for s in states if s.best_cost is not None]
        return (sum(parts) if parts else None), sum(1 for s in states if s.best_cost is None)

    def stop(index: int, reason: str) -> None:
        states[index].stopped = reason
        database.log_event(LogEvent("task_stopped", session, data={
            "workload_key": tasks[index].key, "target": tasks[index].target, "reason": reason,
            "trials": states[index].trials}))
        progress.on_task_stopped(index, reason)

    full = False  # a shared budget was all claimed at the last look
    try:
        while True:
            # Re-count from the log: other processes tuning into the same log (or database) share the budget.
            tick = time.monotonic()
            recorded = sum(len(database.records(t.key, t.target)) for t in tasks)
            seconds["storage"] += time.monotonic() - tick
            if recorded >= total_trials or (not database.shared_budget and max(spent, recorded) >= total_trials):
                break
            index = scheduler.next_task(states)
            if index is None:
                break
            task, state = tasks[index], states[index]
            search = strategies[index]
            if search is None:
                search = strategies[index] = strategy(task, database)
                if measure_default:
                    search.prioritize([defaults[index]])
            want = batch_size
            allowance = scheduler.allowance(state)
            if allowance is not None:
                want = min(want, allowance)
            tick = time.monotonic()
            search.prepare(want)  # the expensive part of proposing (a cost model's ranking), outside any lock
            seconds["search"] += time.monotonic() - tick
            configs: list[Config] = []
            if database.shared_budget:
                # Workers sharing a database: propose, then claim what the one budget has room for, in one call
                # that holds the budget lock inside the server only (`Database.claim`).
                if full:  # the last claim found the budget taken: look (cheaply) before proposing again
                    tick = time.monotonic()
                    _, recorded, in_flight = database.claim(tasks, total_trials, task, [])
                    seconds["storage"] += time.monotonic() - tick
                    if recorded >= total_trials:
                        break
                    if recorded + in_flight >= total_trials:
                        time.sleep(wait_poll_s)  # in case a worker holding claims dies
                        continue
                tick = time.monotonic()
                proposed = search.propose(want)
                seconds["search"] += time.monotonic() - tick
                tick = time.monotonic()
                configs, recorded, in_flight = database.claim(tasks, total_trials, task, proposed)
                seconds["storage"] += time.monotonic() - tick
                seconds["claim"] += time.monotonic() - tick
                seconds["rounds"] += 1
                spent = recorded + in_flight
                full = spent + len(configs) >= total_trials
                lost = [c for c in proposed if c not in configs]
                if lost:
                    search.discard(lost)
                if recorded >= total_trials:
                    break
                if proposed and not configs:
                    continue  # the budget is taken (`full`), or every proposal was claimed by another worker
            else:
                spent = max(spent, recorded)
                want = min(want, total_trials - spent)
                if want > 0:
                    tick = time.monotonic()
                    configs = search.propose(want)
                    seconds["search"] += time.monotonic() - tick
            if not configs:
                stop(index, "no unmeasured config left in the search space")
                continue
            progress.on_round(index, len(configs))
            tick = time.monotonic()
            built = builder.build(task, configs)
            seconds["build"] += time.monotonic() - tick
            inputs: list[MeasureInput] = []
            results: list[MeasureResult] = []
            tick = time.monotonic()
            # the round's kernels are timed together, their repeats interleaved (`Runner.run_batch`)
            run_results = iter(runner.run_batch(task, [b.artifact for b in built if b.artifact is not None]))
            seconds["run"] += time.monotonic() - tick
            for config, build_result in zip(configs, built, strict=True):
                run_result = next(run_results) if build_result.artifact is not None else None
                result = MeasureResult.combine(build_result, run_result)
                tick = time.monotonic()
                # A shared database may refuse a record (its claim was given away as stale meanwhile): then the
                # measurement does not count against the budget; the search still learns from it.
                accepted = database.commit(TuningRecord.from_measurement(
                    task.key, task.target, config, result, description=task.description, flops=task.flops,
                    trial=state.trials, strategy="default" if config == defaults[index] else search.name,
                    session=session, timing=runner.timing_kind))
                seconds["storage"] += time.monotonic() - tick
                if accepted is not False:
                    spent += 1
                    measured_now += 1
                state.observe(result)
                inputs.append(MeasureInput(task.key, config))
                results.append(result)
                latency, missing = estimate()
                cost = result.cost
                progress.on_trial(TrialEvent(
                    trials_done=spent, total_trials=total_trials, task_index=index,
                    task_description=task.description, config=config, result=result,
                    gflops=task.flops / cost / 1e9 if cost and task.flops > 0 else None,
                    best_gflops=task.flops / state.best_cost / 1e9 if state.best_cost and task.flops > 0 else None,
                    best_cost=state.best_cost, estimated_latency=latency, tasks_without_kernel=missing,
                    elapsed_seconds=time.monotonic() - started))
            tick = time.monotonic()
            search.update(inputs, results)
            seconds["search"] += time.monotonic() - tick
            state.end_round()
            reason = scheduler.stop_reason(state)
            if reason is not None:
                stop(index, reason)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as err:
        if not raised_by_interrupt(err):  # a library's clean-up that failed half-way through a Ctrl-C
            raise
        interrupted = True
    finally:
        for search in strategies:
            if search is not None:
                search.close()
        release = getattr(database, "release_claims", None)
        if release is not None:  # claims of a shared database not measured go back to the pool at once
            release()
        if own_builder:
            builder.close()
        if own_runner:
            runner.close()
        seconds["total"] = time.monotonic() - started
        database.log_event(LogEvent("session_end", session, data={
            "interrupted": interrupted, "trials_this_session": measured_now, "trials_in_log": spent,
            "seconds": dict(seconds)}))

    summary = TuneSummary(
        tasks=tuple(_summarise(task, state, database.records(task.key, task.target), default)
                    for task, state, default in zip(tasks, states, defaults)),
        total_trials=total_trials, trials_done=spent, trials_this_session=measured_now, interrupted=interrupted,
        session=session, log_path=str(log_path), seconds=dict(seconds))
    progress.on_finish(summary)
    return summary


def _summarise(task: TuneTask, state: TaskProgress, records: Sequence[TuningRecord], default: Config) -> TaskSummary:
    valid = [r for r in records if r.ok]
    best = min(valid, key=lambda r: r.cost or 0.0) if valid else None
    default_costs = [r.cost for r in valid if r.config == default and r.cost is not None]
    return TaskSummary(
        key=task.key, target=task.target, description=task.description, weight=task.weight, flops=task.flops,
        trials=len(records), valid_trials=len(valid),
        errors=dict(Counter(r.error_kind.name for r in records if r.error_kind is not None)),
        best_cost=best.cost if best else None, best_config=best.config if best else None,
        default_cost=min(default_costs) if default_costs else None, stopped=state.stopped)
