"""`tune_model`: tune every fused workload of a model, then build the model from the tuning log.

    result = tune_model(mod, "llvm", total_trials=500, log_path="logs/resnet.jsonl",
                        search=SearchOptions(strategy="xgb", seed=1), build=BuildOptions(output="resnet.rtmod"))
    print(result.latency_before, result.latency_after)   # seconds per inference, default vs tuned schedules
    result.model.run(data=image)                         # the model built from the log

Steps: extract the tasks the build compiles (`relay_tune.tuning.relay_task.tasks_from_module`; on CUDA targets
`relay_tune.tuning.gpu_task.gpu_tasks`), tune them with one global budget through `relay_tune.tuning.tune` (the
gradient task scheduler shares the trials out; the log is appended to measurement by measurement), then build the
model twice, without and with the log, and time both.

The log is the state. Records of these tasks and this target already in the log count against `total_trials`: a
rerun of a finished run measures nothing new, an interrupted run measures only what is left, a larger budget
continues where the last run stopped. With a tuning cache (`SearchOptions.cache`, `relay_tune.records.cache`; the
command line uses the user's by default) a task tuned before on this target and CPU model, by any run into any
log, is not tuned again (unless `retune`), the run's valid records are added to the cache, and the build takes the
cache's best records too. Ctrl-C ends tuning cleanly (the result says `interrupted`, nothing is built); a `timeout` ends
it after that many seconds (the model is still built from what was measured).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from relay_tune.compile import BuildWarning, check_tuned_records, resolve_target
from relay_tune.compile import build as compile_model
from relay_tune.compile.build_cache import wait_for_stores
from relay_tune.compile.lookup import LOOKUP_CANDIDATES
from relay_tune.errors import RelayTuneError
from relay_tune.passes import precision_mode
from relay_tune.records.cache import TuningCache, records_since
from relay_tune.records.database import JsonLinesDatabase, MemoryDatabase, current_config, top_k
from relay_tune.records.log_format import LogEvent, LogWriter, read_records
from relay_tune.runtime.benchmark import EXTEND_S, LatencyComparison, compare_latency
from relay_tune.runtime.cuda import CudaUnavailableError, cuda_available, cuda_device
from relay_tune.target import Target
from relay_tune.tuning import distributed
from relay_tune.tuning.builder import Builder, LocalBuilder
from relay_tune.tuning.cuda_runner import CudaRunner
from relay_tune.tuning.distributed import is_database_url
from relay_tune.tuning.driver import DEFAULT_STORAGE, tune
from relay_tune.tuning.gpu_task import gpu_tasks
from relay_tune.tuning.hostlock import HostLockedRunner, measurement_lock
from relay_tune.tuning.progress import ProgressCallback, TaskInfo, TrialEvent, TunePlan
from relay_tune.tuning.relay_task import ReferenceWarning, tasks_from_module
from relay_tune.tuning.runner import LocalRunner, Runner, random_inputs
from relay_tune.tuning.scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress, TaskScheduler
from relay_tune.tuning.search import StrategyFactory, optuna_search, random_search
from relay_tune.tuning.summary import TuneSummary
from relay_tune.tuning.xgb_search import xgb_search

__all__ = [
    "SCHEDULERS",
    "SEARCH_STRATEGIES",
    "BuildOptions",
    "DeadlineScheduler",
    "MeasureOptions",
    "RichProgress",
    "SearchOptions",
    "TaskReport",
    "TuneModelResult",
    "best_steps_lookup",
    "default_log_path",
    "default_runner",
    "make_scheduler",
    "make_search",
    "tune_model",
]

SEARCH_STRATEGIES: tuple[str, ...] = ("xgb", "tpe", "random")
"""Names `make_search` (and `relay-tune --search`) accepts."""


def make_search(search: str, *, storage: Any = None, seed: int = 0,
                log_path: str | os.PathLike[str] | None = None,
                transfer_from: Sequence[str | os.PathLike[str]] = ()) -> StrategyFactory:
    """The search strategy factory a `--search` name stands for.

    "xgb": an XGBoost cost model trained on the measurements (and on `transfer_from`, earlier logs of other
    workloads) picks the configs the Optuna study measures, saved beside the log (`<log>.xgb.json`); "tpe":
    Optuna's TPE sampler, one study per task in `storage` (None: in memory); "random": uniformly random
    unvisited configs (a baseline without Optuna). `log_path` is the tuning log (strategies that keep files beside
    it use it).
    """
    if transfer_from and search != "xgb":
        raise RelayTuneError("transfer from earlier logs warms the cost model: it needs the xgb search")
    if search == "xgb":
        return xgb_search(storage, seed=seed, log_path=log_path, transfer_from=transfer_from)
    if search == "tpe":
        return optuna_search(storage=storage, sampler="tpe", seed=seed)
    if search == "random":
        if is_database_url(storage):  # claims on a shared database go through an Optuna study
            return optuna_search(storage=storage, sampler="random", seed=seed)
        return random_search(seed=seed)
    raise RelayTuneError(f"unknown search strategy {search!r}; choose one of {', '.join(SEARCH_STRATEGIES)}")


SCHEDULERS: tuple[str, ...] = ("gradient", "round-robin")
"""Names `make_scheduler` (and `relay-tune --scheduler`) accepts: the gradient allocation by the estimated model
latency, or every task in turn (the baseline to compare it with)."""


class DeadlineScheduler(TaskScheduler):
    """A task scheduler (the gradient one unless `inner` is given) that ends the run (no task picked) once
    `deadline` (a `time.monotonic()` value) has passed. Checked between rounds, so a run ends at most one round
    late. `options` configure the default gradient scheduler."""

    def __init__(self, deadline: float | None = None, inner: TaskScheduler | None = None, **options: Any) -> None:
        self.inner = inner if inner is not None else GradientScheduler(**options)
        super().__init__(self.inner.early_stopping, self.inner.max_consecutive_failures,
                         self.inner.max_trials_per_task, self.inner.warmup_trials)
        self.deadline = deadline
        self.expired = False

    @property
    def description(self) -> str:
        """What the log's session header calls it: the inner scheduler, and the wrapper when a deadline is set."""
        inner = getattr(self.inner, "description", type(self.inner).__name__)
        return inner if self.deadline is None else f"DeadlineScheduler({inner})"

    def next_task(self, progress: Sequence[TaskProgress]) -> int | None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.expired = True
            return None
        return self.inner.next_task(progress)

    def _pick(self, live: Sequence[TaskProgress]) -> int:
        return self.inner._pick(live)

    def stop_reason(self, progress: TaskProgress) -> str | None:
        return self.inner.stop_reason(progress)

    def allowance(self, progress: TaskProgress) -> int | None:
        return self.inner.allowance(progress)


