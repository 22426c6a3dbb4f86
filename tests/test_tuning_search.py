"""Search strategies: no config measured twice, failures taught to the sampler, resume, shared storages."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest

from relay_tune.tuning import (
    FAILURE_VALUE,
    Database,
    ErrorKind,
    JsonLinesDatabase,
    MeasureInput,
    MeasureResult,
    MemoryDatabase,
    OptunaSearch,
    RandomSearch,
    SearchStrategy,
    TuningRecord,
    read_records,
)
from relay_tune.tuning.search import default_study_name
from search_space import BoolKnob, Config, Constraint, IntKnob, Space

REPO_ROOT = Path(__file__).resolve().parents[1]


def even_x(config: Config) -> bool:
    return int(config["x"]) % 2 == 0  # type: ignore[arg-type]


@dataclass
class SpaceTask:
    """Just enough of a task for a search strategy: key, target and space."""

    size: int = 30
    constrained: bool = False
    key: str = "synthetic"
    target: str = "llvm"
    description: str = "synthetic"
    flops: float = 1e6
    weight: int = 1
    space: Space = field(init=False)

    def __post_init__(self) -> None:
        constraints = [Constraint("even_x", even_x)] if self.constrained else []
        self.space = Space([IntKnob("x", 0, self.size - 1), BoolKnob("fast")], constraints)

    def default_config(self) -> Config:
        return Config({"x": 0, "fast": False})


def fake_measure(config: Config) -> MeasureResult:
    x = int(config["x"])  # type: ignore[arg-type]
    if x % 7 == 3:
        return MeasureResult(None, ErrorKind.RUNTIME_ERROR, "synthetic crash")
    return MeasureResult((1e-3 * (1 + abs(x - 17)) * (0.5 if config["fast"] else 1.0),))


def run_rounds(search: SearchStrategy, task: SpaceTask, database: Database, batch: int, rounds: int | None = None
               ) -> list[Config]:
    measured: list[Config] = []
    done = 0
    while rounds is None or done < rounds:
        configs = search.propose(batch)
        if not configs:
            break
        results = [fake_measure(c) for c in configs]
        for config, result in zip(configs, results):
            database.commit(TuningRecord.from_measurement(task.key, task.target, config, result))
        search.update([MeasureInput(task.key, c) for c in configs], results)
        measured += configs
        done += 1
    return measured


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_optuna_search_never_repeats_and_exhausts_the_space(sampler: str) -> None:
    task = SpaceTask(size=20)
    database = MemoryDatabase()
    search = OptunaSearch(task, database, sampler=sampler, seed=1)
    measured = run_rounds(search, task, database, batch=6)
    keys = [c.key for c in measured]
    assert len(keys) == len(set(keys)) == task.space.size() == 40
    assert search.propose(4) == []


def test_failures_are_told_as_the_worst_value() -> None:
    task = SpaceTask(size=20)
    database = MemoryDatabase()
    search = OptunaSearch(task, database, sampler="random", seed=0)
    run_rounds(search, task, database, batch=8, rounds=3)
    measured = [t for t in search.study.trials if "config_key" in t.user_attrs]
    failed = [t for t in measured if t.user_attrs.get("error_kind") == "RUNTIME_ERROR"]
    assert failed and all(t.value == FAILURE_VALUE for t in failed)
    ok = [t for t in measured if "error_kind" not in t.user_attrs]
    assert ok and all(t.value is not None and t.value < 1 for t in ok)


def test_constraint_rejections_are_never_proposed() -> None:
    task = SpaceTask(size=20, constrained=True)
    database = MemoryDatabase()
    search = OptunaSearch(task, database, sampler="random", seed=3)
    measured = run_rounds(search, task, database, batch=5)
    assert len(measured) == 20 and all(task.space.is_valid(c) for c in measured)
    rejected = [t for t in search.study.trials if t.user_attrs.get("rejected")]
    assert rejected and all(t.value == FAILURE_VALUE for t in rejected)


def test_logged_configs_are_answered_from_the_log_and_imported() -> None:
    task = SpaceTask(size=10)
    database = MemoryDatabase()
    logged = [Config({"x": x, "fast": f}) for x in range(10) for f in (False, True) if x < 8]
    for config in logged:
        database.commit(TuningRecord.from_measurement(task.key, task.target, config, fake_measure(config)))
    search = OptunaSearch(task, database, sampler="tpe", seed=0)
    imported = [t for t in search.study.trials if t.user_attrs.get("source") == "log"]
    assert len(imported) == len(logged)
    proposals = search.propose(10)
    assert {c.key for c in proposals} == {Config({"x": x, "fast": f}).key for x in (8, 9) for f in (False, True)}


def test_prioritized_configs_come_first_unless_already_measured() -> None:
    task = SpaceTask(size=50)
    database = MemoryDatabase()
    search = OptunaSearch(task, database, seed=0)
    search.prioritize([task.default_config()])
    assert search.propose(3)[0] == task.default_config()
    search.close()
    again = OptunaSearch(task, database, seed=0)
    database.commit(TuningRecord.from_measurement(task.key, task.target, task.default_config(),
                                                  fake_measure(task.default_config())))
    again.prioritize([task.default_config()])
    assert task.default_config() not in again.propose(5)


def test_random_search_never_repeats() -> None:
    task = SpaceTask(size=15, constrained=True)
    database = MemoryDatabase()
    search = RandomSearch(task, database, seed=0)
    search.prioritize([task.default_config()])
    measured = run_rounds(search, task, database, batch=4)
    assert measured[0] == task.default_config()
    assert len({c.key for c in measured}) == len(measured) == task.space.count_valid()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_resume_from_a_journal_closes_stale_trials(tmp_path: Path) -> None:
    task = SpaceTask(size=40)
    journal = tmp_path / "study.optuna.journal"
    database = JsonLinesDatabase(tmp_path / "log.jsonl")
    first = OptunaSearch(task, database, storage=journal, seed=0)
    run_rounds(first, task, database, batch=4, rounds=2)
    # A trial left running by a process that died mid-measurement.
    orphan = first.study.ask()
    config = task.space.to_optuna(orphan)
    orphan.set_user_attr("config_key", config.key)
    orphan.set_user_attr("worker", f"{socket.gethostname()}:{_dead_pid()}:0")
    running = optuna.trial.TrialState.RUNNING

    second = OptunaSearch(task, JsonLinesDatabase(tmp_path / "log.jsonl"), storage=journal, seed=0)
    assert second.study.trials[orphan.number].state == optuna.trial.TrialState.FAIL
    assert not [t for t in second.study.trials if t.state == running]
    complete = [t for t in second.study.trials if t.state == optuna.trial.TrialState.COMPLETE
                and "config_key" in t.user_attrs]
    assert len(complete) == 8  # the measured trials survived in the journal; nothing imported twice
    measured = run_rounds(second, task, database, batch=4, rounds=3)
    all_keys = [r.config_key for r in read_records(tmp_path / "log.jsonl")]
    assert len(all_keys) == len(set(all_keys)) == 20
    assert len(measured) == 12


def test_rdb_storage_urls_are_accepted(tmp_path: Path) -> None:
    task = SpaceTask(size=10)
    database = MemoryDatabase()
    search = OptunaSearch(task, database, storage=f"sqlite:///{tmp_path / 'study.db'}", seed=0)
    assert len(run_rounds(search, task, database, batch=4, rounds=2)) == 8


_SHARED_WORKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[4])
    from test_tuning_search import SpaceTask, run_rounds
    from relay_tune.tuning import JsonLinesDatabase, OptunaSearch
    journal, log, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    task = SpaceTask(size=200)
    database = JsonLinesDatabase(log)
    search = OptunaSearch(task, database, storage=journal, seed=seed)
    run_rounds(search, task, database, batch=4, rounds=6)
""")


