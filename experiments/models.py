"""Whole ONNX networks: relay-tune against onnxruntime (and OpenVINO when installed), same threads, same run.

    python -m experiments models                                        # the eight networks, 2 threads
    python -m experiments models --models resnet50,mobilenet_v2 --rounds 11 --log logs/resnet50.jsonl \
        --csv experiments/results/onnx_e2e.csv
    python -m experiments models --models resnet50 --log a.jsonl --log b.jsonl   # two logs of one model
    python -m experiments models --models light          # the nine public CNN graphs the onnx package ships

The networks are `relay_tune.testing.onnx_zoo`'s (built with onnx.helper, random weights at a trained network's
scale): resnet50, mobilenet_v2, squeezenet1_1, shufflenet_v2, densenet121, vgg16, inception, bert_layer; also
resnet18, mobilenet_v1 and the small small_cnn and mlp; and the nine public graphs of the ONNX model zoo that the
onnx package ships as "light" models, with seeded random weights (`relay_tune.testing.onnx_light`):
light_bvlc_alexnet, light_zfnet512, light_squeezenet, light_shufflenet, light_inception_v1, light_inception_v2,
light_densenet121, light_resnet50, light_vgg19 (`--models light` for all nine). For each network:

1. onnxruntime runs it (`intra_op_num_threads=--threads`, sequential execution, all graph optimisations);
2. relay-tune imports it and builds it with default schedules and, per `--log`, from that tuning log's best
   records (as `relay-tune build --log` does: records slower in the graph than the default kernel are dropped,
   `--no-check-tuned` keeps them all);
3. with `openvino` installed (`--openvino auto`, the default; `on` requires it), OpenVINO's CPU plugin runs it
   with `INFERENCE_PRECISION_HINT` f32 (no bf16 on CPUs that have it), `INFERENCE_NUM_THREADS=--threads`, one
   stream, latency hint; where the CPU plugin's default precision is not f32 (bf16 on CPUs with AVX512_BF16 or
   AMX), a second column ("openvino_bf16") runs it at that default;
   with `--baseline-tree DIR`, the default build of another checkout of relay-tune (built by that code in a
   subprocess, saved and loaded here) is one more engine, "baseline": a before/after comparison in one run;
4. every engine's output is checked against onnxruntime's (relative to the output's scale, `--rtol`);
5. all engines are timed in the same interleaved rounds (`experiments.timing`: warmed, `--repeat` inferences per
   engine and round, after waiting up to `--settle` seconds for the previous engine's spinning threads).

The table reports each engine's median latency, the spread (± half the interquartile range) and its ratio to
onnxruntime (below 1: faster), then the geometric mean of every engine's ratios to onnxruntime and of relay-tune's
ratios to OpenVINO f32. `--csv` writes one row per network. Exit status 1 when an output disagrees.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.timing import Samples, interleaved, write_rows

EIGHT = ("resnet50", "mobilenet_v2", "squeezenet1_1", "shufflenet_v2", "densenet121", "vgg16", "inception",
         "bert_layer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(EIGHT), help="comma-separated network names (default: the "
                        "eight above; `light`: the nine light models)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--repeat", type=int, default=3, help="timed inferences per engine and round (default 3)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="at most this many seconds to wait for an idle process before each engine's turn")
    parser.add_argument("--log", action="append", default=[], metavar="LOG",
                        help="a tuning log: one more relay-tune build, tuned from it (repeatable)")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="a checkout of other relay-tune code (e.g. `git worktree add /tmp/base REV`): its default "
                        "build of every network is one more engine, \"baseline\", for a before/after comparison")
    parser.add_argument("--no-check-tuned", action="store_true",
                        help="tuned builds use every record, without the build's in-graph check")
    parser.add_argument("--openvino", choices=("auto", "on", "off"), default="auto",
                        help="time OpenVINO too: when installed (auto), always (on: an error without it), never")
    parser.add_argument("--rtol", type=float, default=1e-3, help="largest error relative to the output's scale")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input")
    parser.add_argument("--csv", type=Path, help="write one row per network to this CSV file")


def run(args: argparse.Namespace) -> int:
    from relay_tune.testing.onnx_light import LIGHT, light_model
    from relay_tune.testing.onnx_zoo import RELATIVES, SMALL, ZOO

    light = {f"light_{name}": functools.partial(light_model, name) for name in LIGHT}
    names = [n for m in args.models.split(",") if m for n in (light if m == "light" else [m])]
    known = {**ZOO, **RELATIVES, **SMALL, **light}
    unknown = [m for m in names if m not in known]
    if unknown or not names:
        raise UsageError(f"unknown network(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    if args.threads < 1 or args.rounds < 1 or args.repeat < 1:
        raise UsageError("--threads, --rounds and --repeat must be at least 1")
    for log in args.log:
        if not Path(log).is_file():
            raise UsageError(f"no such tuning log: {log}")
    if args.baseline_tree is not None and not (args.baseline_tree / "relay_tune").is_dir():
        raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
    if args.openvino == "on" and openvino_core() is None:
        raise UsageError("--openvino on: the openvino package is not installed (pip install openvino)")
    results = [bench_network(name, known[name](), args) for name in names]
    print_table(results)
    rows = [row for row, _ in results]
    if args.csv is not None:
        write_rows(args.csv, rows)
    return 0 if all(r["matches"] for r in rows) else 1


def bench_network(name: str, onnx_model: Any, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Samples]]:
    """One network: build every engine, check its output against onnxruntime's, time them all interleaved. Returns
    the CSV row and every engine's samples."""
    inputs = random_inputs(onnx_model, args.seed)
    session = ort_session(onnx_model, args.threads)
    want = first_output(session.run(None, inputs))
    engines: dict[str, Any] = {"onnxruntime": lambda: session.run(None, inputs)}
    outputs: dict[str, np.ndarray] = {}
    row: dict[str, Any] = {"model": name, "threads": args.threads}
    for label, build in relay_tune_builds(onnx_model, args).items():
        engines[label] = build
        outputs[label] = first_output(build.run(**inputs))
        row[f"{label}_kernel_calls"] = build.num_kernel_calls
        row[f"{label}_tuned_tasks"] = sum(1 for task in build.plan.tasks if task.tuned)
    if args.openvino != "off" and openvino_core() is not None:
        for label, precision in openvino_precisions():
            infer = openvino_engine(onnx_model, args.threads, precision)
            engines[label] = functools.partial(infer, inputs)
            outputs[label] = first_output(infer(inputs))
    matched = True
    for label, got in outputs.items():
        good, error = matches(got, want, args.rtol)
        row[f"{label}_error"] = f"{error:.2e}"
        matched = matched and good
        if not good:
            print(f"  {name}: {label}'s output differs from onnxruntime's (relative error {error:.2e})")
    row["matches"] = matched
    print(f"{name}: timing {', '.join(engines)} in {args.rounds} interleaved rounds", flush=True)
    timed = interleaved(engines, rounds=args.rounds, repeat=args.repeat, inputs=inputs, settle_s=args.settle)
    for label, samples in timed.items():
        row[f"{label}_ms"] = round(samples.median * 1e3, 3)
        row[f"{label}_spread"] = round(samples.spread, 3)
        if label != "onnxruntime":
            row[f"{label}_ratio"] = round(samples.median / timed["onnxruntime"].median, 3)
    return row, timed


