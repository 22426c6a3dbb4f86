"""How steady and how fast are the runner's measurements? Three parts, each against a baseline in the same run:

    python experiments/runner_stability.py first      # spread between the repeats of a task's first measurement
    python experiments/runner_stability.py agreement  # the same configs in two fresh runners (2 x 2 runners)
    python experiments/runner_stability.py speed      # trials per second of real tuning runs

`first`: ResNet-50-like conv2d+bias+relu tasks (cold weights, the tuner's timing: at least 40 ms per repeat, 3
repeats); for each task, as the tuner does, the default config first, then `--configs` random ones. Each row is
one measurement; the spread is max / min of its repeats. Variants, interleaved task by task:
  baseline   - the runner as the tuner had it before (one warm-up call, copies of the weights built per config);
  current    - the runner as it is now (`default_runner`'s settings).
`agreement`: `--configs` configs per task, measured as one tuning round per task (`Runner.run_batch`) by two fresh
runners of each variant (fresh measurement processes): `serial` times a round's configs one after the other, each
config's repeats back to back; `interleaved` (the tuner's runner) checks them all, then times one repeat of each
per pass. Per config the disagreement of the two runners' costs, |a - b| / min(a, b), for the fastest repeat
(what the log ranks by), the median repeat, and `MeasureResult.cost`.
`speed`: `tune_model` on a model of six such convolutions (`SPEED_SHAPES`), a fixed number of trials, with the
baseline runner and the current one alternately (`--rounds` each); trials per second of the whole tuning run.

Writes experiments/results/runner_stability_<part>.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from timing import write_rows  # noqa: E402

import relay_tune  # noqa: E402
from relay_tune.records.measure import MeasureResult  # noqa: E402
from relay_tune.text import parse_module  # noqa: E402
from relay_tune.tuning.relay_task import tasks_from_module  # noqa: E402
from relay_tune.tuning.runner import LocalRunner, random_inputs  # noqa: E402
from relay_tune.tuning.tune_model import COLD_WEIGHTS_BYTES, default_runner, tune_model  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"

# (channels in, height = width, channels out, kernel, stride): ResNet-50 convolutions
SHAPES = [(64, 56, 64, 3, 1), (256, 56, 64, 1, 1), (128, 28, 128, 3, 1), (512, 28, 128, 1, 1),
          (256, 14, 256, 3, 1), (512, 7, 512, 3, 1)]
# `speed`: small weights (16-64 KiB: 1,024-4,096 copies) and larger ones, all from ResNet-50; more tasks than the
# baseline kept reference outputs of, as in a whole model
SPEED_SHAPES = [(64, 56, 64, 1, 1), (64, 56, 256, 1, 1), (128, 28, 128, 3, 1), (256, 56, 64, 1, 1),
                (256, 14, 256, 3, 1), (512, 7, 512, 3, 1)]


def conv_module(shapes: list[tuple[int, int, int, int, int]], seed: int = 0) -> object:
    """A chain-free module of independent conv2d+bias+relu layers with bound (constant) weights at trained scale."""
    params, lines, outs, inputs = {}, [], [], []
    rng = np.random.default_rng(seed)
    for i, (c, hw, k, kernel, stride) in enumerate(shapes):
        pad = kernel // 2
        inputs.append(f"%x{i}: Tensor[(1, {c}, {hw}, {hw}), float32]")
        inputs.append(f"%w{i}: Tensor[({k}, {c}, {kernel}, {kernel}), float32], %b{i}: Tensor[({k}), float32]")
        n = 3 * i
        lines.append(f"  %{n} = nn.conv2d(%x{i}, %w{i}, strides=[{stride}, {stride}], padding=[{pad}, {pad}, "
                     f"{pad}, {pad}], channels={k}, kernel_size=[{kernel}, {kernel}]);")
        lines.append(f"  %{n + 1} = nn.bias_add(%{n}, %b{i});")
        lines.append(f"  %{n + 2} = nn.relu(%{n + 1});")
        outs.append(f"%{n + 2}")
        params[f"w{i}"] = (rng.standard_normal((k, c, kernel, kernel)) * np.sqrt(2.0 / (c * kernel * kernel))
                           ).astype("float32")
        params[f"b{i}"] = rng.uniform(-0.1, 0.1, (k,)).astype("float32")
    body = "\n".join(lines) + f"\n  ({', '.join(outs)})" if len(outs) > 1 else "\n".join(lines) + f"\n  {outs[0]}"
    text = f'#[version = "0.0.5"]\ndef @main({", ".join(inputs)}) {{\n{body}\n}}\n'
    return relay_tune.bind_params(parse_module(text), params)


def conv_tasks(shapes: list[tuple[int, int, int, int, int]]) -> list[object]:
    tasks = [t for t in tasks_from_module(conv_module(shapes), "llvm") if "conv2d" in t.description]
    assert len(tasks) == len(shapes), [t.description for t in tasks]
    return tasks


class _BaselineRunner(LocalRunner):
    """Reference outputs as the runner had them before: computed with numpy's BLAS on all its threads, kept for
    the last four tasks."""

    def _data_for(self, task: object) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        cached = self._task_data.get(task.key)
        if cached is not None:
            self._task_data.move_to_end(task.key)
            return cached
        inputs = random_inputs(task.input_specs(), self.seed)
        expected = [np.asarray(r) for r in task.reference([a.copy() for a in inputs])]
        self._task_data[task.key] = (inputs, expected)
        while len(self._task_data) > 4:
            self._task_data.popitem(last=False)
        return inputs, expected


def baseline_runner() -> LocalRunner:
    """The tuner's runner before this experiment's changes: one warm-up call, weight copies built per config,
    the reference computed on all of BLAS's threads."""
    return _BaselineRunner(number=1, repeat=3, min_repeat_ms=40.0, warmup=1, warmup_ms=0.0,
                       cold_weights_bytes=COLD_WEIGHTS_BYTES, reuse_weight_copies=False)


