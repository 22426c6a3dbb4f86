"""XGBSearch: model-guided proposals through the Optuna study, driven by the real tuning loop.

Measurements are simulated (a deterministic cost per config, no compiling) so that hundreds of trials run in
seconds; the configs are still lowered to real loop nests for the cost model.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from cost_model.features import LOOP_NEST_SCHEMA
from cost_model.transfer import WORKLOAD_EVENT
from cost_model.xgb_model import CostModelError, XGBCostModel, model_path_for_log
from relay_tune.tuning import (
    BuildResult,
    ErrorKind,
    JsonLinesDatabase,
    MeasureInput,
    MeasureResult,
    MemoryDatabase,
    RunResult,
    TuningRecord,
    read_events,
    read_records,
    tune,
)
from relay_tune.tuning.builder import Builder
from relay_tune.tuning.operator_tasks import conv2d, dense
from relay_tune.tuning.relay_task import RelayTuneTask
from relay_tune.tuning.runner import Runner
from relay_tune.tuning.search import random_search
from relay_tune.tuning.testing import MatmulTask
from relay_tune.tuning.xgb_search import CostModelHub, XGBSearch, xgb_search
from search_space import Config

DENSE = dense(64, 48, 40)
# The unplanned NCHW templates: the fake costs below read their knobs (tile_h).
NCHW = {"layout_planning": False}
CONV = conv2d(1, 8, 14, 14, 16, 3, pad=1, **NCHW)
DW = conv2d(1, 16, 14, 14, 16, 3, pad=1, groups=16, **NCHW)
# Smaller candidate pools than the defaults keep these tests fast; the logic exercised is the same.
FAST = {"pool_random": 32, "top_k": 4, "generations": 1, "population": 6}


def _log2(value: object) -> float:
    assert isinstance(value, tuple)
    return math.log2(int(value[-1]))


def synthetic_cost(task: object, config: Config) -> float | None:
    """Seconds a config 'takes': a smooth function of register tiling, vector width, unrolling and packing with one
    best region, plus configs that 'crash' (a corner of the space), as real spaces have."""
    family = task.family if isinstance(task, RelayTuneTask) else ""
    if family == "dense":
        rows, cols, ku = _log2(config["tile_m"]), _log2(config["tile_n"]), _log2(config["tile_k"])
        if rows + cols >= 8:
            return None
        penalty = (rows - 2) ** 2 + 0.7 * (cols - 4) ** 2 + 0.3 * (ku - 2) ** 2
        penalty += 1.5 * (not config["pack_b"]) + 0.4 * (config["order"] == "mn")
        penalty += 0.2 * _log2((config["tile_m"][1],))  # type: ignore[index]
    elif family in ("conv2d_nchw", "conv2d_nchw_cl"):
        fi, xi, ic = _log2(config["tile_c"]), _log2(config["tile_w"]), _log2(config["tile_ic"])
        penalty = (fi - 3) ** 2 + 0.8 * (xi - 2) ** 2 + 0.2 * (ic - 1) ** 2 + 0.5 * (config["pad"] != "inline")
        penalty += 0.3 * (config["reduce_order"] != "hw_c") + 0.2 * (not config["unroll_kw"])
    elif family:
        hi, xi = _log2(config["tile_h"]), _log2(config["tile_w"])
        penalty = 0.5 * (hi - 1) ** 2 + 0.8 * (xi - 2.8) ** 2 + 1.0 * (config["pad"] != "root")
    else:  # the knob-only MatmulTask
        penalty = _log2(config["tile_n"]) * 0.3 + (config["order"] == "ijk")
    return 1e-3 * (1.0 + penalty)


class SyntheticBuilder(Builder):
    def build(self, task: object, configs: Sequence[Config]) -> list[BuildResult]:
        return [BuildResult(("synthetic", c), None, "", 0.0) for c in configs]


class SyntheticRunner(Runner):
    def __init__(self) -> None:
        self.calls = 0

    def run(self, task: object, artifact: object) -> RunResult:
        self.calls += 1
        assert isinstance(artifact, tuple)
        cost = synthetic_cost(task, artifact[1])
        if cost is None:
            return RunResult(None, ErrorKind.RUNTIME_ERROR, "synthetic crash", 0.0)
        return RunResult((cost,), None, "", 0.0)


def run_tune(task: object, trials: int, log: Path, strategy: object, seed: int = 0) -> list[TuningRecord]:
    tune([task], trials, log, storage=None, builder=SyntheticBuilder(), runner=SyntheticRunner(),
         strategy=strategy, batch_size=8, seed=seed, measure_default=False)  # type: ignore[arg-type]
    return [r for r in read_records(log) if r.workload_key == task.key]  # type: ignore[attr-defined]


def measure(task: object, config: Config) -> MeasureResult:
    cost = synthetic_cost(task, config)
    return MeasureResult((cost,)) if cost is not None else MeasureResult(None, ErrorKind.RUNTIME_ERROR, "crash")


# ---------------------------------------------------------------------------------------------------------------


def test_never_proposes_a_measured_config() -> None:
    database = MemoryDatabase()
    rng = np.random.default_rng(0)
    for config in {c.key: c for c in (DENSE.space.sample(rng) for _ in range(40))}.values():
        database.commit(TuningRecord.from_measurement(DENSE.key, DENSE.target, config, measure(DENSE, config)))
    already = {r.config_key for r in database.records(DENSE.key, DENSE.target)}
    search = XGBSearch(DENSE, database, seed=1, warmup=16, plan_size=16, **FAST)
    proposed: set[str] = set()
    for _ in range(15):
        batch = search.propose(8)
        assert batch, "the space is far from exhausted"
        keys = [c.key for c in batch]
        assert len(set(keys)) == len(keys)
        assert not set(keys) & already, "proposed a config measured before"
        assert not set(keys) & proposed, "proposed a config twice"
        assert all(DENSE.space.is_valid(c) for c in batch)
        proposed.update(keys)
        results = [measure(DENSE, c) for c in batch]
        for config, result in zip(batch, results):
            database.commit(TuningRecord.from_measurement(DENSE.key, DENSE.target, config, result))
        search.update([MeasureInput(DENSE.key, c) for c in batch], results)
    assert search.hub.model is not None and search.hub.stats.fits >= 3  # the model was trained and retrained
    search.close()


def test_tune_with_xgb_measures_each_config_once_and_saves_the_model(tmp_path: Path) -> None:
    log = tmp_path / "dense.jsonl"
    factory = xgb_search(None, seed=0, log_path=log, plan_size=16, **FAST)
    records = run_tune(DENSE, 96, log, factory)
    keys = [r.config_key for r in records]
    assert len(keys) == 96 and len(set(keys)) == 96
    assert {r.strategy for r in records} == {"xgb"}
    events = [e for e in read_events(log) if e.event == WORKLOAD_EVENT]
    assert len(events) == 1 and events[0].data["spec"] == DENSE.workload_spec()
    path = model_path_for_log(log)
    model = XGBCostModel.load(path, expect_schema=LOOP_NEST_SCHEMA, expect_target=DENSE.target)
    assert model.trained_rows >= 64
    # a resumed run reloads the model and continues without repeating a config
    hub = CostModelHub(model_path=path, initial_model=path)
    more = run_tune(DENSE, 120, log, xgb_search(None, seed=0, hub=hub, **FAST))
    assert len(more) == 120 and len({r.config_key for r in more}) == 120
    assert hub.stats.fits >= 1


def test_a_mismatched_saved_model_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "dense.jsonl"
    run_tune(DENSE, 40, log, xgb_search(None, seed=0, log_path=log, plan_size=16, **FAST))
    hub = CostModelHub(features="knob", initial_model=model_path_for_log(log))
    with pytest.raises(CostModelError, match="features"):
        XGBSearch(DENSE, MemoryDatabase(), hub=hub)


def test_searches_sharing_a_storage_train_on_each_others_trials(tmp_path: Path) -> None:
    """Two tuning processes on one journal and one log: disjoint proposals, and each model sees all trials."""
    storage = tmp_path / "study.journal"
    log = tmp_path / "shared.jsonl"
    searches = [XGBSearch(CONV, JsonLinesDatabase(log), storage=storage, seed=s, warmup=16, plan_size=16, **FAST)
                for s in (1, 2)]
    seen: set[str] = set()
    for round_ in range(10):
        search = searches[round_ % 2]
        batch = search.propose(6)
        keys = {c.key for c in batch}
        assert len(keys) == len(batch) and not keys & seen
        seen |= keys
        results = [measure(CONV, c) for c in batch]
        for config, result in zip(batch, results):
            search.database.commit(TuningRecord.from_measurement(CONV.key, CONV.target, config, result))
        search.update([MeasureInput(CONV.key, c) for c in batch], results)
    for search in searches:
        search._refresh_measurements()
        assert set(search.hub.tasks[CONV.key].measured) == seen
        assert search.hub.model is not None
        search.close()


def test_study_trials_from_another_log_count_as_training_data(tmp_path: Path) -> None:
    """A process tuning into another log but the same storage: its trials still reach this process's model."""
    storage = tmp_path / "study.journal"
    other = XGBSearch(DW, MemoryDatabase(), storage=storage, seed=3)
    batch = other.propose(10)
    results = [measure(DW, c) for c in batch]
    other.update([MeasureInput(DW.key, c) for c in batch], results)
    mine = XGBSearch(DW, MemoryDatabase(), storage=storage, seed=4)
    measured = mine._refresh_measurements()
    assert {c.key for c in batch} <= set(measured)
    assert all(mine._refresh_measurements()[c.key][1] > 0 for c, r in zip(batch, results) if r.ok)
    assert not {c.key for c in mine.propose(8)} & set(measured)
    other.close()
    mine.close()


