"""The tuning driver end to end: budget, defaults, faults, interrupts, resume after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from relay_tune.tuning import (
    JsonLinesDatabase,
    LocalBuilder,
    LocalRunner,
    LogWarning,
    ProgressCallback,
    RecordingProgress,
    TrialEvent,
    apply_best,
    default_storage_path,
    random_search,
    read_events,
    read_records,
    tune,
)
from relay_tune.tuning.testing import FAULT_VARIANTS, FaultyTask, MatmulTask, expected_error, small_tasks

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def builder() -> Iterator[LocalBuilder]:
    with LocalBuilder(n_parallel=2, timeout=2.0, kill_grace=0.5) as local:
        yield local  # type: ignore[misc]


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(timeout=2.0, number=2, repeat=2, min_repeat_ms=2) as local:
        yield local  # type: ignore[misc]


def test_tune_spends_exactly_the_budget_and_measures_defaults_first(
    tmp_path: Path, builder: LocalBuilder, runner: LocalRunner
) -> None:
    log = tmp_path / "model.jsonl"
    tasks = small_tasks()
    progress = RecordingProgress()
    summary = tune(tasks, 20, log, builder=builder, runner=runner, progress=progress, batch_size=5, seed=1)

    records = read_records(log)
    assert len(records) == summary.trials_done == summary.trials_this_session == 20
    assert not summary.interrupted
    assert default_storage_path(log).exists()
    for task in tasks:
        mine = [r for r in records if r.workload_key == task.key]
        assert mine[0].config == task.default_config() and mine[0].strategy == "default"
        assert [r.trial for r in mine] == list(range(len(mine)))
        assert len({r.config_key for r in mine}) == len(mine)  # never measured twice
        assert all(r.ok and r.target == task.target and r.flops == task.flops for r in mine)
    # the summary, the log and apply_best agree on the winners
    chosen = apply_best(log)
    for task_summary in summary.tasks:
        assert task_summary.trials + 0 == sum(r.workload_key == task_summary.key for r in records)
        assert chosen[(task_summary.key, task_summary.target)] == task_summary.best_config
        assert task_summary.default_cost is not None and task_summary.speedup_over_default is not None
        assert task_summary.speedup_over_default >= 1.0
    expected_latency = sum(t.weight * t.best_cost for t in summary.tasks if t.best_cost is not None)
    assert summary.estimated_latency == pytest.approx(expected_latency)
    # progress reporting
    assert progress.plan is not None and progress.plan.total_trials == 20 and len(progress.plan.tasks) == 2
    assert [e.trials_done for e in progress.trials] == list(range(1, 21))
    assert progress.trials[-1].estimated_latency == pytest.approx(expected_latency)
    assert progress.summary is summary
    assert [index for index, _ in progress.rounds[:2]] == [0, 1]  # warm-up round per task
    events = [e.event for e in read_events(log)]
    assert events == ["session_start", "session_end"]
    assert set(summary.seconds) >= {"build", "run", "search", "total"}


def test_rerunning_resumes_instead_of_starting_over(tmp_path: Path, builder: LocalBuilder,
                                                    runner: LocalRunner) -> None:
    log = tmp_path / "model.jsonl"
    tasks = small_tasks()
    tune(tasks, 12, log, builder=builder, runner=runner, batch_size=4)
    again = tune(tasks, 12, log, builder=builder, runner=runner, batch_size=4)
    assert again.trials_this_session == 0 and again.trials_done == 12
    more = tune(tasks, 18, log, builder=builder, runner=runner, batch_size=4)
    assert more.trials_this_session == 6
    records = read_records(log)
    assert len(records) == 18
    pairs = Counter((r.workload_key, r.config_key) for r in records)
    assert max(pairs.values()) == 1
    study_storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(default_storage_path(log))))
    for study in optuna.get_all_study_summaries(study_storage):
        loaded = optuna.load_study(study_name=study.study_name, storage=study_storage)
        assert not [t for t in loaded.trials if t.state == optuna.trial.TrialState.RUNNING]


def test_fault_kernels_are_recorded_and_never_chosen(tmp_path: Path, builder: LocalBuilder,
                                                     runner: LocalRunner) -> None:
    log = tmp_path / "faults.jsonl"
    task = FaultyTask(size=256, variants=("plain", *FAULT_VARIANTS), max_repeat=1)
    summary = tune([task], 100, log, builder=builder, runner=runner, batch_size=4)
    records = read_records(log)
    assert len(records) == task.space.size() == 9  # every variant measured once, then the space is exhausted
    by_variant = {r.config["variant"]: r for r in records}
    for name, record in by_variant.items():
        kind = None if record.error_kind is None else record.error_kind.name
        assert kind == expected_error(str(name)), (name, record.error_msg)
    (task_summary,) = summary.tasks
    assert task_summary.best_config is not None and task_summary.best_config["variant"] == "plain"
    assert task_summary.errors == Counter(e for e in map(expected_error, FAULT_VARIANTS) if e)
    assert "no unmeasured config" in str(task_summary.stopped)
    assert [c["variant"] for c in apply_best(log).values()] == ["plain"]


class _InterruptAfter(ProgressCallback):
    def __init__(self, trials: int) -> None:
        self.trials = trials

    def on_trial(self, event: TrialEvent) -> None:
        if event.trials_done == self.trials:
            raise KeyboardInterrupt


def test_keyboard_interrupt_keeps_everything_and_returns_a_partial_summary(
    tmp_path: Path, builder: LocalBuilder, runner: LocalRunner
) -> None:
    log = tmp_path / "model.jsonl"
    tasks = small_tasks()
    summary = tune(tasks, 16, log, builder=builder, runner=runner, batch_size=4, progress=_InterruptAfter(6))
    assert summary.interrupted and summary.trials_done == 6
    assert len(read_records(log)) == 6
    end = [e for e in read_events(log) if e.event == "session_end"]
    assert end[-1].data["interrupted"] is True
    resumed = tune(tasks, 16, log, builder=builder, runner=runner, batch_size=4)
    assert resumed.trials_this_session == 10 and len(read_records(log)) == 16


def test_other_strategies_and_in_memory_storage(tmp_path: Path, builder: LocalBuilder, runner: LocalRunner) -> None:
    tasks = [MatmulTask(16, 16, 16)]
    first = tune(tasks, 6, tmp_path / "random.jsonl", builder=builder, runner=runner, strategy=random_search(3))
    assert first.trials_done == 6 and not (tmp_path / "random.optuna.journal").exists()
    second = tune(tasks, 6, tmp_path / "memory.jsonl", builder=builder, runner=runner, storage=None)
    assert second.trials_done == 6 and not (tmp_path / "memory.optuna.journal").exists()


def test_duplicate_tasks_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="twice"):
        tune([MatmulTask(8, 8, 8), MatmulTask(8, 8, 8)], 4, tmp_path / "log.jsonl")


_TUNING_PROCESS = textwrap.dedent("""
    import sys
    from relay_tune.tuning import LocalBuilder, LocalRunner, tune
    from relay_tune.tuning.testing import small_tasks

    if __name__ == "__main__":
        tune(small_tasks(), int(sys.argv[2]), sys.argv[1], batch_size=4,
             builder=LocalBuilder(n_parallel=2, timeout=20.0),
             runner=LocalRunner(timeout=10.0, min_repeat_ms=float(sys.argv[3])))