def make_scheduler(name: str = "gradient", *, seed: int = 0, early_stopping: int | None = None,
                   warmup_trials: int | None = None) -> TaskScheduler:
    """The task scheduler a `--scheduler` name stands for ("gradient": `GradientScheduler`, seeded; "round-robin":
    `RoundRobinScheduler`). warmup_trials: trials of each task's warm-up round (None: a full batch)."""
    if name == "gradient":
        return GradientScheduler(seed=seed, early_stopping=early_stopping, warmup_trials=warmup_trials)
    if name == "round-robin":
        return RoundRobinScheduler(early_stopping=early_stopping, warmup_trials=warmup_trials)
    raise RelayTuneError(f"unknown task scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")


def target_tag(target: Any) -> str:
    """A file-name friendly tag of a target: "llvm-znver4", "cuda-sm_90"."""
    detail = target.mcpu or target.arch or "generic"
    return f"{target.kind}-{detail}".replace(" ", "_")


def default_log_path(model_path: str | os.PathLike[str], target: Any, folder: str | os.PathLike[str] = "logs") -> Path:
    """logs/<model stem>.<target tag>.jsonl (the default of `relay-tune MODEL --trials N`)."""
    return Path(folder) / f"{Path(model_path).stem}.{target_tag(resolve_target(target))}.jsonl"


@dataclass(frozen=True)
class TaskReport:
    """One task after tuning: its default and best measured times (seconds, from the log)."""

    key: str
    description: str
    family: str
    weight: int
    flops: float
    space_size: int
    trials: int
    valid_trials: int
    default_cost: float | None
    best_cost: float | None
    errors: dict[str, int]
    stopped: str | None

    @property
    def speedup(self) -> float | None:
        if self.default_cost is None or self.best_cost is None or self.best_cost <= 0:
            return None
        return self.default_cost / self.best_cost

    @property
    def best_gflops(self) -> float | None:
        if self.best_cost is None or self.best_cost <= 0 or self.flops <= 0:
            return None
        return self.flops / self.best_cost / 1e9