@pytest.mark.parametrize("seeds", [(1, 2), (5, 5)], ids=["different-seeds", "same-seed"])
def test_two_processes_on_one_storage_share_the_work(tmp_path: Path, seeds: tuple[int, int]) -> None:
    journal = tmp_path / "shared.optuna.journal"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    logs = [tmp_path / f"worker{i}.jsonl" for i in range(2)]
    processes = [
        subprocess.Popen([sys.executable, "-c", _SHARED_WORKER, str(journal), str(log), str(seed),
                          str(Path(__file__).parent)], env=env)
        for log, seed in zip(logs, seeds)
    ]
    assert [p.wait(timeout=300) for p in processes] == [0, 0]
    per_worker = [[r.config_key for r in read_records(log)] for log in logs]
    assert [len(keys) for keys in per_worker] == [24, 24]
    union = per_worker[0] + per_worker[1]
    assert len(set(union)) == len(union)  # neither process measured what the other one had
    study = optuna.load_study(study_name=default_study_name(SpaceTask(size=200)),
                              storage=optuna.storages.JournalStorage(
                                  optuna.storages.journal.JournalFileBackend(str(journal))))
    told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and "config_key" in t.user_attrs]
    assert len(told) == 48


def test_without_a_journal_lock_the_lower_trial_number_keeps_a_contested_config(tmp_path: Path) -> None:
    task = SpaceTask(size=10)
    search = OptunaSearch(task, MemoryDatabase(), storage=f"sqlite:///{tmp_path / 'study.db'}", seed=0)
    config = Config({"x": 4, "fast": True})
    earlier = search.study.ask()  # another process's claim, published while we were asking
    earlier.set_user_attr("config_key", config.key)
    ours = search.study.ask()
    ours.set_user_attr("config_key", config.key)
    other = Config({"x": 5, "fast": True})
    mine = search.study.ask()
    mine.set_user_attr("config_key", other.key)
    kept = search._keep_first_claims([(ours, config), (mine, other)])
    assert kept == [(mine, other)]
    assert search.study.trials[ours.number].state == optuna.trial.TrialState.FAIL


def test_a_changed_space_gets_a_fresh_study_fed_from_the_log(tmp_path: Path) -> None:
    journal = tmp_path / "study.optuna.journal"
    database = MemoryDatabase()
    old_task = SpaceTask(size=10)
    run_rounds(OptunaSearch(old_task, database, storage=journal, seed=0), old_task, database, batch=4, rounds=2)
    new_task = SpaceTask(size=12)  # the x knob grew: Optuna would reject the old study's parameters
    assert default_study_name(new_task) != default_study_name(old_task)
    search = OptunaSearch(new_task, database, storage=journal, seed=0)
    assert len([t for t in search.study.trials if t.user_attrs.get("source") == "log"]) == 8
    proposals = search.propose(16)
    assert not {c.key for c in proposals} & {r.config_key for r in database.records(new_task.key, "llvm")}
