"""How many measurements does each search strategy need? Random vs Optuna TPE vs XGBoost-guided (with and without
transfer from other workloads).

    python -m experiments search                       # 3 workloads x 4 strategies x 5 seeds x 300 trials
    python -m experiments search --trials 60 --seeds 2  # a quick run
    nohup python -m experiments search > search_efficiency.out 2>&1 &

Workloads: dense 1024x1024x1024, a ResNet-50 3x3 conv2d (1x64x56x56, 64 filters, pad 1) and a MobileNet-v2
depthwise 3x3 conv2d (1x144x56x56, pad 1). By default each is a one-operator Relay model whose weight is a
constant, tuned as `relay-tune` tunes a model's task (`RelayTuneTask`, the schedule templates and spaces of
`search_space.cpu`). Kernels run on one
core (`--cores`). Every run goes through the real tuning loop (`relay_tune.tuning.tune`: search strategy, parallel
builder, process-isolated runner with the model tuner's timing settings, JSON-lines log). "xgb-transfer" for a
workload warms its model with the "xgb" logs of the other two workloads (same seed), so the xgb runs of every
workload come first. As in `relay-tune`, every run measures the task's default schedule first, whatever the strategy
(`--no-default` turns that off). `--strategies ...,xgb-random-warmup` adds an ablation: xgb whose batches before the
first fit are all random instead of mostly single-knob mutations of the best known config.

Transfer between related workloads (the "old logs" tuned first, with xgb, same seed, and not reported):

    python -m experiments search --workloads r50_1x1a,c3x3_96,depthwise \
        --transfer-sources r18_c128,r18_c256 --strategies xgb,xgb-transfer,xgb-transfer-operator,xgb-transfer-old \
        --trials 40 --source-trials 48 --out experiments/results/transfer [--resume]

The sources are ResNet-18's 3x3 convolutions of stages 2 and 3; the targets a ResNet-50 1x1 convolution, a 3x3
convolution of a size ResNets lack, and a depthwise convolution (an operator the old logs do not contain).
"xgb-transfer-operator" and "xgb-transfer-old" are the transfer of earlier versions (see ABLATIONS).

Transfer between whole models: a workload "<model>:<index>" is a tuning task of a network of
`relay_tune.testing.onnx_zoo` (imported from ONNX as relay-tune does), "<model>:*" all of them, "<model>:topN" the N
of the largest weight x FLOPs:

    python -m experiments search --workloads mobilenet_v2:* --transfer-sources mobilenet_v1:* \
        --strategies xgb,xgb-transfer --trials 40 --source-trials 40 --out experiments/results/transfer_models

Besides the per-task rows, it prints per network the trials (all its tasks together, each tuned with the same
number) until the model's estimated latency (sum of weight x FLOPs / best GFLOPS) is within 95% of the best any run
reaches, median over seeds, and how many times fewer transfer needs (`whole_model.csv`).

Measurements are shared between runs: the first time a config of a workload is measured its result is stored in
`<out>/measurements/<workload>.jsonl`, and later runs (any strategy, any seed, any later invocation) are answered
from it. Every strategy therefore sees the same noise for the same config, and the full experiment costs far less
than 18,000 measurements. `--no-cache` measures everything for real (use it to time a single run). At the end the
configs within `--remeasure-share` of the best are timed again together, in interleaved rounds, and the curves are
rebuilt from those values (see `remeasure_leaders`): on a shared machine the same kernel can time 10-20% apart an
hour later, and the 95% bar should not be set by whichever config happened to be timed in a quiet minute.

Outputs in `--out` (default experiments/results/search_efficiency): `curves.csv` (best GFLOPS after each trial of
each run), `summary.csv`, `search_efficiency.png` (median best GFLOPS vs trials, band = min..max over seeds), and
on stdout for each strategy the trials needed to reach 95% of the best config any strategy found (median over
seeds), plus the model's share of the time.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments import UsageError
from relay_tune.tuning import (
    BuildResult,
    ErrorKind,
    LocalBuilder,
    LocalRunner,
    RunResult,
    read_records,
    tune,
)
from relay_tune.tuning.builder import Builder
from relay_tune.tuning.runner import Runner
from relay_tune.tuning.search import StrategyFactory, optuna_search, random_search
from relay_tune.tuning.task import BuildArtifact, TuneTask
from relay_tune.tuning.xgb_search import xgb_search
from search_space import Config

STRATEGIES = ("random", "tpe", "xgb", "xgb-transfer")
# selectable with --strategies, not run by default. "xgb-transfer-old": transfer as it was before the transfer
# fix (the transferred model ranks the whole pool from the first batch; logs of every operator train it).
# "xgb-transfer-operator" / "-template": logs of the same operator / the same template (not of a similar one) train
# the model.
# "xgb-transfer-fade16": the old rows' weight halves every 16 own measurements instead of 64.
ABLATIONS = ("xgb-random-warmup", "xgb-transfer-old", "xgb-transfer-operator", "xgb-transfer-template",
             "xgb-transfer-any-op", "xgb-transfer-fade16")
TARGET_SHARE = 0.95

RELAY_WORKLOADS: dict[str, tuple[str, tuple[int, ...]]] = {
    "dense": ("""#[version = "0.0.5"]
