"""The per-user tuning cache: filled by tuning runs, consulted by tuning runs and builds, listed, pruned and
exported by `relay-tune cache`; concurrent appends and unreadable lines are safe."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from relay_tune.cli import load_model, main
from relay_tune.logs import load
from relay_tune.records.cache import TuningCache, default_cache_dir, records_since
from relay_tune.records.log_format import LogWarning, TuningRecord, host_cpu_name
from relay_tune.records.measure import ErrorKind
from relay_tune.tuning import LocalRunner, read_records
from relay_tune.tuning.tune_model import BuildOptions, MeasureOptions, SearchOptions, tune_model
from search_space import Config

EXAMPLE = Path(__file__).resolve().parents[1] / "relay_tune" / "examples" / "small_cnn.relay"


def record(key: str, cost: float | None, *, target: str = "llvm -mcpu=x", cpu: str | None = None,
           tile: int = 1, timestamp: float = 1.0e9, trial: int = 0) -> TuningRecord:
    costs = () if cost is None else (cost,)
    return TuningRecord(workload_key=key, target=target, config=Config({"tile": tile}), costs=costs,
                        error_kind=None if cost is not None else ErrorKind.RUNTIME_ERROR, description=f"op {key}",
                        flops=1e6, host_cpu=host_cpu_name() if cpu is None else cpu, timestamp=timestamp,
                        trial=trial, session="s")


def test_default_folder_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_TUNE_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RELAY_TUNE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "relay-tune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "relay-tune"


def test_tests_never_touch_the_users_cache(_private_tuning_cache: Path) -> None:
    assert TuningCache.default().folder == _private_tuning_cache
    assert Path.home() not in _private_tuning_cache.parents


def test_add_keeps_valid_records_and_usable_filters_target_and_cpu(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path / "c")
    added = cache.add([record("a", 2e-3), record("a", None, trial=1), record("b", 1e-3, cpu="othercpu"),
                       record("c", 1e-3, target="cuda -arch=sm_90")])
    assert added == 3  # the failed measurement teaches a build nothing
    cache.add([record("a", 2e-3)])  # the same measurement again (two runs on one log): counted once
    assert len(cache.records()) == 3
    usable = cache.usable(["llvm -mcpu=x"])
    assert [r.workload_key for r in usable] == ["a"]  # other CPU models and targets are kept, not used
    assert cache.tuned_keys(["llvm -mcpu=x"], cpu="othercpu") == {"b"}
    frame = load(cache.path)  # the logs' own format: one call into pandas
    assert len(frame) == 3 and set(frame.workload_key) == {"a", "b", "c"}


def _append_many(folder: str, worker: int) -> None:
    cache = TuningCache(folder)
    for i in range(50):
        cache.add([record(f"w{worker}", 1e-3 + i * 1e-6, tile=i, trial=i)])


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    records = TuningCache(tmp_path).records()
    assert len(records) == 200 and len({(r.workload_key, r.trial) for r in records}) == 200


def test_a_corrupt_line_is_warned_about_not_fatal(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path)
    cache.add([record("a", 1e-3)])
    with cache.path.open("a") as out:
        out.write('{"v": 1, "workload_key": "torn\n')
    cache.add([record("b", 1e-3)])
    with pytest.warns(LogWarning, match="skipped 1 unreadable"):
        assert {r.workload_key for r in cache.records()} == {"a", "b"}


def test_prune_keeps_the_best_drops_other_cpus_and_old_records(tmp_path: Path) -> None:
    cache = TuningCache(tmp_path)
    cache.add([record("a", c, tile=i, trial=i, timestamp=2e9) for i, c in enumerate((3e-3, 1e-3, 2e-3, 4e-3))])
    cache.add([record("a", 1e-3, cpu="othercpu", timestamp=2e9), record("b", 1e-3, timestamp=1e9)])
    kept, dropped = cache.prune(keep_best=2)
    assert (kept, dropped) == (4, 2)
    assert sorted(r.cost for r in cache.records() if r.workload_key == "a" and r.host_cpu != "othercpu") == \
        [1e-3, 2e-3]
    assert cache.prune(cpu=host_cpu_name()) == (3, 1)
    assert cache.prune(before=1.5e9) == (2, 1)
    assert {r.workload_key for r in cache.records()} == {"a"}
    cache.add([record("c", 1e-3)])  # appends after a rewrite land in the same file
    assert len(cache.records()) == 3


def test_records_since_reads_what_a_run_appended(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    TuningCache(tmp_path).export(log, [record("a", 1e-3)])
    offset = log.stat().st_size
    TuningCache(tmp_path / "x").export(log, [record("b", 1e-3)])
    assert [r.workload_key for r in records_since(log, offset)] == ["b"]


def test_cache_command_lists_prunes_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["cache"]) == 0
    assert "is empty" in capsys.readouterr().out
    folder = tmp_path / "c"
    cache = TuningCache(folder)
    cache.add([record("a", c, tile=i, trial=i) for i, c in enumerate((3e-3, 1e-3, 2e-3))])
    cache.add([record("a", 5e-3, cpu="othercpu")])
    assert main(["cache", "list", "--cache", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "4 records" in text and "op a" in text and "othercpu" in text and "1.000 ms" in text
    out = tmp_path / "best.jsonl"
    assert main(["cache", "export", "--cache", str(folder), "-o", str(out), "--best", "1"]) == 0
    assert sorted(r.cost for r in read_records(out)) == [1e-3, 5e-3]
    assert main(["cache", "export", "--cache", str(folder), "-o", str(out)]) == 1  # exists: needs --force
    assert "--force" in capsys.readouterr().err
    assert main(["cache", "prune", "--cache", str(folder)]) == 1  # nothing said to drop: a message, no traceback
    assert "--keep" in capsys.readouterr().err
    assert main(["cache", "prune", "--cache", str(folder), "--before", "yesterday"]) == 1
    assert main(["cache", "prune", "--cache", str(folder), "--keep", "1", "--this-cpu"]) == 0
    assert [r.cost for r in cache.records()] == [1e-3]
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    assert "CPU model" in capsys.readouterr().out


def fast_runner() -> LocalRunner:
    return LocalRunner(number=1, repeat=1, min_repeat_ms=2.0)


@pytest.fixture(scope="module")
def example() -> Any:
    return load_model(str(EXAMPLE))


def test_a_second_run_measures_nothing_new_and_builds_the_same_configs(example: Any, tmp_path: Path) -> None:
    # the three convolutions (12 trials, rounds of 3: each gets its default and two more)
    cache = TuningCache(tmp_path / "cache")
    first = tune_model(example, "llvm", 12, tmp_path / "one.jsonl", search=SearchOptions(batch_size=3, cache=cache,
                       task_filter="conv2d"), measure=MeasureOptions(runner=fast_runner()),
                       build=BuildOptions(measure_latency=False))
    valid = [r for r in read_records(first.log_path) if r.ok]
    assert first.summary.trials_this_session == 12 and first.cache_added == len(valid) > 0
    assert len(cache.records()) == len(valid)
    # another log, same model: every task is answered by the cache
    second = tune_model(example, "llvm", 12, tmp_path / "two.jsonl", search=SearchOptions(batch_size=3, cache=cache,
                        task_filter="conv2d"), measure=MeasureOptions(runner=fast_runner()),
                        build=BuildOptions(measure_latency=False))
    assert second.summary.trials_this_session == 0 and not second.log_path.exists()  # nothing measured
    assert second.cached_tasks == len(second.tasks) and second.cache_added == 0
    assert second.configs == first.configs and first.configs  # the same config per task
    assert all(t.stopped and "tuning cache" in t.stopped for t in second.tasks)
    assert {t.key: t.best_cost for t in second.tasks} == {t.key: t.best_cost for t in first.tasks}
    assert second.model is not None
    # asked to, it tunes again (and the cache grows)
    third = tune_model(example, "llvm", 3, tmp_path / "three.jsonl", search=SearchOptions(batch_size=3, cache=cache,
                       retune=True, task_filter="conv2d"), measure=MeasureOptions(runner=fast_runner()),
                       build=BuildOptions(measure_latency=False))
    assert third.summary.trials_this_session == 3 and third.cached_tasks == 0
    # a log that has records of a task keeps its own budget: a larger --trials continues it
    more = tune_model(example, "llvm", 15, tmp_path / "one.jsonl", search=SearchOptions(batch_size=3, cache=cache,
                      task_filter="conv2d"), measure=MeasureOptions(runner=fast_runner()),
                      build=BuildOptions(measure_latency=False))
    assert more.summary.trials_this_session == 3 and more.cached_tasks == 0


def test_cli_second_run_with_another_log_measures_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    model = tmp_path / "dense.relay"
    model.write_text('#[version = "0.0.5"]\ndef @main(%x: Tensor[(4, 32), float32], %w: Tensor[(16, 32), float32]) '
                     '{\n  nn.dense(%x, %w)\n}\n')
    assert main([str(model), "--trials", "4", "--log", str(tmp_path / "a.jsonl")]) == 0
    assert "record(s) added to" in capsys.readouterr().out
    assert main([str(model), "--trials", "4", "--log", str(tmp_path / "b.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "0 trials this run" in text and "tuned before on this CPU were not tuned again" in text
    # no --log: the cache's records (the in-graph timing check is skipped: it could drop a record on a loaded machine)
    assert main(["build", str(model), "-o", str(tmp_path / "m.rtmod"), "--no-check-tuned"]) == 0
    assert "1 tuned" in capsys.readouterr().out
    assert main(["build", str(model), "-o", str(tmp_path / "m.rtmod"), "--no-cache", "--no-check-tuned"]) == 0
    assert "0 tuned" in capsys.readouterr().out