VARIANTS = {"baseline": baseline_runner, "current": default_runner}
# Diagnostic variants of `first` (--variants): the baseline with a 20 ms warm-up; the baseline with a pause
# between computing the task's reference outputs (in this process) and its first measurement.
DIAGNOSTIC = {"warmup20": lambda: _BaselineRunner(number=1, repeat=3, min_repeat_ms=40.0, warmup_ms=20.0,
                                                  cold_weights_bytes=COLD_WEIGHTS_BYTES, reuse_weight_copies=False),
              "pause": baseline_runner}


def configs_of(task: object, count: int, seed: int) -> list[object]:
    rng = np.random.default_rng(seed)
    configs = [task.default_config()]
    while len(configs) < count + 1:
        config = task.space.sample(rng)
        if config not in configs:
            configs.append(config)
    return configs


def spread(costs: tuple[float, ...]) -> float:
    return max(costs) / min(costs)


def part_first(args: argparse.Namespace) -> list[dict]:
    tasks = conv_tasks(SHAPES)
    rows = []
    factories = {**VARIANTS, **DIAGNOSTIC}
    runners = {name: factories[name]() for name in args.variants}
    try:
        for t, task in enumerate(tasks):
            artifacts = [task.build(c) for c in configs_of(task, args.configs, seed=t)]
            order = list(runners) if t % 2 == 0 else list(reversed(runners))
            for name in order:
                if name == "pause":
                    runners[name]._data_for(task)  # the reference, as the first run would compute it
                    time.sleep(0.5)
                for position, artifact in enumerate(artifacts):
                    result = runners[name].run(task, artifact)
                    if result.costs is None:
                        print(f"  {task.description} config {position}: {result.error_kind} {result.error_msg}")
                        continue
                    rows.append({"variant": name, "task": task.description, "position": position,
                                 "spread": spread(result.costs), "costs_us": " ".join(f"{c * 1e6:.1f}"
                                                                                       for c in result.costs),
                                 "run_s": result.run_seconds})
    finally:
        for runner in runners.values():
            runner.close()
    print(f"{'variant':10s} {'which':8s} {'n':>4s} {'median spread':>14s} {'max':>6s} {'> 1.5x':>7s} {'> 1.1x':>7s}")
    for name in runners:
        for which, keep in (("first", lambda r: r["position"] == 0), ("later", lambda r: r["position"] > 0)):
            values = [r["spread"] for r in rows if r["variant"] == name and keep(r)]
            if values:
                print(f"{name:10s} {which:8s} {len(values):4d} {statistics.median(values):14.3f} "
                      f"{max(values):6.2f} {sum(v > 1.5 for v in values):7d} {sum(v > 1.1 for v in values):7d}")
    return rows


def serial_runner() -> LocalRunner:
    """The tuner's runner timing a round's configs one after the other, each config's repeats back to back."""
    runner = default_runner()
    runner.interleave = False
    return runner


# `agreement`: a round's configs measured one by one, against interleaved (`LocalRunner.run_batch`, the tuner's)
AGREEMENT_VARIANTS = {"serial": serial_runner, "interleaved": default_runner}