def @main(%x: Tensor[(1024, 1024), float32], %w: Tensor[(1024, 1024), float32]) {
  nn.dense(%x, %w)
}""", (1024, 1024)),
    "conv2d": ("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 64, 56, 56), float32], %w: Tensor[(64, 64, 3, 3), float32]) {
  nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=64, kernel_size=[3, 3])
}""", (64, 64, 3, 3)),
    "depthwise": ("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 144, 56, 56), float32], %w: Tensor[(144, 1, 3, 3), float32]) {
  nn.conv2d(%x, %w, padding=[1, 1, 1, 1], groups=144, channels=144, kernel_size=[3, 3])
}""", (144, 1, 3, 3)),
}
WORKLOADS = tuple(RELAY_WORKLOADS)


def _conv(n: int, c: int, hw: int, k: int, kernel: int) -> tuple[str, tuple[int, ...]]:
    pad = kernel // 2
    return (f"""#[version = "0.0.5"]
def @main(%x: Tensor[({n}, {c}, {hw}, {hw}), float32], %w: Tensor[({k}, {c}, {kernel}, {kernel}), float32]) {{
  nn.conv2d(%x, %w, padding=[{pad}, {pad}, {pad}, {pad}], channels={k}, kernel_size=[{kernel}, {kernel}])
}}""", (k, c, kernel, kernel))


# Transfer families (not run by default; `--workloads` names them): ResNet-18's 3x3 convolutions of stages 2 and 3
# as the old logs, ResNet-50's 1x1 bottleneck convolutions and a 3x3 of another size as related targets.
RELAY_WORKLOADS.update({
    "r18_c128": _conv(1, 128, 28, 128, 3),   # ResNet-18 stage 2 3x3
    "r18_c256": _conv(1, 256, 14, 256, 3),   # ResNet-18 stage 3 3x3
    "r50_1x1a": _conv(1, 256, 56, 64, 1),    # ResNet-50 stage 1 bottleneck reduce 1x1
    "r50_1x1b": _conv(1, 128, 28, 512, 1),   # ResNet-50 stage 2 bottleneck expand 1x1
    "c3x3_96": _conv(1, 96, 35, 96, 3),      # a 3x3 conv of a size ResNets do not have (Inception-like)
    "c3x3_192": _conv(1, 192, 17, 192, 3),   # another (held out: not looked at while the transfer rule was chosen)
})
EXTRA_WORKLOADS = tuple(w for w in RELAY_WORKLOADS if w not in WORKLOADS)


def relay_task(name: str, cores: int) -> Any:
    """The tuning task of a one-operator Relay model whose weight is a constant (as in a real model), or task
    number N of a network of `relay_tune.testing.onnx_zoo` ("mobilenet_v2:07", see `model_workloads`). The
    one-operator models are extracted with layout planning and Winograd off, so their one task is the operator's
    own kernel (planning would add layout transforms around it, Winograd split a 3x3 convolution in three)."""
    import numpy as np

    from relay_tune.compile import bind_params
    from relay_tune.text import parse_module
    from relay_tune.tuning.relay_task import tasks_from_module
    from relay_tune.type_infer import infer_types

    if ":" in name:
        model, index = name.split(":")
        return model_tasks(model, cores)[int(index)]
    source, weight_shape = RELAY_WORKLOADS[name]
    weight = np.random.default_rng(0).standard_normal(weight_shape).astype("float32")
    mod = infer_types(bind_params(infer_types(parse_module(source)), {"w": weight}))
    (task,) = tasks_from_module(mod, f"llvm -num-cores={cores}", layout_planning=False, winograd="off")
    return task


# Whole models: every task of a network (its tuning tasks, as `relay-tune MODEL` extracts them), for transfer
# between models (`--workloads mobilenet_v2:* --transfer-sources mobilenet_v1:*`). Tasks are named
# "<model>:<index>"; "<model>:topN" takes the N tasks of the largest weight x FLOPs.
_MODEL_TASKS: dict[tuple[str, int], list[Any]] = {}


def model_tasks(model: str, cores: int) -> list[Any]:
    """The tuning tasks of a `relay_tune.testing.onnx_zoo` network (imported from an ONNX file, as relay-tune
    does)."""
    if (model, cores) not in _MODEL_TASKS:
        import tempfile

        import onnx

        from relay_tune.frontend import from_onnx
        from relay_tune.testing.onnx_zoo import network
        from relay_tune.tuning.relay_task import tasks_from_module

        try:
            built = network(model)
        except KeyError as error:
            raise ValueError(error.args[0]) from None
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{model}.onnx"
            onnx.save(built, str(path))
            mod, _ = from_onnx(path)
        _MODEL_TASKS[(model, cores)] = tasks_from_module(mod, f"llvm -num-cores={cores}")
    return _MODEL_TASKS[(model, cores)]


def model_workloads(names: Sequence[str], cores: int) -> list[str]:
    """`names` with every "<model>:*" / "<model>:topN" replaced by the task names it stands for."""
    out: list[str] = []
    for name in names:
        if ":" not in name:
            out.append(name)
            continue
        model, which = name.split(":", 1)
        tasks = model_tasks(model, cores)
        if which == "*":
            picked = range(len(tasks))
        elif which.startswith("top"):
            n = int(which.removeprefix("top"))
            picked = sorted(sorted(range(len(tasks)), key=lambda i: -tasks[i].weight * tasks[i].flops)[:n])
        else:
            picked = [int(which)]
            if not 0 <= picked[0] < len(tasks):
                raise ValueError(f"{model} has {len(tasks)} tasks; no task {which}")
        out += [f"{model}:{i:02d}" for i in picked]
    return list(dict.fromkeys(out))


SPACES = "relay"  # part of the measurement cache's file names (the spaces are the model tuner's)


# ---------------------------------------------------------------------------------------------------------------
# Shared measurements
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Stored:
    costs: list[float] | None
    error: str | None
    build_s: float
    run_s: float


class MeasurementCache:
    """Config key -> measured result of one workload, appended to a JSON-lines file as measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, _Stored] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError:  # a line torn when an earlier invocation was killed
                        continue
                    self.entries[item["config_key"]] = _Stored(item["costs"], item["error"], item["build_s"],
                                                               item["run_s"])

    def put(self, key: str, stored: _Stored) -> None:
        self.entries[key] = stored
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps({"config_key": key, "costs": stored.costs, "error": stored.error,
                                  "build_s": stored.build_s, "run_s": stored.run_s}) + "\n")