@dataclass(frozen=True)
class TuneModelResult:
    """What `tune_model` did. Latencies are median seconds per inference (None when not measured)."""

    tasks: tuple[TaskReport, ...]
    summary: TuneSummary
    target: str  # the target's name in the log
    log_path: Path
    storage: str | None
    search: str
    latency_before: float | None = None
    latency_after: float | None = None
    latency: LatencyComparison | None = None  # the interleaved timing both latencies come from
    model: Any = None  # the model built from the log (None when interrupted or not built)
    model_path: Path | None = None
    timed_out: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    cached_tasks: int = 0  # tasks not tuned because the tuning cache had records of them
    cache_path: Path | None = None  # the tuning cache's records file (None: no cache)
    cache_added: int = 0  # records this run added to the cache
    configs: dict[str, str] = field(default_factory=dict)  # with a cache: workload key -> config key the build took

    @property
    def interrupted(self) -> bool:
        return self.summary.interrupted

    @property
    def speedup(self) -> float | None:
        """Default over tuned latency; None when not measured or when the timing rounds disagree too much to
        support a ratio (`latency.describe()` says by how much)."""
        if self.latency is None or not self.latency.supports_ratio():
            return None
        return self.latency_before / self.latency_after if self.latency_before and self.latency_after else None


def _tasks_for(mod: Any, target: Any, opt_level: int,
               layout_planning: bool | None = None, winograd: str | None = None,
               precision: str | None = None) -> tuple[list[Any], Runner | None]:
    """The tuning tasks of `mod` on `target`, and the runner they need (None: the default CPU runner)."""
    if target.kind == "cuda":
        reason = cuda_available()
        if reason is not None:
            raise CudaUnavailableError(f"cannot tune for {target}: {reason}")
        precision_mode(precision, target)  # bf16 on a GPU target: a clear error
        return list(gpu_tasks(mod, str(target))), CudaRunner()

    return tasks_from_module(mod, target, opt_level=opt_level, layout_planning=layout_planning,
                             winograd=winograd, precision=precision), None


def _cuda_target(text: str | Any) -> Any:
    """A CUDA target for `text`, taking the GPU's own architecture when the text names none."""
    if not isinstance(text, str):
        return text
    parsed = Target.parse(text)
    if parsed.arch:
        return parsed

    reason = cuda_available()
    if reason is not None:
        raise CudaUnavailableError(f"cannot tune for {text}: {reason}")
    return Target("cuda", arch=cuda_device().arch)


# Weights rotate through this many bytes of copies while a kernel is timed: more than the last-level cache of the
# CPUs we target (32 MiB here), so each call reads its weights from memory, as in a model (runner's docstring).
COLD_WEIGHTS_BYTES = 64 << 20
COLD_WEIGHTS_ENV = "RELAY_TUNE_COLD_WEIGHTS_BYTES"
"""Overrides `COLD_WEIGHTS_BYTES`: a CPU with a larger last-level cache needs more; 0 times weights warm. The test
suite sets a small size where the size does not matter (64 MiB of copies per task cost time, not coverage)."""


def cold_weights_bytes() -> int:
    """The bytes of weight copies the tuner's runner rotates through: `$RELAY_TUNE_COLD_WEIGHTS_BYTES`, else
    `COLD_WEIGHTS_BYTES`."""
    text = os.environ.get(COLD_WEIGHTS_ENV, "").strip()
    if not text:
        return COLD_WEIGHTS_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise RelayTuneError(f"{COLD_WEIGHTS_ENV}={text!r} is not a number of bytes (an integer >= 0)")
    return value


def default_runner(check: bool = True) -> Runner:
    """The CPU runner `tune_model` measures with: at least 40 ms per timing (a slow kernel is timed call by call,
    not three calls at a time), three timings per candidate, outputs checked against the reference (`check`),
    weights cold (`cold_weights_bytes()`), each call timed in its model context (`LocalRunner`'s `in_context`, the
    default: activations just written by a parallel producer step, outputs pushed out of the cores' private caches;
    `relay_tune.runtime.context`)."""
    return LocalRunner(number=1, repeat=3, min_repeat_ms=40.0, check_correctness=check,
                       cold_weights_bytes=cold_weights_bytes())


class ReferenceUnavailableError(RelayTuneError):
    """The reference interpreter cannot compute a task's expected outputs, so measurements could not be checked."""


