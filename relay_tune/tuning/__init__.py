"""Auto-tuning: tasks, search, parallel builds, isolated measurement, task scheduling and tuning logs.

Data flow: `TuneTask` (space + build + reference) -> `SearchStrategy.propose` -> `Builder.build` (worker
processes) -> `Runner.run` (isolated process, correctness check, timing) -> `MeasureResult` -> `TuningRecord`
appended to the JSON-lines log (`Database`) -> `TaskScheduler` picks the next task. `tune` drives the loop;
`apply_best` reads the best config per workload back for the build.
"""

from relay_tune.records.database import Database, JsonLinesDatabase, MemoryDatabase, apply_best, top_k
from relay_tune.records.log_format import (
    SCHEMA_VERSION,
    LogEvent,
    LogFormatError,
    LogWarning,
    LogWriter,
    TuningRecord,
    append_lines,
    iter_log,
    read_events,
    read_records,
)
from relay_tune.records.measure import BuildResult, ErrorKind, MeasureInput, MeasureResult, RunResult
from relay_tune.tuning.builder import Builder, InlineBuilder, LocalBuilder, build_one
from relay_tune.tuning.driver import default_storage_path, tune
from relay_tune.tuning.progress import PrintProgress, ProgressCallback, RecordingProgress, TrialEvent, TunePlan
from relay_tune.tuning.runner import LocalRunner, Runner, TimingOptions, random_inputs
from relay_tune.tuning.scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress, TaskScheduler
from relay_tune.tuning.search import (
    FAILURE_VALUE,
    OptunaSearch,
    RandomSearch,
    SearchStrategy,
    StrategyFactory,
    open_storage,
    optuna_search,
    random_search,
)
from relay_tune.tuning.summary import TaskSummary, TuneSummary
from relay_tune.tuning.task import (
    BuildArtifact,
    InvalidConfigError,
    KernelArg,
    LayoutStep,
    TensorSpec,
    TuneTask,
    apply_layout,
)

__all__ = [
    "FAILURE_VALUE",
    "SCHEMA_VERSION",
    "BuildArtifact",
    "BuildResult",
    "Builder",
    "Database",
    "ErrorKind",
    "GradientScheduler",
    "InlineBuilder",
    "InvalidConfigError",
    "JsonLinesDatabase",
    "KernelArg",
    "LayoutStep",
    "LocalBuilder",
    "LocalRunner",
    "LogEvent",
    "LogFormatError",
    "LogWarning",
    "LogWriter",
    "MeasureInput",
    "MeasureResult",
    "MemoryDatabase",
    "OptunaSearch",
    "PrintProgress",
    "ProgressCallback",
    "RandomSearch",
    "RecordingProgress",
    "RoundRobinScheduler",
    "RunResult",
    "Runner",
    "SearchStrategy",
    "StrategyFactory",
    "TaskProgress",
    "TaskScheduler",
    "TaskSummary",
    "TensorSpec",
    "TimingOptions",
    "TrialEvent",
    "TuneSummary",
    "TunePlan",
    "TuneTask",
    "TuningRecord",
    "append_lines",
    "apply_best",
    "apply_layout",
    "build_one",
    "default_storage_path",
    "iter_log",
    "open_storage",
    "optuna_search",
    "random_inputs",
    "random_search",
    "read_events",
    "read_records",
    "top_k",
    "tune",
]