@dataclass(frozen=True)
class _CachedArtifact:
    key: str


class CachingBuilder(Builder):
    """Builds only configs the cache has not seen; the others get a marker the caching runner answers."""

    def __init__(self, inner: Builder, caches: dict[str, MeasurementCache]) -> None:
        self.inner = inner
        self.caches = caches

    def build(self, task: TuneTask, configs: Sequence[Config]) -> list[BuildResult]:
        cache = self.caches[task.key]
        fresh = [c for c in configs if c.key not in cache.entries]
        built = dict(zip((c.key for c in fresh), self.inner.build(task, fresh))) if fresh else {}
        results: list[BuildResult] = []
        for config in configs:
            if config.key in built:
                result = built[config.key]
                if result.artifact is None:
                    cache.put(config.key, _Stored(None, (result.error_kind or ErrorKind.COMPILE_ERROR).name,
                                                  result.build_seconds, 0.0))
                else:
                    assert isinstance(result.artifact, BuildArtifact)
                    result.artifact.info["config_key"] = config.key
                    result.artifact.info["build_s"] = result.build_seconds
                results.append(result)
                continue
            stored = cache.entries[config.key]
            if stored.costs is None and stored.run_s == 0.0:  # a build error
                results.append(BuildResult(None, ErrorKind[stored.error or "COMPILE_ERROR"], "cached", stored.build_s))
            else:
                results.append(BuildResult(_CachedArtifact(config.key), None, "", stored.build_s))
        return results

    def close(self) -> None:
        self.inner.close()


class CachingRunner(Runner):
    def __init__(self, inner: Runner, caches: dict[str, MeasurementCache]) -> None:
        self.inner = inner
        self.caches = caches

    @property
    def timing_kind(self) -> str:
        return self.inner.timing_kind

    def run(self, task: TuneTask, artifact: Any) -> RunResult:
        cache = self.caches[task.key]
        if isinstance(artifact, _CachedArtifact):
            stored = cache.entries[artifact.key]
            if stored.costs is not None:
                return RunResult(tuple(stored.costs), None, "", stored.run_s)
            return RunResult(None, ErrorKind[stored.error or "RUNTIME_ERROR"], "cached", stored.run_s)
        result = self.inner.run(task, artifact)
        key = artifact.info.get("config_key")
        if key is not None:
            cache.put(key, _Stored(list(result.costs) if result.costs else None,
                                   result.error_kind.name if result.error_kind else None,
                                   float(artifact.info.get("build_s", 0.0)), max(result.run_seconds, 1e-9)))
        return result

    def close(self) -> None:
        self.inner.close()


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    workload: str
    strategy: str
    seed: int
    best_curve: list[float]  # best GFLOPS after each trial
    search_s: float
    wall_s: float
    measure_s: float  # build + run seconds these trials cost when first measured
    model: dict[str, float] = field(default_factory=dict)
    trials: list[tuple[Config, float]] = field(default_factory=list)  # (config, GFLOPS; 0 = failed) in trial order
    first_curve: list[float] = field(default_factory=list)  # best_curve before re-measurement