def part_agreement(args: argparse.Namespace) -> list[dict]:
    tasks = conv_tasks(SHAPES)
    rounds = [(task, [task.build(c) for c in configs_of(task, args.configs - 1, t)]) for t, task in enumerate(tasks)]
    work = [(task, artifact) for task, artifacts in rounds for artifact in artifacts]
    costs: dict[tuple[str, int], list[tuple[float, ...]]] = {}
    names = list(AGREEMENT_VARIANTS)
    for trial in range(2):
        for name in (names if trial == 0 else reversed(names)):  # interleaved: A B, then B A
            with AGREEMENT_VARIANTS[name]() as runner:
                i = 0
                for task, artifacts in rounds:  # one tuning round per task, as the tuner measures them
                    for result in runner.run_batch(task, artifacts):
                        assert result.costs is not None, result.error_msg
                        costs.setdefault((name, i), []).append(result.costs)
                        i += 1
    rows = []

    def disagreement(x: float, y: float) -> float:
        return abs(x - y) / min(x, y)

    for (name, i), (a, b) in sorted(costs.items()):
        rows.append({"variant": name, "task": work[i][0].description, "config": i,
                     "run1_us": " ".join(f"{c * 1e6:.1f}" for c in a), "run2_us": " ".join(f"{c * 1e6:.1f}" for c in b),
                     "disagreement_min": disagreement(min(a), min(b)),
                     "disagreement_median": disagreement(statistics.median(a), statistics.median(b)),
                     "disagreement_cost": disagreement(MeasureResult(a).cost, MeasureResult(b).cost)})
    print(f"{'variant':10s} {'statistic':10s} {'median':>7s} {'max':>7s} {'> 5%':>5s}   (of {len(work)} configs)")
    for name in names:
        for column in ("disagreement_min", "disagreement_median", "disagreement_cost"):
            values = [r[column] for r in rows if r["variant"] == name]
            print(f"{name:10s} {column[13:]:10s} {statistics.median(values):7.1%} {max(values):7.1%} "
                  f"{sum(v > 0.05 for v in values):5d}")
    return rows


def part_speed(args: argparse.Namespace) -> list[dict]:
    mod = conv_module(SPEED_SHAPES)
    rows = []
    for round_ in range(args.rounds):
        for name in (VARIANTS if round_ % 2 == 0 else reversed(VARIANTS)):
            with tempfile.TemporaryDirectory() as folder, VARIANTS[name]() as runner:
                start = time.monotonic()
                result = tune_model(mod, "llvm", args.trials, Path(folder) / "log.jsonl", storage=None,
                                    search=args.search, runner=runner, measure_latency=False, seed=round_)
                seconds = time.monotonic() - start
                stats = runner.worker_stats()
            trials = result.summary.trials_this_session
            run_s = result.summary.seconds.get("run", 0.0)
            rows.append({"variant": name, "round": round_, "trials": trials, "seconds": seconds,
                         "trials_per_s": trials / seconds, "run_seconds": run_s,
                         "copy_sets_built": stats.get("copy_sets_built", ""),
                         "copy_sets_reused": stats.get("copy_sets_reused", ""),
                         "copy_seconds": stats.get("copy_seconds", "")})
            print(f"  {name:9s} round {round_}: {trials} trials in {seconds:.1f} s ({trials / seconds:.2f}/s; "
                  f"measuring {run_s:.1f} s, of which making weight copies {stats.get('copy_seconds', 0):.2f} s; "
                  f"copy sets built {stats.get('copy_sets_built', '-')}, reused {stats.get('copy_sets_reused', '-')})")
    base = statistics.median(r["trials_per_s"] for r in rows if r["variant"] == "baseline")
    now = statistics.median(r["trials_per_s"] for r in rows if r["variant"] == "current")
    base_run = statistics.median(r["run_seconds"] for r in rows if r["variant"] == "baseline")
    now_run = statistics.median(r["run_seconds"] for r in rows if r["variant"] == "current")
    print(f"trials/s: baseline {base:.3f}, current {now:.3f} ({now / base:.2f}x); measuring seconds per run: "
          f"baseline {base_run:.1f}, current {now_run:.1f} ({base_run / now_run:.2f}x less)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("first", "agreement", "speed"))
    parser.add_argument("--configs", type=int, default=5, help="configs per task besides the default (first), "
                        "configs per task (agreement)")
    parser.add_argument("--trials", type=int, default=96, help="trials of each tuning run (speed)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=[*VARIANTS, *DIAGNOSTIC],
                        help="runners compared (first)")
    parser.add_argument("--search", default="xgb", help="search strategy of the tuning runs (speed)")
    parser.add_argument("--rounds", type=int, default=2, help="tuning runs per variant (speed)")
    args = parser.parse_args()
    rows = {"first": part_first, "agreement": part_agreement, "speed": part_speed}[args.part](args)
    write_rows(RESULTS / f"runner_stability_{args.part}.csv", rows)


if __name__ == "__main__":
    main()
