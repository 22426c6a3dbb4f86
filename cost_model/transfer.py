"""Transfer learning: warm a cost model with measurements of *other* workloads from earlier tuning logs.

Loop-nest features do not depend on the search space, so a config measured for one workload (say a ResNet-50
convolution) teaches the model about another (a MobileNet one) once both are described by their loop nests. To
re-lower an old config, its task must be rebuilt: the model-guided search writes one `workload` event per task
into the log it tunes into, holding a JSON description of the task (`task.workload_spec()`), and
`register_workload_kind` maps the description's `kind` to a function that rebuilds the task (the task
modules of the tuner register their own kinds). Tasks can also be
given directly (`tasks=`), which wins over the log's description.

Each old workload becomes its own group of the training set (throughput normalised within the group), so only
orders within a workload are learnt and fast and slow workloads mix safely. Records of another target *kind*
(CPU logs when tuning for CUDA) are left out: their loop nests mean different things.

The search uses the data as a prior, not as a replacement for its own start (`relay_tune.tuning.xgb_search`): the
groups of a schedule template unlike those the run uses are left out of training (`teaches`), and until a task
has a few measurements of its own the warmed model orders the neighbours of its default schedule instead of ranking
random configs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost_model.features import Featurizer
from cost_model.xgb_model import TrainingSet
from relay_tune.records.log_format import LogEvent, TuningRecord, comparable_records, expand_log_paths, iter_log

WORKLOAD_EVENT = "workload"
TRANSFER_GROUP_PREFIX = "transfer:"

TaskFactory = Callable[[Mapping[str, Any]], Any]
_FACTORIES: dict[str, TaskFactory] = {}


class TransferWarning(UserWarning):
    """Records of an earlier log could not be used for transfer (their task cannot be rebuilt or lowered)."""


def register_workload_kind(kind: str, factory: TaskFactory) -> None:
    """Teach transfer how to rebuild tasks whose `workload_spec()["kind"]` is `kind`."""
    _FACTORIES[kind] = factory


# The tuner's task modules register their kinds (`relay_tune.tuning.relay_task`: "relay_function") when they are
# imported; the cost model sits below them and imports none.


def workload_spec_of(task: Any) -> dict[str, Any] | None:
    """The task's JSON description for rebuilding it later, when it has one."""
    describe = getattr(task, "workload_spec", None)
    if describe is None:
        return None
    spec = describe()
    return dict(spec) if isinstance(spec, Mapping) and "kind" in spec else None


def workload_event(task: Any, session: str = "") -> LogEvent | None:
    """The `workload` log event describing `task`, or None when the task cannot describe itself."""
    spec = workload_spec_of(task)
    if spec is None:
        return None
    return LogEvent(WORKLOAD_EVENT, session, data={
        "workload_key": task.key, "target": task.target, "description": getattr(task, "description", ""),
        "flops": float(getattr(task, "flops", 0.0)), "spec": spec})


def rebuild_task(spec: Mapping[str, Any]) -> Any:
    """The task a workload description stands for; raises KeyError for kinds nobody registered."""
    factory = _FACTORIES.get(str(spec.get("kind")))
    if factory is None:
        raise KeyError(f"no task factory registered for workload kind {spec.get('kind')!r}")
    return factory(spec)


def operator_family(task: Any) -> str:
    """The operator a task's template computes, whatever its layout: "conv2d" for conv2d_nchw, conv2d_nchw_cl and
    conv2d_nhwc, "depthwise_conv2d", "dense", ... ("" when the task does not say).

    Transfer only teaches tasks of the same operator: the loop-nest features of a dense and of a convolution share
    columns (loop extents, strides, reuse) but not what makes one config of each faster than another, and on
    workloads whose operator the old logs lacked, a model warmed with them ranked worse than no model at all."""
    family = str(getattr(task, "family", "") or "")
    for layout in ("_nchw", "_nhwc"):
        family = family.split(layout)[0]
    return family


def template_of(task: Any) -> str:
    """The schedule template a task's configs go through: its family and its knobs ("" when it does not say).

    A 1x1 and a 3x3 convolution are one operator but two templates (the 1x1 space has no reduction-order, kernel
    unrolling or padding knobs): their loop nests differ in structure, and in the search-efficiency runs a model
    warmed with 3x3 logs ordered a 1x1's configs worse than no model did."""
    space = getattr(task, "space", None)
    names = sorted(getattr(space, "names", ()) or ())
    family = str(getattr(task, "family", "") or "")
    return f"{family}:{','.join(names)}" if family or names else ""


SIMILAR_KNOBS = 0.75
"""Two templates of one operator are similar when this share of their knobs (Jaccard) is common to both."""


def _split_template(template: str) -> tuple[str, frozenset[str]]:
    family, _, knobs = template.partition(":")
    for layout in ("_nchw", "_nhwc"):
        family = family.split(layout)[0]
    return family, frozenset(k for k in knobs.split(",") if k and k != "family")


def teaches(source: str, target: str, match: str = "similar") -> bool:
    """Whether measurements of a workload of template `source` (a `template_of` string) may teach the model that
    ranks configs of template `target`. match: "similar" (the same operator through templates sharing at least
    `SIMILAR_KNOBS` of their knobs: the same loop structure, perhaps in another layout, as conv2d_nchw and
    conv2d_nchw_cl of a 3x3 convolution), "template" (the same template), "operator" (the same operator) or "any".
    A workload whose template is unknown ("") teaches everything, as before templates were recorded."""
    if match == "any" or not source or not target:
        return True
    if match == "template":
        return source == target
    (op_a, knobs_a), (op_b, knobs_b) = _split_template(source), _split_template(target)
    if op_a != op_b:
        return False
    if match == "operator":
        return True
    union = knobs_a | knobs_b
    return not union or len(knobs_a & knobs_b) / len(union) >= SIMILAR_KNOBS