def strategy_factory(name: str, seed: int, log: Path, transfer: list[Path], options: argparse.Namespace
                     ) -> StrategyFactory:
    if name == "random":
        return random_search(seed=seed)
    if name == "tpe":
        return optuna_search(storage=None, sampler="tpe", seed=seed)
    # Only the options given on the command line: otherwise the strategy runs with relay-tune's own defaults.
    xgb_options = {name: getattr(options, name) for name in ("plan_size", "epsilon", "warmup")
                   if getattr(options, name) is not None}
    if name == "xgb":
        return xgb_search(None, seed=seed, log_path=log, loss=options.loss, features=options.features,
                          **xgb_options)
    if name == "xgb-random-warmup":  # ablation: no local search around the default before the first fit
        return xgb_search(None, seed=seed, log_path=log, loss=options.loss, features=options.features,
                          **{"cold_local": 0.0, **xgb_options})
    if name == "xgb-transfer":
        return xgb_search(None, seed=seed, log_path=log, transfer_from=transfer, loss=options.loss,
                          features=options.features, **xgb_options)
    if name == "xgb-transfer-old":
        return xgb_search(None, seed=seed, log_path=log, transfer_from=transfer, loss=options.loss,
                          features=options.features, transfer_match="any",
                          **{"transfer_local_start": False, **xgb_options})
    if name == "xgb-transfer-fade16":
        return xgb_search(None, seed=seed, log_path=log, transfer_from=transfer, loss=options.loss,
                          features=options.features, transfer_half_life=16.0, **xgb_options)
    if name in ("xgb-transfer-operator", "xgb-transfer-template"):
        return xgb_search(None, seed=seed, log_path=log, transfer_from=transfer, loss=options.loss,
                          features=options.features, transfer_match=name.rsplit("-", 1)[1], **xgb_options)
    if name == "xgb-transfer-any-op":  # the local start, but logs of every operator train the model
        return xgb_search(None, seed=seed, log_path=log, transfer_from=transfer, loss=options.loss,
                          features=options.features, transfer_match="any", **xgb_options)
    raise ValueError(f"unknown strategy {name!r}")


def run_one(task: Any, workload: str, strategy: str, seed: int, args: argparse.Namespace,
            builder: Builder, runner: Runner, caches: dict[str, MeasurementCache]) -> RunOutcome:
    log = args.out / "logs" / workload / f"{strategy}-s{seed}.jsonl"
    done = getattr(args, "resume", False) and log.exists() and \
        sum(1 for r in read_records(log) if r.workload_key == task.key) >= args.trials
    if log.exists() and not done:
        log.unlink()
    for side in log.parent.glob(f"{log.name}*"):
        if not done:
            side.unlink()
    sources = args.transfer_sources or args.workloads
    transfer = [args.out / "logs" / other / f"xgb-s{seed}.jsonl" for other in sources if other != workload]
    factory = None if done else strategy_factory(strategy, seed, log, transfer, args)
    start = time.monotonic()
    if done:  # --resume: a complete log of an earlier invocation stands for the run (no search timings then)
        search_s = 0.0
    else:
        summary = tune([task], args.trials, log, storage=None, builder=builder, runner=runner, strategy=factory,
                       batch_size=args.batch, seed=seed, measure_default=not args.no_default)
        search_s = summary.seconds.get("search", 0.0)
    wall = time.monotonic() - start
    records = [r for r in read_records(log) if r.workload_key == task.key][: args.trials]
    measure_s = 0.0
    cache = caches.get(task.key)
    trials: list[tuple[Config, float]] = []
    for record in records:
        gflops = record.gflops or 0.0
        trials.append((record.config, gflops))
        if cache is not None and record.config_key in cache.entries:
            stored = cache.entries[record.config_key]
            measure_s += stored.build_s / max(1, args.build_jobs) + stored.run_s
        else:
            measure_s += record.build_seconds / max(1, args.build_jobs) + record.run_seconds
    model: dict[str, float] = {}
    hub = getattr(factory, "hub", None)
    if hub is not None:
        stats = hub.stats
        model = {"fit_s": stats.fit, "features_s": stats.features, "predict_s": stats.predict,
                 "candidates_s": stats.candidates, "fits": stats.fits, "featurized": stats.featurized,
                 "feature_ms": hub.featurizer.mean_ms}
    curve = best_so_far(g for _, g in trials)
    return RunOutcome(workload, strategy, seed, curve, search_s, wall, measure_s, model, trials, list(curve))