def check_references(tasks: Sequence[Any], seed: int = 0) -> None:
    """Run each task's reference on the runner's random inputs before any tuning: a task whose outputs could not
    be checked is an error naming the task and the reason (tune with `check=False` / `--no-check` to go on).

    A CPU task whose reference is not finite on signed inputs (a square root or logarithm of an input: the variance
    of a normalisation) has its inputs' domains found: every input is drawn non-negative, then each in turn is
    given signed values again wherever the reference stays finite. Checked and measured on those inputs, only the
    inputs that need it (the variance) are non-negative; the others keep the signed values they have in a model."""
    for task in tasks:
        try:
            _check_reference(task, seed)
        except ReferenceUnavailableError:
            if not hasattr(task, "nonnegative_inputs") or task.nonnegative_inputs:
                raise
            task.nonnegative_inputs = frozenset(range(len(task.input_specs())))
            try:
                _check_reference(task, seed)
            except ReferenceUnavailableError:
                task.nonnegative_inputs = frozenset()
                raise
            for index in sorted(task.nonnegative_inputs):
                needed = task.nonnegative_inputs
                task.nonnegative_inputs = needed - {index}
                try:
                    _check_reference(task, seed)
                except ReferenceUnavailableError:
                    task.nonnegative_inputs = needed