def trials_to_reach(records: list[TuningRecord], target_cost: float) -> float:
    for i, record in enumerate(records):
        if record.ok and record.mean_cost is not None and record.mean_cost <= target_cost:
            return i + 1
    return math.inf


@pytest.mark.slow
@pytest.mark.parametrize("task", [DENSE, CONV], ids=lambda t: t.family)
def test_xgb_needs_fewer_trials_than_random(task: RelayTuneTask, tmp_path: Path) -> None:
    """On a synthetic objective the model-guided search reaches a near-best config in far fewer trials."""
    best = 1e-3
    target = best / 0.8  # 80% of the best possible throughput
    needed: dict[str, list[float]] = {"random": [], "xgb": []}
    for seed in range(3):
        for name in needed:
            log = tmp_path / f"{name}-{seed}.jsonl"
            factory = random_search(seed=seed) if name == "random" else xgb_search(None, seed=seed, plan_size=16)
            needed[name].append(trials_to_reach(run_tune(task, 160, log, factory, seed), target))
    random_median, xgb_median = statistics.median(needed["random"]), statistics.median(needed["xgb"])
    print(f"{task.family}: trials to 80% of the optimum, random {needed['random']}, xgb {needed['xgb']}")
    assert xgb_median < 160
    assert xgb_median <= 0.6 * random_median


