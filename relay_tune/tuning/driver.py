"""`tune`: the tuning loop that ties tasks, search, builder, runner, scheduler and log together.

Each round the scheduler picks a task, its search strategy proposes a batch of unmeasured configs (the task's
default schedule first, so every task has a baseline), the builder compiles them in parallel, and the runner
measures them one at a time. Every measurement is appended to the log the moment it exists, so an interrupt or a
crash loses at most the candidate in flight.

The log is the state: a run with the same log (and storage) resumes. Records of these tasks already in the log
count against `total_trials`, the scheduler's view of each task is rebuilt from them, and the search never
measures a logged config again. Ctrl-C ends the run cleanly and returns the partial summary. Several processes
may tune into the same log and storage at once: they share the budget (re-counted from the log every round, so
the total overshoots by at most one round per extra process, `relay_tune.tuning.budget.LocalBudget`) and never
measure each other's configs. Workers on several machines share one exact budget through a database
(`relay_tune.tuning.distributed.SharedBudget`).

`TuningLoop` holds one run's state; each of its steps (pick a task, ask the budget for a round, build, run,
record, end the round) is one method. Progress and the seconds spent per phase go to the callbacks
(`relay_tune.tuning.progress`).
"""

from __future__ import annotations

import os
import platform
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import llvmlite
import numpy

from relay_tune.errors import raised_by_interrupt
from relay_tune.records.database import CurrentSpaces, Database, JsonLinesDatabase
from relay_tune.records.log_format import LogEvent, TuningRecord, host_cpu_name
from relay_tune.records.measure import MeasureInput, MeasureResult
from relay_tune.tuning.budget import BudgetFactory, LocalBudget, Next
from relay_tune.tuning.builder import Builder, LocalBuilder
from relay_tune.tuning.progress import (
    Callbacks,
    PhaseTimer,
    PhaseTimes,
    ProgressCallback,
    TaskInfo,
    TrialEvent,
    TunePlan,
)
from relay_tune.tuning.runner import LocalRunner, Runner
from relay_tune.tuning.scheduler import GradientScheduler, TaskProgress, TaskScheduler
from relay_tune.tuning.search import SearchStrategy, StrategyFactory, optuna_search
from relay_tune.tuning.summary import TaskSummary, TuneSummary, summarise_task
from relay_tune.tuning.task import TuneTask
from relay_tune.version import __version__
from search_space import Config

__all__ = ["DEFAULT_STORAGE", "TaskSummary", "TuneSummary", "TuningLoop", "default_storage_path", "tune"]

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
    budget: BudgetFactory | None = None,
) -> TuneSummary:
    """Tune `tasks` with a global budget of `total_trials` measurements, logging to `log_path`.

    storage: Optuna storage for the default search ("default": a journal file beside the log; None: in memory;
    or a path / URL). Ignored when `strategy` is given. builder/runner: default `LocalBuilder()`/`LocalRunner()`
    (created and closed here; ones passed in are left open for reuse). scheduler: default `GradientScheduler`.
    database: where records go (default: the JSON-lines log at `log_path`). budget: how the budget is counted
    (default: `LocalBudget`, from the log); workers sharing a `relay_tune.tuning.distributed.PostgresDatabase`
    pass `SharedBudget.factory(database)`, which makes `total_trials` one budget for all of them.
    """
    started = time.monotonic()
    tasks = list(tasks)
    _check_arguments(tasks, total_trials, batch_size)
    log_path = Path(log_path)
    if strategy is None:
        store = default_storage_path(log_path) if storage == DEFAULT_STORAGE else storage
        strategy = optuna_search(storage=store, seed=seed)
    loop = TuningLoop(
        tasks, total_trials, log_path, database=database or JsonLinesDatabase(log_path, fsync=fsync),
        builder=builder or LocalBuilder(), runner=runner or LocalRunner(), strategy=strategy,
        scheduler=scheduler or GradientScheduler(seed=seed), progress=progress or ProgressCallback(),
        budget=budget or LocalBudget, batch_size=batch_size, seed=seed, measure_default=measure_default,
        started=started)
    loop.close_builder, loop.close_runner = builder is None, runner is None
    return loop.run()


def _check_arguments(tasks: Sequence[TuneTask], total_trials: int, batch_size: int) -> None:
    if total_trials < 0 or batch_size < 1:
        raise ValueError("total_trials must be >= 0 and batch_size >= 1")
    seen: set[tuple[str, str]] = set()
    for task in tasks:
        if (task.key, task.target) in seen:
            raise ValueError(f"task {task.description!r} appears twice; merge duplicates by adding their weights")
        seen.add((task.key, task.target))