""")


def _start_tuning(log: Path, budget: int, min_repeat_ms: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    script = log.parent / "tune_script.py"
    script.write_text(_TUNING_PROCESS)
    return subprocess.Popen([sys.executable, str(script), str(log), str(budget), str(min_repeat_ms)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _count_records(log: Path) -> int:
    if not log.exists():
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        return len(read_records(log))


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's bookkeeping remains


def test_resume_after_sigkill_loses_nothing_and_spends_exactly_the_budget(tmp_path: Path) -> None:
    log = tmp_path / "model.jsonl"
    budget = 28
    victim = _start_tuning(log, budget, min_repeat_ms=30.0)
    deadline = time.monotonic() + 180
    while _count_records(log) < 7:
        assert victim.poll() is None, victim.stderr.read().decode() if victim.stderr else ""
        assert time.monotonic() < deadline, "the tuning process made no progress"
        time.sleep(0.05)
    workers = _children(victim.pid)
    assert workers  # builder and runner workers are running
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers):  # the workers die with the driver instead of lingering
        assert time.monotonic() < deadline, f"orphaned workers: {[p for p in workers if _alive(p)]}"
        time.sleep(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        before = [r.to_json() for r in read_records(log)]
    assert 7 <= len(before) < budget

    survivor = _start_tuning(log, budget, min_repeat_ms=1.0)
    assert survivor.wait(timeout=300) == 0, survivor.stderr.read().decode() if survivor.stderr else ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)  # at most the line being written at the kill is torn
        after = read_records(log)
    assert [r.to_json() for r in after[: len(before)]] == before  # nothing written before the kill was lost
    assert len(after) == budget  # the resumed run measured exactly what was left
    assert max(Counter((r.workload_key, r.config_key) for r in after).values()) == 1
    database = JsonLinesDatabase(log)
    assert all(database.best(t.key, t.target) for t in small_tasks())
    events = [e.event for e in read_events(log)]
    assert events.count("session_start") == 2 and events.count("session_end") == 1  # the killed run never ended


def test_two_tuning_processes_share_one_log_and_budget(tmp_path: Path) -> None:
    log = tmp_path / "model.jsonl"
    budget, batch = 24, 4
    first = _start_tuning(log, budget, min_repeat_ms=2.0)
    second = _start_tuning(log, budget, min_repeat_ms=2.0)
    for process in (first, second):
        assert process.wait(timeout=300) == 0, process.stderr.read().decode() if process.stderr else ""
    records = read_records(log)
    assert budget <= len(records) <= budget + batch  # at most one round of overshoot by the second process
    assert max(Counter((r.workload_key, r.config_key) for r in records).values()) == 1


def test_records_of_another_space_neither_count_nor_warm_the_search(tmp_path: Path) -> None:
    """A log written under another schedule space (an older version, or an operator whose compute changed) keeps
    its lines, but the run tunes those tasks anew: the budget counts only records that are points of the task's
    current space."""
    from relay_tune.records.database import CurrentSpaces
    from relay_tune.tuning import TuningRecord
    from relay_tune.tuning.simulated import SimulatedBuilder, SleepRunner
    from search_space import Config

    task = small_tasks()[0]
    foreign = Config({"family": "conv2d_nchw", "tile_c": [4, 8]})
    assert not task.space.is_valid(foreign)
    log = tmp_path / "old.jsonl"
    current = task.default_config()
    lines = [TuningRecord(task.key, task.target, foreign, (1e-9,)).to_json() for _ in range(5)]
    lines.append(TuningRecord(task.key, task.target, current, (1e-3,)).to_json())
    log.write_text("\n".join(lines) + "\n")
    view = CurrentSpaces(JsonLinesDatabase(log), [task])
    assert [r.config for r in view.records(task.key, task.target)] == [current]
    assert view.best(task.key, task.target)[0].config == current  # the foreign 1 ns never wins

    summary = tune([task], 4, log, builder=SimulatedBuilder(), runner=SleepRunner(0.0), strategy=random_search(),
                   storage=None)
    assert summary.trials_this_session == 3  # 4 - the one current record; the 5 foreign ones do not count
    assert len(read_records(log)) == 6 + 3