def _check_reference(task: Any, seed: int) -> None:
    """Raise `ReferenceUnavailableError` unless the task's reference gives finite outputs on the runner's inputs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ReferenceWarning)
        try:
            expected = task.reference(random_inputs(task.input_specs(), seed))
        except Exception as err:  # a GPU task's reference raises instead of warning
            raise ReferenceUnavailableError(
                f"the reference interpreter cannot run task {task.description} ({type(err).__name__}: {err}), "
                "so tuned kernels could not be checked; tune with --no-check to measure without the numerical "
                "check") from None
    reasons = [str(w.message) for w in caught if issubclass(w.category, ReferenceWarning)]
    if expected is None or reasons:
        reason = reasons[0] if reasons else f"task {task.description}: no reference outputs"
        raise ReferenceUnavailableError(f"{reason.replace('; outputs are not checked', '')}: tuned kernels "
                                        "could not be checked; tune with --no-check to measure without the "
                                        "numerical check")


@dataclass(frozen=True)
class SearchOptions:
    """What is tuned and how the budget is spent.

    strategy: a name of `SEARCH_STRATEGIES`. storage: the Optuna storage ("default": a journal file beside the
    log; None: in memory; a path or URL). transfer_from: earlier tuning logs (files, folders or glob patterns) whose
    measurements warm the xgb cost model. scheduler: a name of `SCHEDULERS` (how the budget is shared between
    tasks). warmup_trials: trials of each task's first round (None: a full batch, or only the default schedule where
    full batches would take more than half the budget, `warmup_trials`; 1: only its default schedule, see
    `relay_tune.tuning.scheduler`). early_stopping: rounds without improvement after which a task stops.
    batch_size: trials per round of a task (default: up to 8, fewer when the budget would not give every task a
    round). timeout: seconds of tuning before the run ends (the model is still built). task_filter: a substring of
    the task descriptions (or keys) to tune, or a predicate on tasks. cache: a tuning cache
    (`TuningCache.default()` is the user's): tasks with a valid record in it for this target and CPU model, and
    none in this log, are not tuned (unless `retune`); the run's valid records are added to it (also when
    interrupted); the build also takes its best records. None (the default here): no cache.
    """

    strategy: str = "xgb"
    storage: str | os.PathLike[str] | None = DEFAULT_STORAGE
    transfer_from: Sequence[str | os.PathLike[str]] = ()
    seed: int = 0
    scheduler: str = "gradient"
    warmup_trials: int | None = None
    early_stopping: int | None = None
    batch_size: int | None = None
    timeout: float | None = None
    task_filter: str | Callable[[Any], bool] | None = None
    cache: TuningCache | None = None
    retune: bool = False


@dataclass(frozen=True)
class MeasureOptions:
    """How candidates are built and timed.

    jobs: parallel build processes (default: one per core). check: compare every measured kernel's outputs with
    the reference interpreter's, and refuse to start (`ReferenceUnavailableError`) when the interpreter cannot
    compute them for a task; False measures without the check and says so in the log. builder/runner: measurement
    infrastructure to use instead of the defaults (closed by the caller).
    """

    jobs: int | None = None
    check: bool = True
    builder: Builder | None = None
    runner: Runner | None = None


@dataclass(frozen=True)
class BuildOptions:
    """How the model is compiled (the tasks are extracted and the model is built with the same settings), and what
    comes out of the run.

    opt_level, layout_planning, winograd, precision: as in `relay_tune.build` (None: the pipeline's default).
    output: where to save the built model. measure_latency: time the model with default and with tuned schedules.
    """

    opt_level: int = 3
    layout_planning: bool | None = None
    winograd: str | None = None
    precision: str | None = None
    output: str | os.PathLike[str] | None = None
    measure_latency: bool = True


@dataclass(frozen=True)
class _Plan:
    """What a `tune_model` run works on, decided before any measurement."""

    target: Target
    log_path: Path
    all_tasks: list[Any]  # every task of the model (after `task_filter`)
    tasks: list[Any]  # those tuned here (the others: answered by the tuning cache)
    cached_records: list[Any]  # the cache's records for this target and CPU
    gpu_runner: Runner | None  # the runner the tasks need (None: the default CPU runner)
    storage: Any  # the Optuna storage, resolved ("default" -> the journal beside the log)

    @property
    def skipped(self) -> list[Any]:
        tuning = {t.key for t in self.tasks}
        return [t for t in self.all_tasks if t.key not in tuning]


def tune_model(
    mod: Any,
    target: Any = "llvm",
    total_trials: int = 200,
    log_path: str | os.PathLike[str] = "logs/model.jsonl",
    *,
    search: SearchOptions = SearchOptions(),
    measure: MeasureOptions = MeasureOptions(),
    build: BuildOptions = BuildOptions(),
    progress: ProgressCallback | None = None,
) -> TuneModelResult:
    """Tune `mod` for `target` with a global budget of `total_trials` measurements, then build it from the log.

    `search`, `measure` and `build` say how (`SearchOptions`, `MeasureOptions`, `BuildOptions`); `progress`
    receives the tuning loop's progress (`relay_tune.tuning.progress`).
    """
    started = time.monotonic()
    plan = _plan(mod, target, total_trials, Path(log_path), search, build)
    scheduler = make_scheduler(search.scheduler, seed=search.seed, early_stopping=search.early_stopping,
                               warmup_trials=warmup_trials(search, total_trials, len(plan.tasks)))
    _check_or_note(plan, measure.check)
    database = (distributed.PostgresDatabase(os.fspath(plan.storage), mirror=plan.log_path)
                if distributed.is_database_url(plan.storage) else None)
    deadline = DeadlineScheduler(started + search.timeout if search.timeout is not None else None, scheduler)
    summary, added = _tune_tasks(plan, total_trials, search, measure, deadline, database, progress)
    tuned_at = time.monotonic()
    by_key = {task.key: _report(task, s) for task, s in zip(plan.tasks, summary.tasks)}
    by_key.update((task.key, _cached_report(task, plan.cached_records)) for task in plan.skipped)
    result = TuneModelResult(
        tasks=tuple(by_key[task.key] for task in plan.all_tasks), summary=summary, target=plan.target.log_name,
        log_path=plan.log_path, storage=None if plan.storage is None else os.fspath(plan.storage),
        search=search.strategy, timed_out=deadline.expired, cached_tasks=len(plan.skipped),
        cache_path=search.cache.path if search.cache is not None else None, cache_added=added,
        seconds={"tune": tuned_at - started})
    if summary.interrupted:
        return result
    result = _build_and_time(mod, plan, result, database, search.cache, build)
    return dataclasses.replace(result, seconds={"tune": tuned_at - started,
                                                "build_and_measure": time.monotonic() - tuned_at})


def _resolve(target: Any) -> Target:
    if isinstance(target, str) and target.split() and target.split()[0] == "cuda":
        return _cuda_target(target)
    return resolve_target(target)


def _plan(mod: Any, target: Any, total_trials: int, log_path: Path, search: SearchOptions,
          build: BuildOptions) -> _Plan:
    """The run's target, its tasks (filtered; those the tuning cache answers left out) and its storage."""
    resolved = _resolve(target)
    tasks, gpu_runner = _tasks_for(mod, resolved, build.opt_level, build.layout_planning, build.winograd,
                                  build.precision)
    task_filter = search.task_filter
    if task_filter is not None:
        keep = task_filter if callable(task_filter) else \
            (lambda t: task_filter in t.description or t.key.startswith(task_filter))
        tasks = [t for t in tasks if keep(t)]
        if not tasks:
            raise RelayTuneError(f"no task matches {task_filter!r}")
    # The cache's records for this target and CPU, read once: they decide what is skipped here and, with the log
    # (which holds what this run adds to the cache), what the build uses.
    cache = search.cache
    cached_records = cache.usable(sorted({t.target for t in tasks})) if cache is not None else []
    storage = log_path.with_name(log_path.stem + ".optuna.journal") if search.storage == DEFAULT_STORAGE \
        else search.storage
    return _Plan(resolved, log_path, tasks, _not_cached(tasks, cached_records, log_path, search), cached_records,
                 gpu_runner, storage)


def _not_cached(tasks: list[Any], cached_records: list[Any], log_path: Path, search: SearchOptions) -> list[Any]:
    """The tasks to tune: a task tuned before on this target and CPU (any model, any log) is not tuned again; a task
    this log has records of is left to the log's budget, so a larger --trials still continues it."""
    if not cached_records or search.retune or distributed.is_database_url(search.storage):
        return tasks
    cached_keys = {r.workload_key for r in cached_records}
    if log_path.is_file():
        cached_keys -= {r.workload_key for r in read_records(log_path)}
    return [t for t in tasks if t.key not in cached_keys]


def _check_or_note(plan: _Plan, check: bool) -> None:
    """Check that every task's reference runs, or note in the log that kernels are measured unchecked."""
    if check:
        check_references(plan.tasks)
    else:
        LogWriter(plan.log_path).write_one(LogEvent("numerical_check_disabled", data={
            "reason": "tuned without comparing kernel outputs with the reference interpreter (--no-check)",
            "tasks": len(plan.tasks)}))


def batch_size_for(search: SearchOptions, total_trials: int, tasks: int) -> int:
    """Trials per round of a task: `search.batch_size`, else up to 8, fewer where the budget would not give every
    task a round."""
    return search.batch_size or max(1, min(8, total_trials // max(1, tasks)))


def warmup_trials(search: SearchOptions, total_trials: int, tasks: int) -> int | None:
    """Trials of each task's warm-up round: `search.warmup_trials` if set; a full batch (None) where the caller set
    the batch size or the warm-up rounds take at most half the budget; else only the default schedule (1), so
    that the gradient scheduler shares the rest by the tasks' measured times (full batches for a CRNN's 16 tasks
    at 128 trials would be the whole budget, 8 trials each whatever a task's share of the model's time)."""
    if search.warmup_trials is not None:
        return search.warmup_trials
    if search.batch_size is not None:
        return None
    return 1 if 2 * batch_size_for(search, total_trials, tasks) * tasks > total_trials else None


def _tune_tasks(plan: _Plan, total_trials: int, search: SearchOptions, measure: MeasureOptions,
                scheduler: TaskScheduler, database: Any, progress: ProgressCallback | None) -> tuple[TuneSummary, int]:
    """Tune the plan's tasks (none: every task is in the tuning cache); the summary, and the records added to the
    tuning cache (also after Ctrl-C: what was measured is worth keeping)."""
    log_path = plan.log_path
    # every task gets its warm-up round (its default schedule measured) when the budget allows
    batch_size = batch_size_for(search, total_trials, len(plan.tasks))
    strategy = make_search(search.strategy, storage=plan.storage, seed=search.seed, log_path=log_path,
                           transfer_from=search.transfer_from)
    budget = distributed.SharedBudget.factory(database) if database is not None else None
    builder, runner = _measurement(plan, measure)
    # Other tuning processes on this machine measure in turn with this one (builds still overlap).
    measuring = runner if isinstance(runner, HostLockedRunner) else HostLockedRunner(runner)
    log_offset = log_path.stat().st_size if log_path.is_file() else 0
    added = 0
    summary = TuneSummary(tasks=(), total_trials=total_trials, trials_done=0, trials_this_session=0,
                          interrupted=False, session="", log_path=os.fspath(log_path))
    try:
        if plan.tasks:
            summary = tune(plan.tasks, total_trials, log_path, builder=builder, runner=measuring, strategy=strategy,
                           scheduler=scheduler, progress=progress, batch_size=batch_size, seed=search.seed,
                           database=database, budget=budget)
    finally:
        if measure.builder is None:
            builder.close()
        if plan.gpu_runner is not None or measure.runner is None:
            runner.close()
        if search.cache is not None:
            added = search.cache.add(records_since(log_path, log_offset))
    return summary, added


def _measurement(plan: _Plan, measure: MeasureOptions) -> tuple[Builder, Runner]:
    """The builder and the runner of the run (the caller's, or the defaults)."""
    builder = measure.builder or LocalBuilder(n_parallel=measure.jobs)
    runner = measure.runner or plan.gpu_runner or default_runner(measure.check)
    if not measure.check and hasattr(runner, "check_correctness"):
        runner.check_correctness = False
    return builder, runner


def _build_and_time(mod: Any, plan: _Plan, result: TuneModelResult, database: Any, cache: TuningCache | None,
                    build: BuildOptions) -> TuneModelResult:
    """Build the model from the log (and the cache, or the database) and time it against the default build."""
    compile_options: dict[str, Any] = {"opt_level": build.opt_level, "layout_planning": build.layout_planning,
                                       "winograd": build.winograd, "precision": build.precision}
    untuned = compile_model(mod, target=plan.target, **compile_options) if build.measure_latency else None
    lookup, configs = _lookup(plan, database, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BuildWarning)  # untuned tasks are expected with a filter or a small budget
        # A record slower in the model than the default schedule is not used (CPU targets; see build).
        # The model built before tuning is the default side of that check (not built a second time).
        model = (check_tuned_records(mod, plan.target, None, lookup, default=untuned, **compile_options)
                 if lookup is not None else untuned or compile_model(mod, target=plan.target, **compile_options))
    timed = _latencies(model, untuned) if build.measure_latency else None
    before = timed.baseline_s if timed is not None else None
    after = (before if _kept_default(model) else timed.candidate_s) if timed is not None else None
    saved = model.save(build.output) if build.output is not None and hasattr(model, "save") else None
    return dataclasses.replace(result, latency_before=before, latency_after=after, latency=timed, model=model,
                               model_path=saved, configs=configs)


def _lookup(plan: _Plan, database: Any, cache: TuningCache | None) -> tuple[Any, dict[str, str]]:
    """The schedule lookup the model is built with (None: no records), and with a cache the config each task
    takes."""
    tasks, log_path = plan.all_tasks, plan.log_path  # the build covers the cached tasks too
    if database is not None:
        return best_steps_lookup(tasks, database=database), {}  # the global best, whoever measured it
    if cache is not None:
        # the log's records and the cache's for this target and CPU: the fastest of either is built
        known = MemoryDatabase((read_records(log_path) if log_path.is_file() else []) + plan.cached_records)
        return (best_steps_lookup(tasks, database=known) if known.keys() else None), _chosen_configs(tasks, known)
    return (best_steps_lookup(tasks, [log_path]) if log_path.is_file() else None), {}


def _kept_default(model: Any) -> bool:
    """Whether the tuned-records check found the default build faster end to end and returned it."""
    check = model.build_info.get("tuned_check", {}) if hasattr(model, "build_info") else {}
    return bool(check.get("kept_default"))


def _latencies(model: Any, untuned: Any) -> LatencyComparison:
    """The default build against the one built from the records, timed in interleaved, warmed rounds."""
    check = model.build_info.get("tuned_check", {}) if hasattr(model, "build_info") else {}
    rounds = check.get("e2e_rounds")
    if rounds is not None:  # the tuned-records check timed both builds that way already
        return LatencyComparison(tuple(map(tuple, rounds["default"])), tuple(map(tuple, rounds["tuned"])))
    # Interleaved: timed one after the other, a small model's latency drifted between the two (117 vs 140 us, the
    # tuned build "slower" than the default it had just been checked against).
    wait_for_stores()  # a build-cache entry written meanwhile would share the cores with the timed calls
    with measurement_lock():
        return compare_latency(untuned, model, extend_s=EXTEND_S)


def best_steps_lookup(tasks: Sequence[Any], logs: Sequence[str | os.PathLike[str]] = (), *,
                      database: Any = None) -> Callable[[str, Any], list[Any] | None]:
    """A `relay_tune.build` schedule lookup: for each task, the steps of its fastest valid record that is a point of
    the task's current space (records written under an older space are passed over, not fatal). The records come
    from `logs`, or from `database` (a `relay_tune.tuning.Database`, e.g. the PostgreSQL one) when given."""
    if database is None:
        database = JsonLinesDatabase([Path(p) for p in logs])
    by_key = {task.key: task for task in tasks}

    def lookup(key: str, target: Any) -> list[Any] | None:
        task = by_key.get(key)
        if task is None:
            return None
        for record in database.best(key, task.target, k=LOOKUP_CANDIDATES):
            config = current_config(task, record.config)
            if config is not None:
                return list(task.steps(config))
        return None

    return lookup


def _chosen_configs(tasks: Sequence[Any], database: Any) -> dict[str, str]:
    """Per task, the key of the config `best_steps_lookup` builds it from (its fastest valid record in the space)."""
    chosen = {}
    for task in tasks:
        for record in database.best(task.key, task.target, k=LOOKUP_CANDIDATES):
            if current_config(task, record.config) is not None:
                chosen[task.key] = record.config.key
                break
    return chosen


def _cached_report(task: Any, records: Sequence[Any]) -> TaskReport:
    """A task the tuning cache answered: its default and best times from the cache's records."""

    mine = [r for r in records if r.workload_key == task.key and r.target == task.target]
    best = top_k(mine, 1)
    defaults = [r.cost for r in mine if r.strategy == "default" and r.cost is not None]
    return TaskReport(key=task.key, description=task.description, family=str(getattr(task, "family", "")),
                      weight=task.weight, flops=task.flops, space_size=task.space.size(), trials=0, valid_trials=0,
                      default_cost=min(defaults) if defaults else None,
                      best_cost=best[0].cost if best else None, errors={},
                      stopped=f"tuned before: {len(mine)} records in the tuning cache")


def _report(task: Any, summary: Any) -> TaskReport:
    return TaskReport(key=task.key, description=task.description, family=str(getattr(task, "family", "")),
                      weight=task.weight, flops=task.flops, space_size=task.space.size(), trials=summary.trials,
                      valid_trials=summary.valid_trials, default_cost=summary.default_cost,
                      best_cost=summary.best_cost, errors=dict(summary.errors), stopped=summary.stopped)


# ---------------------------------------------------------------------------------------------------------------
# Live progress in the terminal
# ---------------------------------------------------------------------------------------------------------------


class RichProgress(ProgressCallback):
    """A `rich` progress bar: trials done of the budget, the current task, its best GFLOPS, and the model latency
    estimated from the best kernels so far (sum of weight x best time over tasks that have one), with how much
    faster it is than the first estimate that covered every task (the default schedules, in a fresh run)."""

    def __init__(self, console: Any = None) -> None:
        self.console = console or Console(highlight=False)
        self._progress: Any = None
        self._bar: Any = None
        self._tasks: tuple[TaskInfo, ...] = ()
        self._first_complete: float | None = None  # the first estimate with every task timed

    def on_start(self, plan: TunePlan) -> None:
        self._tasks = plan.tasks
        done = plan.trials_already_done
        self.console.print(
            f"tuning {len(plan.tasks)} tasks with {plan.total_trials} trials in total"
            + (f" ({done} already in {plan.log_path})" if done else f", logging to {plan.log_path}"))
        self._progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[status]}"), console=self.console, transient=False)
        self._progress.start()
        self._bar = self._progress.add_task("tune", total=max(plan.total_trials, 1), completed=min(done,
                                            plan.total_trials), status="")

    def on_round(self, task_index: int, candidates: int) -> None:
        if self._progress is not None:
            self._progress.update(self._bar, status=self._status(task_index, None, None, None))

    def on_trial(self, event: TrialEvent) -> None:
        if self._progress is None:
            return
        status = self._status(event.task_index, event.best_gflops, event.estimated_latency, event.tasks_without_kernel)
        self._progress.update(self._bar, completed=min(event.trials_done, event.total_trials), status=status)

    def _status(self, index: int, best_gflops: float | None, latency: float | None, missing: int | None) -> str:
        info = self._tasks[index] if 0 <= index < len(self._tasks) else None
        text = f"task {index + 1}/{len(self._tasks)} {info.description[:40] if info else ''}"
        if best_gflops is not None:
            text += f" | best {best_gflops:.1f} GFLOPS"
        if latency is not None:
            text += f" | est. model {latency * 1e3:.3f} ms"
            if missing:
                text += f" (+{missing} untimed)"
            elif self._first_complete is None:
                self._first_complete = latency
            elif latency > 0 and self._first_complete > latency:
                text += f" ({self._first_complete / latency:.2f}x faster)"
        return text

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        if self._progress is not None and 0 <= task_index < len(self._tasks):
            self._progress.console.print(f"  task {task_index + 1} ({self._tasks[task_index].description[:50]}) "
                                         f"stopped: {reason}")

    def on_finish(self, summary: TuneSummary) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