def remeasure_leaders(outcomes: list[RunOutcome], tasks: dict[str, Any], args: argparse.Namespace,
                      builder: Builder, runner: Runner) -> None:
    """Measure the leading configs of each workload again, together, and rebuild every curve from those values.

    The shared cache measures each config once, at whatever moment a run first met it; on a shared machine the
    same kernel can time 10-20% apart an hour later. Left as is, the 95% bar would be set by whichever config
    happened to be timed in a quiet minute. So every config that any run measured within `--remeasure-share` of
    the best is built again and timed in `--remeasure-rounds` rounds, each in a new random order (interleaved,
    so a slow spell hits all of them alike); its value is the median over the rounds of each round's fastest
    timing. Not the fastest over all rounds: on a shared 2-core machine a single-threaded kernel also runs *faster*
    than usual while the other core idles (a higher turbo clock), and the fastest of three rounds let one config
    of the dense plateau time 185 GFLOPS once and 164-167 in five later rounds, setting a bar nothing else reached.
    Results are kept in `<out>/measurements/<workload>-relay-remeasured.jsonl`; a rerun only times configs not
    there yet.
    Configs below the share keep their first measurement: they cannot reach the bar unless the best drops by more
    than the margin, which is checked.
    """
    import random

    for workload in args.workloads:
        runs = [o for o in outcomes if o.workload == workload]
        if not runs:
            continue
        task = tasks[workload]
        first: dict[str, tuple[Config, float]] = {}
        for o in runs:
            for config, gflops in o.trials:
                first[config.key] = (config, gflops)
        best = max(g for _, g in first.values())
        leaders = [config for config, g in first.values() if g >= args.remeasure_share * best]
        store = args.out / "measurements" / f"{workload}-{SPACES}-remeasured.jsonl"
        values: dict[str, float] = {}
        if store.exists():
            for line in store.read_text().splitlines():
                if line.strip():
                    item = json.loads(line)
                    values[item["config_key"]] = item["gflops"]
        todo = [c for c in leaders if c.key not in values]
        print(f"re-measuring {workload}: {len(leaders)} configs within {args.remeasure_share:.0%} of "
              f"{best:.1f} GFLOPS ({len(leaders) - len(todo)} already done), {args.remeasure_rounds} rounds",
              flush=True)
        if todo:
            built = builder.build(task, todo)
            rounds: dict[str, list[float]] = {c.key: [] for c in todo}  # each round's fastest timing
            order = [(c, b) for c, b in zip(todo, built) if b.artifact is not None]
            for round_index in range(args.remeasure_rounds):
                random.Random(round_index).shuffle(order)
                for config, build in order:
                    result = runner.run(task, build.artifact)
                    if result.costs and result.error_kind is None:
                        rounds[config.key].append(min(result.costs))
            store.parent.mkdir(parents=True, exist_ok=True)
            with store.open("a") as out:
                for config in todo:
                    per_round = [task.flops / cost / 1e9 for cost in rounds[config.key]]
                    gflops = statistics.median(per_round) if per_round else 0.0
                    values[config.key] = gflops
                    out.write(json.dumps({"config_key": config.key, "gflops": gflops, "rounds": per_round,
                                          "first_gflops": first[config.key][1]}) + "\n")
        new_best = max((values[c.key] for c in leaders), default=0.0)
        if TARGET_SHARE * new_best < args.remeasure_share * best:
            print(f"  warning: the re-measured best ({new_best:.1f}) dropped so far that configs left out of the "
                  f"re-measurement could reach the bar; raise --remeasure-share", flush=True)
        shown = sorted(leaders, key=lambda c: -values[c.key])[:3]
        for config in shown:
            print(f"  {values[config.key]:7.1f} GFLOPS (first measured {first[config.key][1]:.1f}): {config}")
        for o in runs:
            o.best_curve = best_so_far(values.get(config.key, gflops) for config, gflops in o.trials)


def best_so_far(gflops: Iterable[float]) -> list[float]:
    """The best value after each trial."""
    return list(itertools.accumulate(gflops, max))


def trials_to_reach(curve: Sequence[float], threshold: float) -> int | None:
    for i, value in enumerate(curve):
        if value >= threshold:
            return i + 1
    return None


def _reach_line(workload: str, runs: list[RunOutcome], strategies: Sequence[str], share: float, cap: int) -> str:
    """One table row: per strategy the median trials its runs needed to reach `share` of the best of all runs."""
    best = max(max(o.best_curve, default=0.0) for o in runs)
    cells = []
    for strategy in strategies:
        reach = [trials_to_reach(o.best_curve, share * best) for o in runs if o.strategy == strategy]
        cells.append(_fmt_trials(reach, cap) if reach else "-")
    return f"{workload:<10} {best:>11.1f}  " + "  ".join(f"{c:>18}" for c in cells)


def _fmt_trials(values: list[int | None], cap: int) -> str:
    """Median trials over seeds; runs that never got there count as above the budget."""
    filled = [v if v is not None else math.inf for v in values]
    median = statistics.median(filled)
    missed = sum(1 for v in values if v is None)
    text = f">{cap}" if math.isinf(median) else f"{median:g}"
    return text + (f" ({missed} missed)" if missed else "")