def relay_tune_builds(onnx_model: Any, args: argparse.Namespace) -> dict[str, Any]:
    """"default" (default schedules) and, per `--log`, "tuned" (or "tuned1", "tuned2", ... for several logs)."""
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    mod, _ = from_onnx(onnx_model)
    target = Target.host(num_cores=args.threads)
    builds = {"default": relay_tune.build(mod, target=target)}
    if args.baseline_tree is not None:
        builds["baseline"] = baseline_build(args.baseline_tree, onnx_model, args.threads)
    for i, log in enumerate(args.log, start=1):
        label = "tuned" if len(args.log) == 1 else f"tuned{i}"
        start = time.perf_counter()
        builds[label] = relay_tune.build(mod, target=target, logs=log, check_tuned=not args.no_check_tuned)
        print(f"  {label}: {log}, built in {time.perf_counter() - start:.1f} s")
    return builds


# Run by the baseline tree's Python: import, build with default schedules, save (the saved-model format is
# stable, so this checkout loads it).
_BASELINE_BUILD = """
import sys, onnx, relay_tune
from relay_tune.frontend import from_onnx
from relay_tune.target import Target
mod, _ = from_onnx(onnx.load(sys.argv[1]))
relay_tune.build(mod, target=Target.host(num_cores=int(sys.argv[2]))).save(sys.argv[3])
"""