def target_kind(target: str) -> str:
    return target.split(maxsplit=1)[0] if target else ""


@dataclass
class TransferReport:
    """What `load_transfer_data` used and what it had to leave out (and why)."""

    workloads: dict[str, int] = field(default_factory=dict)  # group name -> rows used
    families: dict[str, str] = field(default_factory=dict)  # group name -> operator family (`operator_family`)
    templates: dict[str, str] = field(default_factory=dict)  # group name -> schedule template (`template_of`)
    skipped: dict[str, str] = field(default_factory=dict)  # workload key -> reason
    records_read: int = 0
    rows: int = 0
    feature_failures: int = 0

    def summary(self) -> str:
        parts = [f"{self.rows} measured configs of {len(self.workloads)} workloads from {self.records_read} records"]
        if self.skipped:
            parts.append(f"{len(self.skipped)} workloads left out")
        return ", ".join(parts)


def load_transfer_data(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    featurizer: Featurizer,
    *,
    tasks: Sequence[Any] = (),
    target: str | None = None,
    exclude: Iterable[tuple[str, str]] = (),
    max_per_workload: int | None = None,
) -> tuple[TrainingSet | None, TransferReport]:
    """Re-lower and featurize the measured configs of earlier logs (files, or folders of `*.jsonl`).

    tasks: tasks to use for their workload keys (otherwise rebuilt from the logs' `workload` events).
    target: keep only records of the same target kind ("llvm", "cuda"). exclude: (workload key, target) pairs to
    leave out (e.g. the task being tuned, whose own log already trains the model).
    Returns the training set (None when nothing was usable) and a report.
    """
    if not featurizer.transferable:
        raise ValueError("transfer needs loop-nest features: knob features of one space mean nothing in another")
    report = TransferReport()
    specs: dict[str, Mapping[str, Any]] = {}
    grouped: dict[tuple[str, str], list[TuningRecord]] = {}
    excluded = set(exclude)
    for path in expand_log_paths(paths):
        if not path.exists():
            raise FileNotFoundError(f"transfer log {path} does not exist")
        for _, entry in iter_log(path):
            if isinstance(entry, LogEvent):
                if entry.event == WORKLOAD_EVENT and isinstance(entry.data.get("spec"), Mapping):
                    specs[str(entry.data.get("workload_key"))] = entry.data["spec"]
                continue
            report.records_read += 1
            key = (entry.workload_key, entry.target)
            if key in excluded:
                continue
            if target is not None and target_kind(entry.target) != target_kind(target):
                report.skipped.setdefault(entry.workload_key, f"target {entry.target!r} is another kind")
                continue
            grouped.setdefault(key, []).append(entry)
    given = {t.key: t for t in tasks}
    parts: list[TrainingSet] = []
    for (workload, record_target), entries in grouped.items():
        # One workload's times are compared with each other (throughputs are ranked within the group): only
        # those taken the same way.
        by_config: dict[str, TuningRecord] = {}
        for entry in comparable_records(entries):
            held = by_config.get(entry.config_key)
            if held is None or _better(entry, held):
                by_config[entry.config_key] = entry
        task = given.get(workload)
        if task is None and workload in specs:
            try:
                task = rebuild_task(specs[workload])
            except (KeyError, ValueError, TypeError) as err:
                report.skipped[workload] = f"cannot rebuild its task: {err}"
                continue
        if task is None:
            report.skipped[workload] = "the log does not describe its task (no workload event) and none was given"
            continue
        records = list(by_config.values())
        if max_per_workload is not None and len(records) > max_per_workload:
            records = sorted(records, key=lambda r: r.timestamp)[-max_per_workload:]
        configs = [r.config for r in records]
        before = featurizer.failures
        matrix, kept = featurizer.many(task, configs)
        report.feature_failures += featurizer.failures - before
        if len(kept) < 2:
            report.skipped[workload] = "fewer than two of its configs could be lowered"
            continue
        throughput = np.asarray([_throughput(records[i]) for i in kept], dtype=np.float32)
        if not (throughput > 0).any():
            report.skipped[workload] = "no successful measurement"
            continue
        group = f"{TRANSFER_GROUP_PREFIX}{workload}|{record_target}"
        parts.append(TrainingSet(matrix, throughput, (group,) * len(kept)))
        report.workloads[group] = len(kept)
        report.families[group] = operator_family(task)
        report.templates[group] = template_of(task)
        report.rows += len(kept)
    for workload, reason in report.skipped.items():
        warnings.warn(f"transfer: records of workload {workload} left out: {reason}", TransferWarning, stacklevel=2)
    return (TrainingSet.concat(parts) if parts else None), report


def _throughput(record: TuningRecord) -> float:
    cost = record.cost
    return 1.0 / cost if record.ok and cost else 0.0


def _better(record: TuningRecord, held: TuningRecord) -> bool:
    return _throughput(record) > _throughput(held)


__all__ = [
    "TRANSFER_GROUP_PREFIX",
    "WORKLOAD_EVENT",
    "TransferReport",
    "TransferWarning",
    "load_transfer_data",
    "operator_family",
    "teaches",
    "template_of",
    "rebuild_task",
    "register_workload_kind",
    "target_kind",
    "workload_event",
    "workload_spec_of",
]
