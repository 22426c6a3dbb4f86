"""Typed measurement data passed between the builder, the runner, the search and the log.

Failure is a value, never an exception: every candidate ends as a `MeasureResult` that either has costs or an
`ErrorKind`. The error kinds form a closed set; their numbers mirror AutoTVM's `MeasureErrorNo` so that logs read
familiarly to TVM users (0 is success).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum

from search_space import Config


class ErrorKind(Enum):
    """Why a candidate has no valid timing. Values are AutoTVM's error numbers."""

    INVALID_CONFIG = 1  # the schedule template rejected the config (AutoTVM: INSTANTIATION_ERROR)
    COMPILE_ERROR = 2  # building the kernel failed (COMPILE_HOST)
    RUNTIME_ERROR = 4  # the kernel crashed or reported failure (RUNTIME_DEVICE)
    WRONG_RESULT = 5  # outputs differ from the reference (WRONG_ANSWER)
    BUILD_TIMEOUT = 6  # building took longer than the build timeout
    TIMEOUT = 7  # running took longer than the run timeout (RUN_TIMEOUT)

    @property
    def number(self) -> int:
        return self.value


OK_NAME = "OK"
OK_NUMBER = 0


def error_name(kind: ErrorKind | None) -> str:
    return OK_NAME if kind is None else kind.name


def error_from_name(name: str) -> ErrorKind | None:
    if name == OK_NAME:
        return None
    try:
        return ErrorKind[name]
    except KeyError:
        raise ValueError(f"unknown error kind {name!r}") from None


@dataclass(frozen=True)
class MeasureInput:
    """One candidate: which task, which config."""

    task_key: str
    config: Config


@dataclass(frozen=True)
class BuildResult:
    """What the builder returns per candidate: an artifact, or an error kind and message."""

    artifact: object | None  # a `BuildArtifact` (typed loosely to keep this module free of the task module)
    error_kind: ErrorKind | None = None
    error_msg: str = ""
    build_seconds: float = 0.0


@dataclass(frozen=True)
class RunResult:
    """What the runner returns per artifact: seconds per repeat, or an error kind and message."""

    costs: tuple[float, ...] | None
    error_kind: ErrorKind | None = None
    error_msg: str = ""
    run_seconds: float = 0.0


@dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one candidate.

    `costs` holds one entry per repeat, in seconds per kernel call (the runner averages `number` calls into one
    entry); it is None exactly when `error_kind` is set.
    """

    costs: tuple[float, ...] | None
    error_kind: ErrorKind | None = None
    error_msg: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    timestamp: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if (self.costs is None) == (self.error_kind is None):
            raise ValueError("a MeasureResult has either costs (success) or an error kind, not both or neither")
        if self.costs is not None:
            if not self.costs or not all(math.isfinite(c) and c >= 0 for c in self.costs):
                raise ValueError(f"costs must be a non-empty tuple of finite non-negative seconds: {self.costs!r}")

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def cost(self) -> float | None:
        """The cost that ranks configs: the fastest repeat.

        Interference from other processes only ever slows a kernel down, so on a shared machine the
        fastest repeat is the cleanest estimate of the kernel's own speed (the mean follows the noise).
        """
        return self.min_cost

    @property
    def mean_cost(self) -> float | None:
        return None if self.costs is None else sum(self.costs) / len(self.costs)

    @property
    def min_cost(self) -> float | None:
        return None if self.costs is None else min(self.costs)

    @staticmethod
    def combine(build: BuildResult, run: RunResult | None) -> MeasureResult:
        """Merge a build outcome and (when the build succeeded) a run outcome."""
        if build.error_kind is not None or run is None:
            kind = build.error_kind or ErrorKind.COMPILE_ERROR
            return MeasureResult(None, kind, build.error_msg, build.build_seconds, 0.0)
        return MeasureResult(run.costs, run.error_kind, run.error_msg, build.build_seconds, run.run_seconds)
