"""Tuning-log lookup at build time: which schedule steps a task gets from the logs (or a lookup function).

For logs, the best valid record per workload and target is used (`relay_tune.records.database.best_for_target`)
and its config becomes steps through `search_space.decode.config_to_steps`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay_tune.errors import RelayTuneError
from relay_tune.records.database import best_for_target
from relay_tune.target import Target
from search_space.decode import ConfigNotInSpace, config_to_steps

ScheduleLookup = Callable[[str, Target], Sequence[Any] | None]
"""`(task_key, target) -> schedule steps (Step objects or their JSON dicts) | None` (None: default schedule)."""

TaskLookup = Callable[[Any, Target], Sequence[Any] | None]
"""`(task spec, target) -> steps | None`: the form the build uses inside (the spec has the key and the function)."""

LOOKUP_CANDIDATES = 64
"""Records per task a log lookup considers, fastest first, for one that fits the task's current space."""


class BuildWarning(UserWarning):
    """Something about a build the user should know (untuned tasks, tuned steps that no longer apply)."""


class SpecLookup:
    """A lookup that takes the task spec itself (`TaskLookup`), passed through `task_lookup` unchanged."""

    def __init__(self, fn: TaskLookup) -> None:
        self.fn = fn


def task_lookup(logs: Any) -> TaskLookup | None:
    """The lookup `build` uses for `logs`: None, a `ScheduleLookup` function, a `SpecLookup`, or tuning-log
    path(s)."""
    if logs is None:
        return None
    if isinstance(logs, SpecLookup):
        return logs.fn
    if callable(logs):
        hook: ScheduleLookup = logs
        return lambda spec, target: hook(spec.key, target)
    paths = [logs] if isinstance(logs, str | os.PathLike) else list(logs)
    if not paths:
        return None
    for path in paths:
        if not os.path.isfile(path):
            raise RelayTuneError(f"tuning log {os.fspath(path)}: no such file")
    return _log_lookup(paths)


def _log_lookup(paths: Sequence[Any]) -> TaskLookup:
    """The lookup over tuning logs `paths`: per target, the fastest records of each task, read once."""
    cache: dict[str, Mapping[str, Sequence[Any]]] = {}

    def lookup(spec: Any, target: Target) -> Sequence[Any] | None:
        ranked = cache.get(str(target))
        if ranked is None:
            # logs name targets by `log_name`; records of other targets or CPUs are left out, counted in one warning
            ranked, skipped = best_for_target(paths, (target.log_name, str(target)), target.mcpu or None,
                                              k=LOOKUP_CANDIDATES)
            cache[str(target)] = ranked
            if skipped is not None:
                warnings.warn(skipped, BuildWarning, stacklevel=6)  # past the build to its caller
        # The fastest record that is a point of the task's current space; records of an older space (another
        # version, or a compute that changed) are passed over, and with none left the task is untuned.
        for config in ranked.get(spec.key, ()):
            try:
                return config_to_steps(spec.func, config, target)
            except ConfigNotInSpace:
                continue
        return None

    return lookup