def whole_model_table(outcomes: list[RunOutcome], args: argparse.Namespace) -> list[dict[str, Any]]:
    """For the networks among the workloads ("<model>:<index>"): the model's estimated latency after i trials of
    every task (sum over its tasks of weight x FLOPs / best GFLOPS after i trials) against the best estimate any
    run reaches; per strategy, the median over seeds of the trials (i x tasks) until the estimate is within
    `TARGET_SHARE` of that best. Tasks whose operator family no --transfer-sources task has are listed apart."""
    rows: list[dict[str, Any]] = []
    source_families = {str(relay_task(w, args.cores).family) for w in args.transfer_sources}
    for model in dict.fromkeys(w.split(":")[0] for w in args.workloads if ":" in w):
        names = [w for w in args.workloads if w.startswith(model + ":")]
        tasks = {w: relay_task(w, args.cores) for w in names}
        best = {w: max((max(o.best_curve, default=0.0) for o in outcomes if o.workload == w), default=0.0)
                for w in names}
        if any(b <= 0 for b in best.values()):
            continue
        best_s = sum(t.weight * t.flops / (best[w] * 1e9) for w, t in tasks.items())
        print()
        print(f"{model}, {len(names)} tasks: trials (all tasks together) until the estimated model latency is within "
              f"{TARGET_SHARE:.0%} of the best any run reaches ({best_s * 1e3:.3f} ms), median over seeds")
        medians: dict[str, float] = {}
        for strategy in args.strategies:
            reach: list[float] = []
            for seed in sorted({o.seed for o in outcomes}):
                runs = {o.workload: o for o in outcomes if o.strategy == strategy and o.seed == seed}
                if not all(w in runs for w in names):
                    continue
                length = min(len(runs[w].best_curve) for w in names)
                hit = math.inf
                for i in range(length):
                    values = [runs[w].best_curve[i] for w in names]
                    if min(values) <= 0:
                        continue
                    estimate = sum(tasks[w].weight * tasks[w].flops / (v * 1e9) for w, v in zip(names, values))
                    if estimate * TARGET_SHARE <= best_s:
                        hit = (i + 1) * len(names)
                        break
                reach.append(hit)
            if not reach:
                continue
            medians[strategy] = statistics.median(reach)
            text = " ".join("-" if math.isinf(r) else f"{r:g}" for r in reach)
            ratio = medians.get("xgb", math.nan) / medians[strategy] if strategy != "xgb" else math.nan
            print(f"  {strategy:<22} median {medians[strategy]:g} trials (seeds: {text})"
                  + (f"; {ratio:.2f}x fewer than xgb" if not math.isnan(ratio) and not math.isinf(ratio) else ""))
            rows.append({"model": model, "strategy": strategy, "tasks": len(names),
                         "median_trials_to_95pct": medians[strategy], "trials_per_seed": text})
        unseen = [w for w, t in tasks.items() if args.transfer_sources and str(t.family) not in source_families]
        if unseen:
            print(f"  tasks of a family the old logs lack: {', '.join(unseen)} (see their rows above)")
    return rows


