"""Cost model: loop-nest and knob features, the XGBoost ranking model, persistence, and transfer from logs.

Features come from real lowered loop nests of single-operator tuning tasks (the model tuner's templates; small
shapes, so lowering is fast);
nothing here compiles. Model tests use synthetic data with a known ordering.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from cost_model.features import (
    LOOP_NEST_SCHEMA,
    LOOP_NEST_WIDTH,
    Featurizer,
    knob_feature_names,
    knob_features,
    loop_nest_feature_names,
    loop_nest_features,
)
from cost_model.transfer import (
    WORKLOAD_EVENT,
    TransferWarning,
    load_transfer_data,
    rebuild_task,
    teaches,
    template_of,
    workload_event,
)
from cost_model.xgb_model import CostModelError, TrainingSet, XGBCostModel, model_path_for_log, recall_at_k
from relay_tune.kernel import analysis
from relay_tune.records.log_format import LogWriter, TuningRecord
from relay_tune.records.measure import ErrorKind, MeasureResult
from relay_tune.tuning.operator_tasks import conv2d, dense, dense_1024, mobilenet_depthwise, resnet50_conv3x3
from relay_tune.tuning.relay_task import RelayTuneTask
from search_space import Config

AVX512 = "llvm -mcpu=skylake-avx512 -num-cores=1"
"""The target of tasks whose tiles assume 16 float lanes and 32 registers (nothing here runs, so any host lowers
for it)."""
SMALL_DENSE = dense(64, 48, 40)
SMALL_CONV = conv2d(1, 8, 14, 14, 16, 3, pad=1, layout_planning=False)  # the NCHW template
# NCHW16c on AVX-512. One block of output channels: with two, the `order` knob swaps the two outer loops that the
# template fuses into one, which the loop-nest features do not tell apart.
SMALL_BLOCKED = conv2d(1, 32, 14, 14, 16, 3, pad=1, layout_planning=True, target=AVX512)
SMALL_DW = conv2d(1, 16, 14, 14, 16, 3, pad=1, groups=16)
NAMES = loop_nest_feature_names()


def feature(vector: np.ndarray, name: str) -> float:
    return float(vector[NAMES.index(name)])


def dense_config(task: RelayTuneTask, **overrides: object) -> Config:
    return task.default_config().replace(**overrides)


# ---------------------------------------------------------------------------------------------------------------
# loop-nest features
# ---------------------------------------------------------------------------------------------------------------


def test_layout_is_fixed_and_named() -> None:
    assert len(NAMES) == LOOP_NEST_WIDTH == len(set(NAMES))
    for task in (SMALL_DENSE, SMALL_CONV, SMALL_DW):
        vector = loop_nest_features(task.lower(task.default_config()))
        assert vector.shape == (LOOP_NEST_WIDTH,) and vector.dtype == np.float32
        assert np.isfinite(vector).all()


@pytest.mark.parametrize("task", [SMALL_DENSE, SMALL_CONV, SMALL_BLOCKED, SMALL_DW], ids=lambda t: t.family)
def test_features_are_deterministic(task: RelayTuneTask) -> None:
    rng = np.random.default_rng(3)
    for _ in range(10):
        config = task.space.sample(rng)
        first = loop_nest_features(task.lower(config))
        second = loop_nest_features(task.lower(Config(config.to_dict())))  # fresh objects, same schedule
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("task", [SMALL_DENSE, SMALL_CONV, SMALL_BLOCKED, SMALL_DW], ids=lambda t: t.family)
def test_features_differ_between_schedules_that_differ(task: RelayTuneTask) -> None:
    rng = np.random.default_rng(5)
    by_nest: dict[str, np.ndarray] = {}
    for _ in range(40):
        func = task.lower(task.space.sample(rng))
        by_nest[analysis.format_func(func)] = loop_nest_features(func)
    vectors = list(by_nest.values())
    assert len(vectors) > 20
    for i in range(len(vectors)):
        for j in range(i + 1, len(vectors)):
            assert not np.array_equal(vectors[i], vectors[j]), "two different loop nests got the same features"


def test_dense_features_mean_what_they_say() -> None:
    task = SMALL_DENSE
    m, n, k = (task.workload.dims[d] for d in ("m", "n", "k"))
    base = dict(tile_m=(8, 2, 4), tile_n=(3, 1, 16), tile_k=(10, 4), order="mn")
    plain = loop_nest_features(task.lower(dense_config(task, **base, pack_b=False)))
    packed = loop_nest_features(task.lower(dense_config(task, **base, pack_b=True)))
    # the main store: M*N*K multiply-accumulates into a local accumulator, 16 lanes wide, innermost
    assert feature(plain, "s0.fmas") == pytest.approx(np.log2(1 + m * n * k))
    assert feature(plain, "s0.accumulates") == 1.0 and feature(plain, "s0.writes_local") == 1.0
    assert feature(plain, "s0.vec_lanes") == pytest.approx(np.log2(17)) and feature(plain, "s0.vec_innermost") == 1
    assert feature(plain, "s0.unroll_product") == pytest.approx(np.log2(1 + 4 * 4))
    # unpacked W[j, k] under a vectorized j is a gather; the packed panel is contiguous
    gathers = [feature(plain, f"s0.b{b}.vec_gather") for b in range(1, 3)]
    assert max(gathers) == 1.0
    assert all(feature(packed, f"s0.b{b}.vec_gather") == 0.0 for b in range(1, 3))
    assert feature(packed, "all.local_bytes") == pytest.approx(np.log2(1 + 4 * 16 * 4))
    # the accumulator tile is reused across all of K; reuse only grows as more loops are included
    reuse = [feature(plain, f"s0.b0.reuse_curve{p}") for p in range(0, 28, 3)]
    assert reuse[-1] >= np.log2(k) and all(a <= b + 1e-6 for a, b in itertools.pairwise(reuse))


def test_parallel_and_guard_features() -> None:
    # 8 rows by 16 columns: 8 accumulators of 16 lanes
    task = dense(64, 48, 40, target="llvm -mcpu=skylake-avx512 -num-cores=2")
    config = task.default_config().replace(tile_m=(4, 2, 8), tile_n=(3, 1, 16), order="mn", parallel=1)
    vector = loop_nest_features(task.lower(config))
    assert feature(vector, "all.outer_parallel") == pytest.approx(np.log2(1 + 4))
    assert feature(vector, "s0.parallel_extent") == pytest.approx(np.log2(1 + 4))
    assert feature(loop_nest_features(SMALL_DENSE.lower(SMALL_DENSE.default_config())), "all.outer_parallel") == 0
    # tiles that do not divide 37 and 53 leave tails: lowering peels them into extra copies of the stores
    odd = dense(37, 53, 29, target=AVX512)
    tails = loop_nest_features(odd.lower(odd.default_config().replace(tile_m=(5, 2, 4), tile_n=(4, 1, 16))))
    small = dense(64, 48, 40, target=AVX512)
    even = loop_nest_features(small.lower(small.default_config().replace(tile_m=(4, 2, 8))))
    assert feature(tails, "all.stores") > feature(even, "all.stores")


def test_features_transfer_across_workloads() -> None:
    """One layout for every workload: a dense and a conv2d vector can sit in one training matrix."""
    featurizer = Featurizer("loopnest")
    rows = [featurizer.one(t, t.default_config()) for t in (SMALL_DENSE, SMALL_CONV, SMALL_DW)]
    assert all(r is not None for r in rows)
    matrix = np.stack(rows)  # type: ignore[arg-type]
    assert matrix.shape == (3, LOOP_NEST_WIDTH)
    assert featurizer.schema() == LOOP_NEST_SCHEMA and featurizer.transferable


def test_featurizer_caches_and_skips_unlowerable_configs() -> None:
    featurizer = Featurizer("loopnest")
    config = SMALL_DENSE.default_config()
    first = featurizer.one(SMALL_DENSE, config)
    assert featurizer.one(SMALL_DENSE, config) is first and featurizer.computed == 1
    illegal = config.replace(tile_m=(1, 1, 64))  # violates the register-tile constraint: the template refuses it
    matrix, kept = featurizer.many(SMALL_DENSE, [config, illegal])
    assert kept == [0] and matrix.shape == (1, LOOP_NEST_WIDTH) and featurizer.failures == 1


def test_knob_features_are_a_baseline_of_one_space() -> None:
    config = SMALL_DENSE.default_config()
    vector = knob_features(SMALL_DENSE.space, config)
    names = knob_feature_names(SMALL_DENSE.space)
    assert vector.shape == (len(names),)
    assert vector[names.index("tile_n[2]")] == pytest.approx(np.log2(config["tile_n"][2]))  # type: ignore[index]
    featurizer = Featurizer("knob")
    assert not featurizer.transferable
    assert featurizer.schema(SMALL_DENSE.space) != featurizer.schema(SMALL_CONV.space)
    with pytest.raises(ValueError, match="loop-nest"):
        load_transfer_data([], featurizer)


def test_featurizing_many_candidates_is_featurizing_each_lowered_one() -> None:
    """`Featurizer.many` of full-size ResNet-50 conv2d candidates: one finite row per candidate, the loop-nest
    features of its lowered function."""
    task = resnet50_conv3x3()
    rng = np.random.default_rng(0)
    configs = [task.space.sample(rng) for _ in range(30)]
    rows, kept = Featurizer("loopnest").many(task, configs)
    assert kept == list(range(len(configs))) and np.isfinite(rows).all()
    one_by_one = np.stack([loop_nest_features(task.lower(c)) for c in configs[:3]])
    np.testing.assert_allclose(rows[:3], one_by_one, rtol=1e-6)


def test_full_size_workloads_featurize() -> None:
    for task in (dense_1024(), resnet50_conv3x3(), mobilenet_depthwise()):
        vector = loop_nest_features(task.lower(task.default_config()))
        assert feature(vector, "all.float_ops") > 20  # > 1 M flops


# ---------------------------------------------------------------------------------------------------------------
# the XGBoost model
# ---------------------------------------------------------------------------------------------------------------


def synthetic(n: int, groups: int, seed: int, width: int = 20) -> tuple[TrainingSet, np.ndarray]:
    """Throughput is a known function of the features, on a different scale in each group; some failures."""
    rng = np.random.default_rng(seed)
    features = rng.uniform(-1, 1, size=(n, width)).astype(np.float32)
    quality = np.exp(1.5 * features[:, 0] - (features[:, 1] - 0.3) ** 2 + 0.5 * features[:, 2] * features[:, 3])
    group_ids = rng.integers(groups, size=n)
    scale = 10.0 ** group_ids  # workloads run at very different speeds
    throughput = (quality * scale).astype(np.float32)
    throughput[features[:, 4] > 0.9] = 0.0  # failed builds: worst
    names = tuple(f"w{g}" for g in group_ids)
    return TrainingSet(features, throughput, names), quality


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("loss", ["rank", "reg"])
def test_model_trained_on_synthetic_data_ranks_correctly(loss: str) -> None:
    train, _ = synthetic(600, groups=3, seed=0)
    test, quality = synthetic(300, groups=1, seed=1)
    model = XGBCostModel("synthetic", loss=loss).fit(train)
    scores = model.predict(test.features)
    ok = test.throughput > 0
    assert spearman(scores[ok], quality[ok]) > 0.85
    assert recall_at_k(scores, test.throughput, 30) >= 0.5
    # failures rank low: most of them sit in the bottom half
    assert np.mean(scores[~ok] < np.median(scores)) > 0.7


def test_incremental_update_extends_the_trees_and_learns_new_rows() -> None:
    first, _ = synthetic(60, groups=1, seed=3)
    more, _ = synthetic(240, groups=1, seed=4)
    test, quality = synthetic(300, groups=1, seed=5)
    model = XGBCostModel("synthetic", rounds=40).fit(first)
    trees = model.booster.num_boosted_rounds()
    before = spearman(model.predict(test.features), quality)
    model.update(TrainingSet.concat([first, more]), rounds=20)
    assert model.booster.num_boosted_rounds() == trees + 20
    assert spearman(model.predict(test.features), quality) > before  # the new rows taught it something
    model.fit(first)  # a fit starts from scratch again
    assert model.booster.num_boosted_rounds() == trees
    fresh = XGBCostModel("synthetic", rounds=40).update(first)  # nothing to extend yet: a full fit
    np.testing.assert_array_equal(fresh.predict(test.features), model.predict(test.features))


def test_labels_are_normalised_per_workload_and_failures_are_worst() -> None:
    data = TrainingSet(np.zeros((5, 2), np.float32), np.array([2.0, 4.0, 0.0, 100.0, 50.0], np.float32),
                       ("a", "a", "a", "b", "b"))
    np.testing.assert_allclose(data.normalised_labels(), [0.5, 1.0, 0.0, 1.0, 0.5])


def test_model_save_load_round_trip(tmp_path: Path) -> None:
    train, _ = synthetic(200, groups=2, seed=2)
    model = XGBCostModel(LOOP_NEST_SCHEMA, target="llvm -mcpu=test", loss="rank").fit(train)
    path = model.save(tmp_path / "tune.jsonl.xgb.json")
    text = path.read_text()
    assert json.loads(text)["learner"]["attributes"]["feature_schema"] == LOOP_NEST_SCHEMA  # XGBoost's JSON
    loaded = XGBCostModel.load(path, expect_schema=LOOP_NEST_SCHEMA, expect_target="llvm -mcpu=test")
    np.testing.assert_array_equal(loaded.predict(train.features), model.predict(train.features))
    assert loaded.loss == "rank" and loaded.width == train.features.shape[1]
    with pytest.raises(CostModelError, match="features"):
        XGBCostModel.load(path, expect_schema="knob-v1:other")
    with pytest.raises(CostModelError, match="target"):
        XGBCostModel.load(path, expect_target="cuda -arch=sm_90")
    with pytest.raises(CostModelError, match="takes 20 features"):
        loaded.predict(np.zeros((2, 7), np.float32))
    (tmp_path / "torn.json").write_text(text[: len(text) // 2])
    with pytest.raises(CostModelError, match="cannot read"):
        XGBCostModel.load(tmp_path / "torn.json")
    assert model_path_for_log("logs/m.jsonl") == Path("logs/m.jsonl.xgb.json")


def test_untrained_model_refuses() -> None:
    model = XGBCostModel("x")
    with pytest.raises(CostModelError):
        model.predict(np.zeros((1, 3), np.float32))
    with pytest.raises(CostModelError):
        model.save("/nonexistent/never.json")
    with pytest.raises(ValueError):
        XGBCostModel("x", loss="hinge")


# ---------------------------------------------------------------------------------------------------------------
# transfer
# ---------------------------------------------------------------------------------------------------------------


def fake_cost(task: RelayTuneTask, config: Config) -> float:
    """A deterministic stand-in for a measurement: more FMAs per loaded byte is faster."""
    vector = loop_nest_features(task.lower(config))
    return float(2.0 ** -feature(vector, "s0.intensity_32k") * 1e-3 + 1e-4)


def write_log(path: Path, task: RelayTuneTask, n: int, seed: int, describe: bool = True, fail_every: int = 0) -> None:
    rng = np.random.default_rng(seed)
    writer = LogWriter(path)
    if describe:
        event = workload_event(task)
        assert event is not None
        writer.write_one(event)
    entries = []
    for i in range(n):
        config = task.space.sample(rng)
        if fail_every and i % fail_every == 0:
            result = MeasureResult(None, ErrorKind.RUNTIME_ERROR, "crashed")
        else:
            result = MeasureResult((fake_cost(task, config),))
        entries.append(TuningRecord.from_measurement(task.key, task.target, config, result, flops=task.flops))
    writer.write(entries)


def test_workload_events_rebuild_tasks() -> None:
    event = workload_event(SMALL_CONV)
    assert event is not None and event.event == WORKLOAD_EVENT
    rebuilt = rebuild_task(event.data["spec"])
    assert rebuilt.key == SMALL_CONV.key and rebuilt.space.size() == SMALL_CONV.space.size()
    with pytest.raises(KeyError):
        rebuild_task({"kind": "nobody-knows"})


def test_transfer_loads_other_logs(tmp_path: Path) -> None:
    write_log(tmp_path / "dense.jsonl", SMALL_DENSE, 30, seed=1, fail_every=7)
    write_log(tmp_path / "conv.jsonl", SMALL_CONV, 25, seed=2)
    featurizer = Featurizer("loopnest")
    data, report = load_transfer_data(tmp_path, featurizer, target=SMALL_DW.target)
    assert data is not None and report.rows == len(data) == 55
    assert set(data.groups) == {f"transfer:{SMALL_DENSE.key}|{SMALL_DENSE.target}",
                                f"transfer:{SMALL_CONV.key}|{SMALL_CONV.target}"}
    assert (data.throughput == 0).sum() == 5  # the failed runs stay in, as the worst
    assert data.features.shape[1] == LOOP_NEST_WIDTH
    # the task being tuned is left out of its own transfer set
    data, report = load_transfer_data(tmp_path, featurizer, exclude=[(SMALL_DENSE.key, SMALL_DENSE.target)])
    assert data is not None and report.rows == 25
    # another target kind is left out
    data, report = load_transfer_data(tmp_path, featurizer, target="cuda -arch=sm_90")
    assert data is None and len(report.skipped) == 2


def test_transfer_warns_about_logs_it_cannot_rebuild(tmp_path: Path) -> None:
    write_log(tmp_path / "anon.jsonl", SMALL_DENSE, 10, seed=3, describe=False)
    featurizer = Featurizer("loopnest")
    with pytest.warns(TransferWarning, match="does not describe its task"):
        data, report = load_transfer_data(tmp_path / "anon.jsonl", featurizer)
    assert data is None and SMALL_DENSE.key in report.skipped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data, _ = load_transfer_data(tmp_path / "anon.jsonl", featurizer, tasks=[SMALL_DENSE])
    assert data is not None and len(data) == 10
    with pytest.raises(FileNotFoundError):
        load_transfer_data(tmp_path / "missing.jsonl", featurizer)


def test_model_trained_on_other_workloads_ranks_a_new_one(tmp_path: Path) -> None:
    """Transfer in miniature: learn from dense and depthwise logs, rank conv2d candidates better than chance."""
    write_log(tmp_path / "dense.jsonl", SMALL_DENSE, 120, seed=4)
    write_log(tmp_path / "depthwise.jsonl", SMALL_DW, 120, seed=5)
    featurizer = Featurizer("loopnest")
    data, _ = load_transfer_data(tmp_path, featurizer)
    assert data is not None
    model = XGBCostModel(LOOP_NEST_SCHEMA).fit(data)
    rng = np.random.default_rng(6)
    configs = list({c.key: c for c in (SMALL_CONV.space.sample(rng) for _ in range(80))}.values())
    matrix, kept = featurizer.many(SMALL_CONV, configs)
    truth = np.asarray([1.0 / fake_cost(SMALL_CONV, configs[i]) for i in kept])
    # the conv2d template's nests (a channels-innermost register tile) are of a family the trees never saw; still
    # clearly better than chance (for 80 candidates a rank correlation of 0.35 has p < 0.002; 0.88 measured).
    # Learning from dense and conv2d does not rank this depthwise space (192 configs, 0.0 measured): its nests
    # differ most in what the other two never vary.
    assert spearman(model.predict(matrix), truth) > 0.35


def test_parallel_featurization_matches_serial() -> None:
    rng = np.random.default_rng(8)
    configs = list({c.key: c for c in (SMALL_CONV.space.sample(rng) for _ in range(80))}.values())
    serial = Featurizer("loopnest")
    parallel = Featurizer("loopnest", jobs=2)
    try:
        expected, kept = serial.many(SMALL_CONV, configs)
        got, kept_parallel = parallel.many(SMALL_CONV, configs)
        assert kept == kept_parallel
        np.testing.assert_array_equal(got, expected)
        assert parallel.computed == len(configs) and parallel._pool is not None  # the workers did the work
    finally:
        parallel.close()


def test_transfer_teaches_only_similar_templates() -> None:
    nchw = {"layout_planning": False}
    conv3_cl = template_of(conv2d(1, 8, 14, 14, 16, 3, pad=1, **nchw))
    conv3 = template_of(conv2d(1, 16, 10, 10, 8, 3, pad=1, **nchw))
    conv1, matmul = template_of(conv2d(1, 16, 10, 10, 8, 1, **nchw)), template_of(dense(64, 48, 40))
    assert conv3_cl.startswith("conv2d_nchw_cl:") and conv3.startswith("conv2d_nchw:")
    assert teaches(conv3_cl, conv3) and teaches(conv3, conv3_cl)  # one loop structure, another layout
    assert not teaches(conv3, conv1) and not teaches(conv3, matmul)
    assert teaches(conv3, conv1, "operator") and not teaches(conv3, conv3_cl, "template")
    assert teaches(conv3, matmul, "any") and teaches("", matmul)  # a workload of unknown template: as before


def test_transfer_trains_on_one_timing_kind_per_workload(tmp_path: Path) -> None:
    """A log topped up after the runner changed how it times: the workload's group holds only the newest kind's
    times (throughputs are ranked within a group, and the two kinds differ by the way they were taken)."""
    from dataclasses import replace

    from relay_tune.records.log_format import read_records

    path = tmp_path / "dense.jsonl"
    write_log(path, SMALL_DENSE, 20, seed=1)
    records = read_records(path)
    event = workload_event(SMALL_DENSE)
    assert event is not None
    retimed = [replace(r, timing="back_to_back", timestamp=1.0) for r in records[:12]]
    retimed += [replace(r, timing="in_context", timestamp=2.0) for r in records[8:]]
    path.unlink()
    LogWriter(path).write([event, *retimed])
    data, report = load_transfer_data(path, Featurizer("loopnest"))
    assert data is not None and report.rows == len(records) - 8
