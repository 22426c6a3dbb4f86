"""The in-graph check of tuned records: a record is kept only where its kernel is faster in the model than the
default schedule's (`relay_tune.build(..., check_tuned=True)`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from relay_tune.compile.build_cache import wait_for_stores
from relay_tune.compile.lookup import BuildWarning, SpecLookup, task_lookup
from relay_tune.compile.pipeline import compile_model
from relay_tune.compile.target import resolve_target
from relay_tune.ir import Function, IRModule
from relay_tune.runtime.benchmark import EXTEND_S, compare_latency, interleaved_task_seconds
from relay_tune.runtime.model import CompiledModel
from relay_tune.runtime.vm import VMModel
from relay_tune.target import Target


def check_tuned_records(
    mod: IRModule | Function,
    target: str | Target | None,
    params: Mapping[str, Any] | None,
    logs: Any,
    opt_level: int = 3,
    rounds: int = 5,
    default: CompiledModel | None = None,
    **options: Any,
) -> CompiledModel | VMModel:
    """`build(..., check_tuned=True)`: the tuned build, less the records that are slower in the graph.

    A program with control flow (a `VMModel`) has no in-graph profile: it is returned as tuned, unchecked.

    A record is measured alone by the tuner; in the model its kernel runs between others, with other data in cache
    and the thread team in another state. So the tuned and the default model are both built and profiled in
    interleaved rounds (`CompiledModel.profile_calls`: times taken in generated code between kernel calls); a task
    whose tuned kernel is slower in the graph than its default one falls back to the default schedule, and the
    model is rebuilt without those records. Last, the result is timed end to end against the default build, in
    interleaved rounds, and the default build is returned if it is faster. `build_info["tuned_check"]` says what
    was compared and decided. `default`: the same model already built with default schedules (the tuner has one
    from timing the model before tuning), used instead of building it again.
    """
    tuned = compile_model(mod, target, params, logs, opt_level, **options)
    if isinstance(tuned, VMModel):
        return tuned  # control flow: no in-graph profile to compare with
    if resolve_target(target).kind != "llvm" or not any(t.tuned for t in tuned.plan.tasks):
        return tuned  # GPU models have no in-graph profile to compare with
    # The default build has no records by design, and the rebuild below none for the rejected tasks.
    relaxed = {k: v for k, v in options.items() if k != "require_tuned"}
    if default is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BuildWarning)
            default = _graph(compile_model(mod, target, params, None, opt_level, **relaxed))
    inputs = tuned.random_inputs(seed=0)
    # Decisions compare the fastest of the interleaved samples: interference only ever adds time, and on a shared
    # 2-core machine one slow burst moved a median by 10-60% (two identical builds, or a tuned build "1.67x
    # slower" than the default it had only a few records apart from). Medians are what the check reports.
    in_tuned, in_default = interleaved_task_seconds((tuned, default), inputs, rounds, statistic=min)
    slower = {t.key for t in tuned.plan.tasks
              if t.tuned and t.key in in_default and in_tuned.get(t.key, 0.0) > in_default[t.key]}
    check: dict[str, Any] = {
        "tasks": {t.key: {"tuned_s": in_tuned.get(t.key), "default_s": in_default.get(t.key)}
                  for t in tuned.plan.tasks if t.tuned},
        "rejected": sorted(slower),
    }
    result = _without_records(mod, target, params, logs, opt_level, slower, relaxed) if slower else tuned
    # End to end: tuned <= default, measured here rather than assumed from the per-task sums.
    # Further rounds where the first ones do not support a ratio: the tuner prints this comparison.
    wait_for_stores()  # the builds' cache entries are written before the timing, not during it
    timed = compare_latency(default, result, inputs, rounds=max(rounds, 9), extend_s=EXTEND_S)
    # The medians decide, the statistic the tuner prints: deciding by the fastest samples once kept the default
    # build beside a printed "records 1.46x faster" (one lucky default sample on a busy host).
    kept_default = timed.candidate_s > timed.baseline_s
    check.update(tuned_e2e_s=timed.candidate_s, default_e2e_s=timed.baseline_s, kept_default=kept_default,
                 e2e_rounds={"default": [list(r) for r in timed.baseline], "tuned": [list(r) for r in timed.candidate]})
    chosen = default if kept_default else result
    chosen.build_info["tuned_check"] = check
    return chosen


def _without_records(
    mod: IRModule | Function, target: str | Target | None, params: Mapping[str, Any] | None, logs: Any,
    opt_level: int, rejected: set[str], options: Mapping[str, Any],
) -> CompiledModel:
    """The model built from `logs` less the records of the `rejected` tasks (default schedules for those)."""
    lookup = task_lookup(logs)
    assert lookup is not None

    def without_rejected(spec: Any, target: Target) -> Sequence[Any] | None:
        return None if spec.key in rejected else lookup(spec, target)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BuildWarning)
        return _graph(compile_model(mod, target, params, SpecLookup(without_rejected), opt_level, **options))


def _graph(model: CompiledModel | VMModel) -> CompiledModel:
    """A build of the module whose tuned build is a static graph: a static graph too."""
    assert isinstance(model, CompiledModel), "the same module built twice compiles to the same kind of model"
    return model