class TuningLoop:
    """One run of `tune`: the tasks' progress, their searches, the budget, and the round by round loop.

    Records written under another schedule space (an older version, a compute that changed) stay in the log but
    neither count against the budget nor warm the search (`CurrentSpaces`): those tasks are tuned anew.
    `close_builder`/`close_runner`: close them when the run ends (they were made for it).
    """

    def __init__(self, tasks: Sequence[TuneTask], total_trials: int, log_path: Path, *, database: Database,
                 builder: Builder, runner: Runner, strategy: StrategyFactory, scheduler: TaskScheduler,
                 progress: ProgressCallback, budget: BudgetFactory, batch_size: int, seed: int,
                 measure_default: bool, started: float) -> None:
        self.tasks = list(tasks)
        self.total_trials = total_trials
        self.log_path = log_path
        self.database = CurrentSpaces(database, self.tasks)
        self.builder, self.runner, self.strategy, self.scheduler = builder, runner, strategy, scheduler
        self.batch_size, self.seed, self.measure_default = batch_size, seed, measure_default
        self.close_builder = self.close_runner = False
        self.started = started
        self.session = uuid.uuid4().hex[:12]
        self.times = PhaseTimes()
        self.progress = Callbacks([progress, self.times])
        self.timer = PhaseTimer(self.progress)
        self.states = [TaskProgress.from_records(i, float(t.weight), self.database.records(t.key, t.target),
                                                 batch_size) for i, t in enumerate(self.tasks)]
        for state in self.states:
            reason = scheduler.stop_reason(state)
            if reason is not None:
                state.stopped = reason
        self.searches: list[SearchStrategy | None] = [None] * len(self.tasks)
        self.defaults = [t.default_config() for t in self.tasks]
        self.budget = budget(self.tasks, total_trials, sum(s.trials for s in self.states))
        self.measured_now = 0
        self.interrupted = False

    # -- the run ---------------------------------------------------------------------------------------------

    def run(self) -> TuneSummary:
        """Tune until the budget is spent, every task stopped or Ctrl-C; log the session; return its summary."""
        self._announce()
        try:
            while self._round():
                pass
        except KeyboardInterrupt:
            self.interrupted = True
        except Exception as err:
            if not raised_by_interrupt(err):  # a library's clean-up that failed half-way through a Ctrl-C
                raise
            self.interrupted = True
        finally:
            self._close()
        return self._finish()

    def _announce(self) -> None:
        tasks, spent = self.tasks, self.budget.spent
        self.database.log_event(LogEvent("session_start", self.session, data={
            "total_trials": self.total_trials, "trials_in_log": spent, "batch_size": self.batch_size,
            "seed": self.seed, "scheduler": getattr(self.scheduler, "description", type(self.scheduler).__name__),
            "search": getattr(self.strategy, "description", repr(self.strategy)),
            "host_cpu": host_cpu_name(), "versions": _versions(),
            "tasks": [{"workload_key": t.key, "target": t.target, "description": t.description, "weight": t.weight,
                       "flops": t.flops, "space_size": t.space.size(), "default_config": d.to_dict()}
                      for t, d in zip(tasks, self.defaults)],
        }))
        self.progress.on_start(TunePlan(
            tuple(TaskInfo(i, t.key, t.description, t.weight, t.flops, t.space.size()) for i, t in enumerate(tasks)),
            self.total_trials, spent, self.batch_size, str(self.log_path), self.session))

    def _round(self) -> bool:
        """Pick a task and measure one round of it; False when the run ends."""
        # Re-count from the log: other processes tuning into the same log (or database) share the budget.
        with self.timer("storage"):
            recorded = sum(len(self.database.records(t.key, t.target)) for t in self.tasks)
        if self.budget.exhausted(recorded):
            return False
        index = self.scheduler.next_task(self.states)
        if index is None:
            return False
        search, want = self._search(index), self._want(index)
        with self.timer("search"):
            search.prepare(want)  # the expensive part of proposing (a cost model's ranking), outside any lock
        grant = self.budget.grant(self.tasks[index], search, want, recorded, self.timer)
        if grant.next is not Next.MEASURE:
            return grant.next is Next.RETRY
        if not grant.configs:
            self._stop(index, "no unmeasured config left in the search space")
            return True
        self._measure(index, search, grant.configs)
        self._end_round(index)
        return True

    def _search(self, index: int) -> SearchStrategy:
        """The task's search, made on its first round (proposing the default schedule first)."""
        search = self.searches[index]
        if search is None:
            search = self.searches[index] = self.strategy(self.tasks[index], self.database)
            if self.measure_default:
                search.prioritize([self.defaults[index]])
        return search

    def _want(self, index: int) -> int:
        allowance = self.scheduler.allowance(self.states[index])
        return self.batch_size if allowance is None else min(self.batch_size, allowance)

    # -- one round -------------------------------------------------------------------------------------------

    def _measure(self, index: int, search: SearchStrategy, configs: list[Config]) -> None:
        """Build and time `configs`, record each measurement, and tell the search."""
        task = self.tasks[index]
        self.progress.on_round(index, len(configs))
        with self.timer("build"):
            built = self.builder.build(task, configs)
        with self.timer("run"):
            # the round's kernels are timed together, their repeats interleaved (`Runner.run_batch`)
            run_results = iter(self.runner.run_batch(task, [b.artifact for b in built if b.artifact is not None]))
        inputs: list[MeasureInput] = []
        results: list[MeasureResult] = []
        for config, build_result in zip(configs, built, strict=True):
            run_result = next(run_results) if build_result.artifact is not None else None
            result = MeasureResult.combine(build_result, run_result)
            self._record(index, search, config, result)
            inputs.append(MeasureInput(task.key, config))
            results.append(result)
        with self.timer("search"):
            search.update(inputs, results)

    def _record(self, index: int, search: SearchStrategy, config: Config, result: MeasureResult) -> None:
        """Commit one measurement to the database and report it."""
        task, state = self.tasks[index], self.states[index]
        with self.timer("storage"):
            # A shared database may refuse a record (its claim was given away as stale meanwhile): then the
            # measurement does not count against the budget; the search still learns from it.
            accepted = self.database.commit(TuningRecord.from_measurement(
                task.key, task.target, config, result, description=task.description, flops=task.flops,
                trial=state.trials, strategy="default" if config == self.defaults[index] else search.name,
                session=self.session, timing=self.runner.timing_kind))
        if accepted is not False:
            self.budget.measured()
            self.measured_now += 1
        state.observe(result)
        self.progress.on_trial(self._trial_event(index, config, result))

    def _trial_event(self, index: int, config: Config, result: MeasureResult) -> TrialEvent:
        task, state = self.tasks[index], self.states[index]
        parts = [s.weight * s.best_cost for s in self.states if s.best_cost is not None]
        cost = result.cost
        return TrialEvent(
            trials_done=self.budget.spent, total_trials=self.total_trials, task_index=index,
            task_description=task.description, config=config, result=result,
            gflops=task.flops / cost / 1e9 if cost and task.flops > 0 else None,
            best_gflops=task.flops / state.best_cost / 1e9 if state.best_cost and task.flops > 0 else None,
            best_cost=state.best_cost, estimated_latency=sum(parts) if parts else None,
            tasks_without_kernel=sum(1 for s in self.states if s.best_cost is None),
            elapsed_seconds=time.monotonic() - self.started)

    def _end_round(self, index: int) -> None:
        state = self.states[index]
        state.end_round()
        reason = self.scheduler.stop_reason(state)
        if reason is not None:
            self._stop(index, reason)

    def _stop(self, index: int, reason: str) -> None:
        self.states[index].stopped = reason
        self.database.log_event(LogEvent("task_stopped", self.session, data={
            "workload_key": self.tasks[index].key, "target": self.tasks[index].target, "reason": reason,
            "trials": self.states[index].trials}))
        self.progress.on_task_stopped(index, reason)

    # -- the end ---------------------------------------------------------------------------------------------

    def _close(self) -> None:
        """Close the searches, the budget and what was made for the run; log the session's end."""
        for search in self.searches:
            if search is not None:
                search.close()
        self.budget.close()
        if self.close_builder:
            self.builder.close()
        if self.close_runner:
            self.runner.close()
        self.progress.on_phase("total", time.monotonic() - self.started)
        self.database.log_event(LogEvent("session_end", self.session, data={
            "interrupted": self.interrupted, "trials_this_session": self.measured_now,
            "trials_in_log": self.budget.spent, "seconds": self.times.as_dict()}))

    def _finish(self) -> TuneSummary:
        summary = TuneSummary(
            tasks=tuple(summarise_task(task, state, self.database.records(task.key, task.target), default)
                        for task, state, default in zip(self.tasks, self.states, self.defaults)),
            total_trials=self.total_trials, trials_done=self.budget.spent, trials_this_session=self.measured_now,
            interrupted=self.interrupted, session=self.session, log_path=str(self.log_path),
            seconds=self.times.as_dict())
        self.progress.on_finish(summary)
        return summary