def report(outcomes: list[RunOutcome], args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "curves.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["workload", "strategy", "seed", "trial", "best_gflops", "best_gflops_first_measured"])
        for o in outcomes:
            for i, (value, first) in enumerate(zip(o.best_curve, o.first_curve or o.best_curve)):
                writer.writerow([o.workload, o.strategy, o.seed, i + 1, f"{value:.4f}", f"{first:.4f}"])
    rows = []
    print()
    print(f"trials to reach {TARGET_SHARE:.0%} of the best config found by any strategy (median over seeds)")
    header = f"{'workload':<10} {'best GFLOPS':>11}  " + "  ".join(f"{s:>18}" for s in args.strategies)
    print(header)
    for workload in args.workloads:
        runs = [o for o in outcomes if o.workload == workload]
        if not runs:
            continue
        best = max(max(o.best_curve, default=0.0) for o in runs)
        first_best = max(max(o.first_curve or o.best_curve, default=0.0) for o in runs)
        print(_reach_line(workload, runs, args.strategies, TARGET_SHARE, args.trials))
        for strategy in args.strategies:
            mine = [o for o in runs if o.strategy == strategy]
            reach = [trials_to_reach(o.best_curve, TARGET_SHARE * best) for o in mine]
            final = [o.best_curve[-1] if o.best_curve else 0.0 for o in mine]
            if mine:
                median_trials = statistics.median([v if v is not None else math.inf for v in reach])
                first_reach = [trials_to_reach(o.first_curve or o.best_curve, TARGET_SHARE * first_best) for o in mine]
                rows.append({"workload": workload, "strategy": strategy, "best_gflops_any": f"{best:.2f}",
                             "median_trials_to_95pct": median_trials,
                             "trials_per_seed": " ".join(str(v) if v else "-" for v in reach),
                             "missed_seeds": sum(1 for v in reach if v is None),
                             "first_measured_best_gflops_any": f"{first_best:.2f}",
                             "first_measured_median_trials_to_95pct": statistics.median(
                                 [v if v is not None else math.inf for v in first_reach]),
                             "median_final_gflops": f"{statistics.median(final):.2f}",
                             "median_search_s": f"{statistics.median(o.search_s for o in mine):.2f}",
                             "median_wall_s": f"{statistics.median(o.wall_s for o in mine):.2f}",
                             "median_measure_s": f"{statistics.median(o.measure_s for o in mine):.2f}"})
    if any(o.first_curve and o.first_curve != o.best_curve for o in outcomes):
        print("(leading configs re-measured together; summary.csv also has the table as first measured)")
    model_rows = whole_model_table(outcomes, args)
    if model_rows:
        with (args.out / "whole_model.csv").open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(model_rows[0]))
            writer.writeheader()
            writer.writerows(model_rows)
    for share in args.also_share:
        print()
        print(f"trials to reach {share:.0%} of the best (a stricter bar, within the timing noise of the plateau)")
        for workload in args.workloads:
            runs = [o for o in outcomes if o.workload == workload]
            if runs:
                print(_reach_line(workload, runs, args.strategies, share, args.trials))
    print()
    print("median final best GFLOPS")
    for workload in args.workloads:
        cells = []
        for strategy in args.strategies:
            finals = [o.best_curve[-1] for o in outcomes
                      if o.workload == workload and o.strategy == strategy and o.best_curve]
            cells.append(f"{statistics.median(finals):>18.1f}" if finals else f"{'-':>18}")
        print(f"{workload:<10} {'':>11}  " + "  ".join(cells))
    print()
    print("time of the model-guided runs: search (model training, ranking, Optuna) vs measurement-equivalent time")
    for o in outcomes:
        if not o.model:
            continue
        share = o.search_s / (o.search_s + o.measure_s) if o.search_s + o.measure_s > 0 else 0.0
        print(f"  {o.workload:<10} {o.strategy:<17} seed {o.seed}: search {o.search_s:6.1f} s "
              f"(fit {o.model['fit_s']:.1f}, "
              f"features {o.model['features_s']:.1f} = {o.model['featurized']:.0f} x {o.model['feature_ms']:.2f} ms, "
              f"predict {o.model['predict_s']:.1f}, pool {o.model['candidates_s']:.1f}), measuring {o.measure_s:6.1f} s"
              f" -> {share:.1%} of the time" + (f"; wall {o.wall_s:.1f} s, search {o.search_s / o.wall_s:.1%} of it"
                                                  if args.no_cache and o.wall_s > 0 else ""))
    if rows:
        with (args.out / "summary.csv").open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    plot(outcomes, args)


def plot(outcomes: list[RunOutcome], args: argparse.Namespace) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    workloads = [w for w in args.workloads if any(o.workload == w for o in outcomes)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for strategy in args.strategies:
            curves = [o.best_curve for o in outcomes if o.workload == workload and o.strategy == strategy]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            matrix = np.array([c[:length] for c in curves])
            x = np.arange(1, length + 1)
            line = ax.plot(x, np.median(matrix, axis=0), label=strategy)[0]
            ax.fill_between(x, matrix.min(axis=0), matrix.max(axis=0), color=line.get_color(), alpha=0.15)
        best = max((max(o.best_curve, default=0.0) for o in outcomes if o.workload == workload), default=0.0)
        ax.axhline(TARGET_SHARE * best, color="gray", linestyle="--", linewidth=0.8,
                   label=f"{TARGET_SHARE:.0%} of the best")
        ax.set_title(workload)
        ax.set_xlabel("trials")
        ax.set_ylabel("best GFLOPS so far")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = args.out / "search_efficiency.png"
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated: {','.join(WORKLOADS)} (transfer families: {','.join(EXTRA_WORKLOADS)})")
    parser.add_argument("--transfer-sources", default="",
                        help="comma-separated workloads whose xgb logs (same seed) warm xgb-transfer (default: the "
                             "other workloads of the run); they are tuned with xgb first and not reported")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated: {','.join(STRATEGIES)} (ablation: {','.join(ABLATIONS)})")
    parser.add_argument("--source-trials", type=int, default=100, help="trials of each --transfer-sources log")
    parser.add_argument("--batch", type=int, default=8, help="configs proposed and measured per round")
    parser.add_argument("--cores", type=int, default=1, help="cores the kernels may use (1: single-core kernels)")
    parser.add_argument("--build-jobs", type=int, default=2, help="parallel builds")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/search_efficiency"))
    parser.add_argument("--no-cache", action="store_true", help="measure every config for real")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the complete logs of an earlier invocation with the same --out instead of tuning "
                             "again (a run that hit a time limit continues where it stopped)")
    parser.add_argument("--no-default", action="store_true",
                        help="do not measure the task's default schedule first (relay-tune does, for every strategy)")
    parser.add_argument("--plan-size", type=int, help="xgb: most new measurements between fits (default: relay-tune's)")
    parser.add_argument("--epsilon", type=float, help="xgb: share of random configs per batch (default: relay-tune's)")
    parser.add_argument("--warmup", type=int, help="xgb: measurements before the first fit (default: relay-tune's)")
    parser.add_argument("--loss", choices=("rank", "reg"), default="rank")
    parser.add_argument("--features", choices=("loopnest", "knob"), default="loopnest")
    parser.add_argument("--timeout", type=float, default=10.0, help="run timeout per kernel (s)")
    parser.add_argument("--remeasure-share", type=float, default=0.8,
                        help="re-measure, together, every config within this share of the best (0: off)")
    parser.add_argument("--also-share", type=float, nargs="*", default=[0.98],
                        help="also print trials to reach these shares of the best (default: 0.98)")
    parser.add_argument("--remeasure-rounds", type=int, default=5, help="interleaved rounds of the re-measurement")


