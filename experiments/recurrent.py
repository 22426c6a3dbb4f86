"""A stacked bidirectional ONNX LSTM: relay-tune's import and build time, and its latency against onnxruntime.

    python -m experiments recurrent [--layers 2] [--hidden 256] [--seq 64] [--batch 1] [--input 256] [--threads 2]
                                    [--trials N] [--log LOG] [--baseline-tree DIR] [--space REPEATS] [--int8]
                                    [--profile]

The model is `--layers` bidirectional LSTM nodes (random weights in [-0.1, 0.1], biases), each layer's output
reshaped to `(seq, batch, 2 * hidden)` for the next, as exporters write it. relay-tune imports each LSTM as one
input projection over all steps and both directions (a `dense`) and one `nn.lstm_sequence` (every step inside one
kernel, the directions in parallel) and builds it with default schedules; the output is checked against
onnxruntime's, then the engines are timed in interleaved rounds (`experiments.timing`, same threads, onnxruntime
with sequential execution and all graph optimisations):

- `relay-tune`: default schedules;
- `tuned` (`--trials N`): the model's tasks tuned with N trials in all (`relay_tune.tuning.tune_model`, xgb
  search: the projections, the output copies and the loop kernels, whose space is the `lstm` family's,
  `search_space.families.lstm`), then built from that log (`--log LOG` keeps it); each task's trials and times
  are printed, and each LSTM task's measured spread (best, worst, default);
- `baseline` (`--baseline-tree DIR`): the same model built by the relay-tune code of another checkout (for
  example the unchanged main branch), default schedules.

`--space REPEATS` times every point of each LSTM kernel's schedule space (`search_space.families.lstm`) with the
tuner's runner, the points' repeats interleaved, and prints them sorted with the default marked.

`--int8` quantizes the model first with onnxruntime's `quantize_dynamic` (int8 weights, 7-bit as `reduce_range`
makes them, which onnxruntime's u8 x s8 products multiply exactly on every CPU): DynamicQuantizeLSTM nodes, which
relay-tune imports as a uint8 x int8 input projection and one `nn.lstm_sequence_int8` per layer. `--profile`
prints, before the timing, relay-tune's in-graph kernel times (`CompiledModel.profile`) beside onnxruntime's
per-node times (`SessionOptions.enable_profiling`), medians over the profiled runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.models import baseline_build, ort_session
from experiments.timing import interleaved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=2, help="stacked bidirectional LSTM layers (default 2)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    parser.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--input", type=int, default=256, help="input feature size (default 256)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--repeat", type=int, default=5, help="timed inferences per engine and round (default 5)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="at most this many seconds to wait for an idle process before each engine's turn "
                             "(onnxruntime's threads spin on after a call and slow the engine timed next)")
    parser.add_argument("--trials", type=int, default=0,
                        help="tune the model's tasks with this many trials in all and time the tuned build too "
                             "(default 0: no tuning)")
    parser.add_argument("--log", type=Path, metavar="LOG",
                        help="with --trials: keep the tuning log here (default: a temporary file)")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also time the model as the relay-tune checkout in DIR builds it (default schedules)")
    parser.add_argument("--space", type=int, default=0, metavar="REPEATS",
                        help="time every point of each LSTM kernel's schedule space, interleaved (the runner's "
                             "in-context timing, REPEATS repeats each), and print them sorted beside the default")
    parser.add_argument("--int8", action="store_true",
                        help="quantize the model with onnxruntime's quantize_dynamic (DynamicQuantizeLSTM) first")
    parser.add_argument("--profile", action="store_true",
                        help="print per-kernel in-graph times and onnxruntime's per-node times")


def lstm_stack(layers: int, hidden: int, seq: int, batch: int, input_size: int, seed: int = 0) -> Any:
    """The ONNX model (opset 14) of `layers` stacked bidirectional LSTMs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    initializers, nodes = [], []
    source, size = "X", input_size
    for layer in range(layers):
        weights = {f"W{layer}": (2, 4 * hidden, size), f"R{layer}": (2, 4 * hidden, hidden),
                   f"B{layer}": (2, 8 * hidden)}
        initializers += [numpy_helper.from_array(rng.uniform(-0.1, 0.1, shape).astype(np.float32), name)
                         for name, shape in weights.items()]
        initializers.append(numpy_helper.from_array(np.array([seq, batch, 2 * hidden], np.int64), f"shape{layer}"))
        nodes += [
            helper.make_node("LSTM", [source, *weights], [f"Y{layer}"], hidden_size=hidden, direction="bidirectional"),
            helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]),  # (seq, batch, 2, H)
            helper.make_node("Reshape", [f"T{layer}", f"shape{layer}"], [f"out{layer}"]),
        ]
        source, size = f"out{layer}", 2 * hidden
    graph = helper.make_graph(
        nodes, "lstm_stack", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, input_size])],
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def run(args: argparse.Namespace) -> int:
    sizes = (args.layers, args.hidden, args.seq, args.batch, args.input, args.threads, args.rounds, args.repeat)
    if min(sizes) < 1 or args.trials < 0:
        raise UsageError("--layers, --hidden, --seq, --batch, --input, --threads, --rounds and --repeat must be at "
                         "least 1, --trials at least 0")
    if args.baseline_tree is not None and not (args.baseline_tree / "relay_tune").is_dir():
        raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    model = lstm_stack(args.layers, args.hidden, args.seq, args.batch, args.input)
    if args.int8:
        model = quantized(model)
    x = np.random.default_rng(1).uniform(-1, 1, (args.seq, args.batch, args.input)).astype(np.float32)
    target = Target.host(num_cores=args.threads)
    start = time.perf_counter()
    mod, _ = from_onnx(model)
    imported = time.perf_counter() - start
    start = time.perf_counter()
    compiled = relay_tune.build(mod, target=target)
    built = time.perf_counter() - start
    kind = "int8 " if args.int8 else ""
    print(f"{args.layers} bidirectional {kind}LSTM layer(s), hidden {args.hidden}, seq {args.seq}, batch {args.batch}: "
          f"import {imported:.1f} s, build {built:.1f} s, {compiled.num_kernel_calls} kernel calls, "
          f"{len(compiled.plan.tasks)} tasks")
    session = ort_session(model, args.threads)
    want = np.asarray(session.run(None, {"X": x})[0])
    if args.space:
        print_space_times(mod, target, args.space)
    builds = {"relay-tune": compiled}
    if args.trials:
        builds["tuned"] = _tuned(mod, target, args.trials, args.log)
    if args.baseline_tree is not None:
        builds["baseline"] = baseline_build(args.baseline_tree, model, args.threads)
    worst = 0.0
    for name, built_model in builds.items():
        error = float(np.abs(np.asarray(built_model.run(X=x)) - want).max() / max(float(np.abs(want).max()), 1e-30))
        print(f"error of {name} relative to onnxruntime's output scale: {error:.2e}")
        worst = max(worst, error)
    if args.profile:
        print_profiles(compiled, model, {"X": x}, args.threads,
                       others={k: v for k, v in builds.items() if k != "relay-tune"})
    engines: dict[str, Any] = {"onnxruntime": lambda: session.run(None, {"X": x})}
    engines.update(builds)
    timed = interleaved(engines, rounds=args.rounds, repeat=args.repeat, inputs={"X": x}, settle_s=args.settle)
    for name, samples in timed.items():
        print(f"  {name}: {samples.describe()}")
    for name in builds:
        print(f"  ratio {name} / onnxruntime: {timed[name].median / timed['onnxruntime'].median:.2f}")
    if "tuned" in timed:
        print(f"  ratio tuned / relay-tune (default schedules): "
              f"{timed['tuned'].median / timed['relay-tune'].median:.2f}")
    if "baseline" in timed:
        print(f"  ratio relay-tune / baseline: {timed['relay-tune'].median / timed['baseline'].median:.2f}")
    # an int8 model: within one 8-bit step of the output's range (a float-rounding difference of the state may
    # flip one of its quantized levels, in relay-tune's build or in onnxruntime's)
    tolerance = float(want.max() - want.min()) / 255 / max(float(np.abs(want).max()), 1e-30) if args.int8 else 1e-4
    return 0 if worst < tolerance else 1