def test_transfer_from_other_logs_ranks_the_first_batch(tmp_path: Path) -> None:
    other_conv = conv2d(1, 8, 12, 12, 16, 3, pad=1, **NCHW)  # the same operator and template at another size
    for name, other in (("dense", DENSE), ("conv", other_conv)):
        log = tmp_path / f"{name}.jsonl"
        run_tune(other, 64, log, xgb_search(None, seed=0, log_path=log, plan_size=16, **FAST))
    factory = xgb_search(None, seed=0, transfer_from=[tmp_path / "dense.jsonl", tmp_path / "conv.jsonl"])
    search = factory(CONV, MemoryDatabase())
    assert isinstance(search, XGBSearch)
    hub = search.hub
    assert hub.transfer is not None and len(hub.transfer) == 128
    assert hub.model is not None, "the transfer data trains a model before anything is measured"
    assert hub.transfers_to(CONV) and not hub.transfers_to(DENSE)
    assert hub.transfers_to(conv2d(1, 16, 10, 10, 8, 3, pad=1, **NCHW))  # the NCHW 3x3 template: nearly the same knobs
    assert not hub.transfers_to(conv2d(1, 16, 10, 10, 8, 1, **NCHW))  # a 1x1 template is another loop nest
    default = CONV.default_config()
    search.prioritize([default])
    first = search.propose(8)
    assert len(first) == 8 and first[0] == default
    # the local start around the default stays; the transferred model picks which neighbours come first
    local = first[1:6]  # round(0.75 * 7) ranked single-knob mutations, then random configs
    assert all(sum(c[k] != default[k] for k in CONV.space.names) == 1 for c in local)
    _, scores = hub.score(CONV, local)
    assert list(scores) == sorted(scores, reverse=True)
    search.close()
    # a workload of an operator the old logs lack is tuned as without them
    dw = xgb_search(None, seed=0, transfer_from=[tmp_path / "conv.jsonl"])(DW, MemoryDatabase())
    assert dw.hub.model is None and not dw.hub.transfers_to(DW)
    dw.close()