def run(args: argparse.Namespace) -> int:
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.strategies = [s for s in args.strategies.split(",") if s]
    args.transfer_sources = [w for w in args.transfer_sources.split(",") if w]
    try:
        args.workloads = model_workloads(args.workloads, args.cores)
        args.transfer_sources = model_workloads(args.transfer_sources, args.cores)
    except ValueError as err:
        raise UsageError(str(err)) from None
    for w in args.workloads + args.transfer_sources:
        if w not in RELAY_WORKLOADS and ":" not in w:
            raise UsageError(f"unknown workload {w!r}; choose from {', '.join(RELAY_WORKLOADS)} or MODEL:INDEX")
    for s in args.strategies:
        if s not in STRATEGIES + ABLATIONS:
            raise UsageError(f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES + ABLATIONS)}")
    # xgb logs feed the transfer runs of the other workloads: run every plain xgb first.
    order = sorted(args.strategies, key=lambda s: (s.startswith("xgb-transfer"), (STRATEGIES + ABLATIONS).index(s)))
    tasks = {w: relay_task(w, args.cores) for w in dict.fromkeys(args.workloads + args.transfer_sources)}
    caches = {t.key: MeasurementCache(args.out / "measurements" / f"{w}-{SPACES}.jsonl") for w, t in tasks.items()}
    # The model tuner's timing (`tune_model.default_runner`): three timings of at least 40 ms, a warm-up call and a
    # correctness check per config.
    runner: Runner = LocalRunner(timeout=args.timeout, number=1, repeat=3, min_repeat_ms=40.0, warmup=1)
    builder: Builder = LocalBuilder(n_parallel=args.build_jobs)
    raw_builder, raw_runner = builder, runner
    if not args.no_cache:
        builder, runner = CachingBuilder(builder, caches), CachingRunner(runner, caches)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"{len(args.workloads)} workloads x {len(order)} strategies x {len(seeds)} seeds x {args.trials} trials; "
          f"{'measuring everything' if args.no_cache else 'shared measurement cache'}; out: {args.out}")
    for w, t in tasks.items():
        print(f"  {w}: {t.description}, {t.flops / 1e9:.3f} GFLOP, space {t.space.size():,} knob combinations")
    started = time.monotonic()
    outcomes: list[RunOutcome] = []
    try:
        if any(s.startswith("xgb-transfer") for s in order):
            for source in (w for w in args.transfer_sources if w not in args.workloads):
                for seed in seeds:  # the old logs; kept between invocations (their runs are not reported)
                    log = args.out / "logs" / source / f"xgb-s{seed}.jsonl"
                    if log.exists() and sum(1 for _ in read_records(log)) >= args.source_trials:
                        continue
                    source_args = argparse.Namespace(**{**vars(args), "trials": args.source_trials})
                    outcome = run_one(tasks[source], source, "xgb", seed, source_args, builder, runner, caches)
                    print(f"[{time.monotonic() - started:7.0f} s] old log {source} seed {seed}: best "
                          f"{max(outcome.best_curve, default=0):.1f} GFLOPS", flush=True)
        for strategy in order:
            for seed in seeds:
                for workload in args.workloads:
                    outcome = run_one(tasks[workload], workload, strategy, seed, args, builder, runner, caches)
                    outcomes.append(outcome)
                    print(f"[{time.monotonic() - started:7.0f} s] {workload:<10} {strategy:<17} seed {seed}: best "
                          f"{outcome.best_curve[-1] if outcome.best_curve else 0:.1f} GFLOPS, search "
                          f"{outcome.search_s:.1f} s, wall {outcome.wall_s:.1f} s", flush=True)
        if args.remeasure_share > 0:
            remeasure_leaders(outcomes, tasks, args, raw_builder, raw_runner)
    finally:
        builder.close()
        runner.close()
    report(outcomes, args)
    print(f"total wall time: {time.monotonic() - started:.0f} s")
    return 0