def quantized(model: Any) -> Any:
    """`model` with its LSTMs quantized by onnxruntime's `quantize_dynamic` (int8 weights, `reduce_range`)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder:
        src, dst = Path(folder) / "float.onnx", Path(folder) / "int8.onnx"
        onnx.save(model, str(src))
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM"],
                         reduce_range=True)
        return onnx.load(str(dst))


def onnxruntime_node_times(model: Any, feeds: dict[str, np.ndarray], threads: int, runs: int = 20) -> list[
        tuple[float, str, str]]:
    """onnxruntime's per-node kernel times `(seconds, op type, node name)`, medians over `runs` profiled runs
    (after two warm-up runs), slowest first."""
    import json
    import statistics

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = str(Path(folder) / "ort")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 2):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[tuple[str, str], list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            key = (event["args"]["op_name"], event["name"][:-len("_kernel_time")])
            times.setdefault(key, []).append(event["dur"] * 1e-6)
    rows = [(statistics.median(v[2:] or v), op, name) for (op, name), v in times.items()]
    return sorted(rows, reverse=True)


def print_profiles(compiled: Any, model: Any, feeds: dict[str, np.ndarray], threads: int, top: int = 8,
                   ort_feeds: dict[str, np.ndarray] | None = None, others: dict[str, Any] | None = None) -> None:
    """relay-tune's in-graph kernel times beside onnxruntime's per-node times (the slowest `top` of each);
    `ort_feeds` where onnxruntime takes more inputs than the build (bound ones), `others` further builds by name
    (a baseline) profiled the same way."""
    for name, built in {"relay-tune": compiled, **(others or {})}.items():
        profiles = built.profile(repeat=20, inputs=feeds)
        total = sum(p.seconds for p in profiles)
        print(f"{name} in-graph kernel times (all calls of a task, median of 20 runs; {total * 1e3:.3f} ms in all):")
        for profile in profiles[:top]:
            print(f"  {profile.seconds * 1e3:8.3f} ms  {profile.calls:3d} call(s)  {profile.description[:100]}")
    nodes = onnxruntime_node_times(model, ort_feeds or feeds, threads)
    print(f"onnxruntime per-node kernel times (median of 20 runs; {sum(n[0] for n in nodes) * 1e3:.3f} ms in all):")
    for seconds, op, name in nodes[:top]:
        print(f"  {seconds * 1e3:8.3f} ms  {op} {name}")


def _tuned(mod: Any, target: Any, trials: int, log: Path | None = None) -> Any:
    """`mod` built from a fresh log of `trials` tuning trials over its tasks (xgb search, no tuning cache), kept
    at `log` if given; prints each task's trials and times, and the spread of each LSTM task's space."""
    from relay_tune.tuning.tune_model import BuildOptions, SearchOptions, tune_model

    with tempfile.TemporaryDirectory() as folder:
        path = log if log is not None else Path(folder) / "lstm.jsonl"
        if path.exists():
            raise UsageError(f"--log {path}: the file exists (tuning starts from a fresh log)")
        start = time.perf_counter()
        result = tune_model(mod, target, trials, path, search=SearchOptions(storage=None),
                            build=BuildOptions(measure_latency=False))
        tuned = sum(1 for t in result.tasks if t.trials)
        print(f"tuned {len(result.tasks)} tasks ({tuned} measured) with {trials} trials in "
              f"{time.perf_counter() - start:.0f} s")
        for task in result.tasks:
            times = (f"default {task.default_cost * 1e3:.3f} ms, best {task.best_cost * 1e3:.3f} ms"
                     if task.default_cost and task.best_cost else "not measured")
            print(f"  {task.family:18} x{task.weight} {task.trials:3d} trials ({task.valid_trials} valid) of a space "
                  f"of {task.space_size}: {times}  {task.description[:60]}")
        print_space_spread(path)
        if result.model is None:
            raise RuntimeError("tuning ended without a model")
        return result.model


def print_space_times(mod: Any, target: Any, repeats: int) -> None:
    """Every point of each LSTM task's space timed by the tuner's runner with the configs' repeats interleaved
    (`LocalRunner.run_batch`: drifting load falls on every point alike), medians sorted, the default marked."""
    import statistics

    from relay_tune.tuning.relay_task import tasks_from_module
    from relay_tune.tuning.runner import LocalRunner

    for task in tasks_from_module(mod, target):
        if task.family != "lstm":
            continue
        configs = list(task.space.enumerate())
        with LocalRunner(number=1, repeat=repeats, min_repeat_ms=0.0) as runner:
            results = runner.run_batch(task, [task.build(c) for c in configs])
        rows = sorted(((statistics.median(r.costs), c) for c, r in zip(configs, results) if r.costs),
                      key=lambda row: row[0])
        default = task.default_config()
        default_time = next((t for t, c in rows if c == default), None)
        print(f"{task.description}: {len(rows)} of {len(configs)} points, {repeats} interleaved repeats each")
        for time_s, config in rows:
            knobs = " ".join(f"{k}={v}" for k, v in config.items() if k != "family")
            mark = "  <- default" if config == default else ""
            print(f"  {time_s * 1e3:9.4f} ms  {knobs}{mark}")
        if default_time:
            print(f"  best / default {rows[0][0] / default_time:.2f}, worst / default {rows[-1][0] / default_time:.2f}")


def print_space_spread(log: Path) -> None:
    """Per LSTM task of a tuning log (`lstm` family configs): its measured points' best, worst and default times
    and the best point's knobs."""
    from relay_tune.records.log_format import read_records

    by_task: dict[str, list[Any]] = {}
    for record in read_records(log):
        if record.config.get("family") == "lstm" and record.error_kind is None and record.costs:
            by_task.setdefault(record.workload_key, []).append(record)
    for records in by_task.values():
        ranked = sorted(records, key=lambda r: r.cost)
        default = [r.cost for r in records if r.strategy == "default"]
        best, worst = ranked[0], ranked[-1]
        knobs = {k: v for k, v in best.config.items() if k != "family"}
        shown = f"{min(default) * 1e3:.3f} ms" if default else "not measured"
        print(f"  lstm space {best.description[:50]}: {len(records)} points measured; best {best.cost * 1e3:.3f} ms "
              f"{knobs}, worst {worst.cost * 1e3:.3f} ms, default {shown}")