def test_tasks_that_cannot_be_lowered_fall_back_to_knob_features(tmp_path: Path) -> None:
    task = MatmulTask(32, 48, 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        factory = xgb_search(None, seed=0, warmup=8, plan_size=8)
        records = run_tune(task, 48, tmp_path / "mm.jsonl", factory)
    assert any("knob features" in str(w.message) for w in caught)
    assert len({r.config_key for r in records}) == len(records) == 48


def test_screening_bounds_the_configs_lowered_per_plan() -> None:
    """Once a task has a knob screener, a re-plan lowers at most its shortlist and TPE's proposals."""
    database = MemoryDatabase()
    search = XGBSearch(CONV, database, seed=2, warmup=8, plan_size=8, shortlist=20, tpe_proposals=6)
    lowered: list[int] = []
    for _ in range(8):
        before = search.hub.featurizer.computed
        batch = search.propose(8)
        lowered.append(search.hub.featurizer.computed - before)
        results = [measure(CONV, c) for c in batch]
        for config, result in zip(batch, results):
            database.commit(TuningRecord.from_measurement(CONV.key, CONV.target, config, result))
        search.update([MeasureInput(CONV.key, c) for c in batch], results)
    assert CONV.key in search.hub.screeners
    screened_rounds = lowered[3:]  # the screener exists from the second fit on
    assert max(screened_rounds) <= 20 + 6 + 8  # shortlist + TPE proposals + the new measurements
    assert search.hub.stats.plans >= 6
    search.close()


def _knobs_changed(a: Config, b: Config, task: RelayTuneTask) -> int:
    return sum(1 for name in task.space.names if a[name] != b[name])


def test_before_a_model_exists_batches_explore_around_the_best_known_config() -> None:
    """No model yet: a `cold_local` share of each batch mutates the default (before any measurement), then the best
    measured config; the rest is random, so the first training data stays diverse."""
    database = MemoryDatabase()
    search = XGBSearch(CONV, database, seed=3, warmup=16, plan_size=16, cold_local=0.75, **FAST)
    default = CONV.default_config()
    search.prioritize([default])
    first = search.propose(8)
    assert first[0] == default and len({c.key for c in first}) == 8
    local = [c for c in first[1:] if _knobs_changed(c, default, CONV) == 1]
    assert len(local) >= round(0.75 * 7), "most of the first batch should be single-knob mutations of the default"
    results = [measure(CONV, c) for c in first]
    for config, result in zip(first, results):
        database.commit(TuningRecord.from_measurement(CONV.key, CONV.target, config, result))
    search.update([MeasureInput(CONV.key, c) for c in first], results)
    best = min((c for c, r in zip(first, results) if r.ok), key=lambda c: synthetic_cost(CONV, c) or math.inf)
    second = search.propose(8)
    assert search.hub.model is None  # still warming up
    assert sum(1 for c in second if _knobs_changed(c, best, CONV) == 1) >= round(0.75 * 8)
    assert not {c.key for c in second} & {c.key for c in first}
    search.close()


def test_cold_local_zero_keeps_the_warmup_random() -> None:
    database = MemoryDatabase()
    search = XGBSearch(CONV, database, seed=3, warmup=16, cold_local=0.0, **FAST)
    default = CONV.default_config()
    search.prioritize([default])
    first = search.propose(8)
    # 7 random configs of a space with thousands of points: single-knob neighbours of the default would be a fluke
    assert first[0] == default
    assert sum(1 for c in first[1:] if _knobs_changed(c, default, CONV) == 1) <= 2
    search.close()


def test_the_model_trains_only_on_times_of_the_newest_kind(tmp_path: Path) -> None:
    """A log (and its study) from a runner that timed kernels back to back, topped up by one that times them in
    context: configs timed only the old way are not training data any more, though the study still holds them."""
    from dataclasses import replace

    storage = tmp_path / "study.journal"
    database = MemoryDatabase()
    rng = np.random.default_rng(5)
    configs = list({c.key: c for c in (CONV.space.sample(rng) for _ in range(24))}.values())[:16]
    old, new = configs[:10], configs[6:]
    for config in old:
        record = TuningRecord.from_measurement(CONV.key, CONV.target, config, measure(CONV, config))
        database.commit(replace(record, timing="back_to_back", timestamp=1.0))
    first = XGBSearch(CONV, database, storage=storage, seed=1, **FAST)
    assert set(first._refresh_measurements()) == {c.key for c in old}  # one kind: all of it
    first.close()
    for config in new:
        record = TuningRecord.from_measurement(CONV.key, CONV.target, config, measure(CONV, config))
        database.commit(replace(record, timing="in_context", timestamp=2.0))
    second = XGBSearch(CONV, database, storage=storage, seed=2, **FAST)
    assert set(second._refresh_measurements()) == {c.key for c in new}
    second.close()
