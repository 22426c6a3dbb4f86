"""The cost model on real Relay tasks: model-level tuning with `--search xgb` (the default) and transfer between
the logs of two runs, through `tune_model` and the CLI's options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cost_model.features import LOOP_NEST_WIDTH, Featurizer
from cost_model.transfer import WORKLOAD_EVENT, load_transfer_data
from cost_model.xgb_model import XGBCostModel, model_path_for_log
from relay_tune.cli import build_parser, load_model
from relay_tune.errors import RelayTuneError
from relay_tune.tuning import LocalRunner, read_events, read_records
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.tuning.tune_model import BuildOptions, MeasureOptions, SearchOptions, make_search, tune_model

EXAMPLE = Path(__file__).resolve().parents[1] / "relay_tune" / "examples" / "small_cnn.relay"


@pytest.fixture(scope="module")
def example() -> Any:
    return load_model(str(EXAMPLE))


def fast_runner() -> LocalRunner:
    return LocalRunner(number=1, repeat=1, min_repeat_ms=2.0)


def test_relay_tasks_featurize(example: Any) -> None:
    tasks = tasks_from_module(example, "llvm")
    featurizer = Featurizer("loopnest")
    rng = np.random.default_rng(0)
    assert tasks
    for task in tasks:
        assert featurizer.supports(task)
        configs = [task.default_config()] + [task.space.sample(rng) for _ in range(3)]
        matrix, kept = featurizer.many(task, configs)
        assert kept and matrix.shape[1] == LOOP_NEST_WIDTH, task.description


def test_search_options(tmp_path: Path) -> None:
    args = build_parser().parse_args(["tune", "m.relay", "--transfer-from", "a.jsonl", "b.jsonl", "--trials", "3"])
    assert args.search == "xgb" and args.transfer_from == ["a.jsonl", "b.jsonl"]
    factory = make_search("xgb", seed=1, log_path=tmp_path / "x.jsonl")
    assert factory.hub.model_path == model_path_for_log(tmp_path / "x.jsonl")  # type: ignore[attr-defined]
    with pytest.raises(RelayTuneError, match="xgb"):
        make_search("tpe", transfer_from=["a.jsonl"])


@pytest.mark.slow
def test_xgb_tunes_a_model_and_a_later_run_transfers_from_its_log(example: Any, tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    result = tune_model(example, "llvm", 40, first, search=SearchOptions(seed=0, warmup_trials=2),
                        measure=MeasureOptions(runner=fast_runner()), build=BuildOptions(measure_latency=False))
    records = read_records(first)
    assert len(records) == 40 and len({(r.workload_key, r.config_key) for r in records}) == 40
    assert {r.strategy for r in records} <= {"default", "xgb"}
    described = {e.data["workload_key"] for e in read_events(first) if e.event == WORKLOAD_EVENT}
    assert described == {t.key for t in result.tasks}
    model = XGBCostModel.load(model_path_for_log(first))  # one model for all tasks, saved beside the log
    assert model.trained_rows >= 12

    # the tasks rebuild from the log alone (Relay text in the workload events) and re-lower to features
    data, report = load_transfer_data(first, Featurizer("loopnest"))
    assert data is not None and report.rows >= 30 and not report.skipped
    assert len(report.workloads) == len(result.tasks)

    second = tmp_path / "second.jsonl"
    seen: dict[str, Any] = {}

    def spy(search: str, **kwargs: Any) -> Any:
        factory = make_search(search, **kwargs)
        seen["hub"] = getattr(factory, "hub", None)
        return factory

    import relay_tune.tuning.tune_model as tm

    original = tm.make_search
    tm.make_search = spy  # type: ignore[assignment]
    try:
        tune_model(example, "llvm", 8, second, search=SearchOptions(seed=1, transfer_from=[first],
                   task_filter="conv2d"), measure=MeasureOptions(runner=fast_runner()),
                   build=BuildOptions(measure_latency=False))
    finally:
        tm.make_search = original  # type: ignore[assignment]
    hub = seen["hub"]
    assert hub is not None and hub.transfer is not None and len(hub.transfer) >= 20
    assert hub.model is not None  # trained on the first run's measurements before measuring anything


def test_relay_task_round_trips_through_its_workload_spec(example: Any) -> None:
    task = tasks_from_module(example, "llvm")[0]
    rebuilt = RelayTuneTask.from_workload_spec(task.workload_spec())
    config = task.default_config()
    featurizer = Featurizer("loopnest")
    np.testing.assert_array_equal(featurizer.one(task, config), Featurizer("loopnest").one(rebuilt, config))