def built_by_tree(tree: Path, script: str, args: Sequence[str]) -> Any:
    """The model that `script` builds with the relay-tune code in `tree` (a subprocess with `tree` first on
    PYTHONPATH) and saves at the path given as its last argument after `args`, loaded into this process."""
    from relay_tune.runtime.vm import load_model

    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "baseline.rtmod"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree.resolve()), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-c", script, *args, str(saved)], check=True, env=env, cwd=str(tree))
        return load_model(saved)


def baseline_build(tree: Path, onnx_model: Any, threads: int) -> Any:
    """`onnx_model` built by the relay-tune code in `tree` (`built_by_tree`), loaded into this process."""
    import onnx

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "model.onnx"
        onnx.save(onnx_model, str(source))
        return built_by_tree(tree, _BASELINE_BUILD, [str(source), str(threads)])


def random_inputs(onnx_model: Any, seed: int) -> dict[str, np.ndarray]:
    """Standard-normal float32 values for every graph input that is not an initializer."""
    rng = np.random.default_rng(seed)
    constants = {i.name for i in onnx_model.graph.initializer}
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in onnx_model.graph.input if i.name not in constants}


def ort_session(onnx_model: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def openvino_core() -> Any:
    """An `openvino.Core`, or None when OpenVINO is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.Core()


def openvino_precisions() -> list[tuple[str, str]]:
    """(engine label, inference precision): f32 pinned, and the CPU plugin's default where that is another."""
    default = openvino_core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()  # "f32", "bf16"
    return [("openvino", "f32")] + ([(f"openvino_{default}", default)] if default != "f32" else [])


def openvino_engine(onnx_model: Any, threads: int, precision: str = "f32",
                    shapes: dict[str, tuple[int, ...]] | None = None,
                    all_outputs: bool = False) -> Callable[[dict[str, np.ndarray]], Any]:
    """One inference through OpenVINO's CPU plugin at `precision` on `threads` threads (a callable of the
    inputs). `onnx_model` is a ModelProto or an ONNX file's path; `shapes` fixes inputs' shapes (as relay-tune
    compiles for static shapes); the callable returns the first output, or with `all_outputs` every output."""
    import onnx

    core = openvino_core()
    if isinstance(onnx_model, (str, Path)):
        model = core.read_model(str(onnx_model))
    else:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "model.onnx"
            onnx.save(onnx_model, str(path))
            model = core.read_model(str(path))
    if shapes:
        model.reshape({name: list(shape) for name, shape in shapes.items()})
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
              "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    count = len(compiled.outputs)

    def infer(inputs: dict[str, np.ndarray]) -> Any:
        request.infer(inputs)
        if all_outputs:
            return [request.get_output_tensor(i).data for i in range(count)]
        return request.get_output_tensor(0).data

    return infer


def matches(got: np.ndarray, want: np.ndarray, rtol: float) -> tuple[bool, float]:
    """Close relative to the output's own scale (deep nets reorder float sums; logits can be large)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return False, math.inf
    error = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-6)
    return error <= rtol, error


def first_output(result: Any) -> np.ndarray:
    while isinstance(result, tuple | list):
        result = result[0]
    return np.asarray(result)


def print_table(results: list[tuple[dict[str, Any], dict[str, Samples]]]) -> None:
    print("\nmedian latency ± half the interquartile range; ratio to onnxruntime (below 1: faster)")
    for row, timed in results:
        base = timed["onnxruntime"].median
        cells = [f"{label} {s.describe()}" + ("" if label == "onnxruntime" else f" ({s.median / base:.2f}x)")
                 for label, s in timed.items()]
        print(f"{row['model']:14s} {'; '.join(cells)}{'' if row['matches'] else '  OUTPUT MISMATCH'}")
    labels = [label for label in results[0][1] if label != "onnxruntime"] if results else []
    for label in labels:
        ratios = [timed[label].median / timed["onnxruntime"].median for _, timed in results if label in timed]
        print(f"geometric mean {label} / onnxruntime over {len(ratios)} networks: {geomean(ratios):.3f}")
    if "baseline" in labels:
        ratios = [timed["default"].median / timed["baseline"].median for _, timed in results]
        print(f"geometric mean default / baseline (the --baseline-tree code) over {len(ratios)} networks: "
              f"{geomean(ratios):.3f}")
    for label in (lb for lb in labels if not lb.startswith("openvino")):
        ratios = [timed[label].median / timed["openvino"].median for _, timed in results if "openvino" in timed]
        if ratios:
            print(f"geometric mean {label} / openvino (f32) over {len(ratios)} networks: {geomean(ratios):.3f}")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
