"""libgomp's idle spin (`GOMP_SPINCOUNT`) and the parallel threshold against trained models' latency, on a busy host.

    python -m experiments spin-policy [--models ppocr_cls,silero_vad] [--spins 0,10000,300000]
                                      [--thresholds 16384,262144] [--settle 0.1] [--rounds 3]

libgomp reads its spin count once, when it is loaded, so every spin setting runs in its own process. The models of
`experiments.trained` are built once here (default schedules): for one core (`serial`, no parallel region at all)
and for `--threads` cores with each parallel threshold (`min_work_N`: `search_space`'s `PARALLEL_MIN_WORK` set to
N for that build), and saved. Then, round after round, every spin setting starts a fresh process that loads the
saved builds and times them interleaved with onnxruntime (same threads); with `--settle`, each engine first waits
for the process to go idle, so that no engine is timed beside the other's spinning threads (onnxruntime's pool and
libgomp's long spins both leave threads running after a call). Settings take turns within a round, so a slow spell
of the host falls on all of them. Printed per model, spin setting and build: the medians over the rounds of its
and onnxruntime's medians, the median ratio and the largest ratio of a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments import UsageError
from experiments.timing import interleaved, write_rows
from experiments.trained import MODELS, TrainedModel, fetch, ort_session

DEFAULT_SPINS = "0,1000,10000,100000,300000"


def child(model: TrainedModel, folder: Path, threads: int, rounds: int, repeat: int,
          settle_s: float) -> dict[str, float]:
    """In a process whose libgomp got the spin count under test: the medians (ms) of onnxruntime and of every
    build saved under `folder`, timed interleaved (each engine after waiting up to `settle_s` for the threads of the
    one before to stop spinning)."""
    from relay_tune.runtime.vm import load_model

    inputs = model.input_arrays()
    feed = {**inputs, **model.fixed_arrays()}
    session = ort_session(fetch(model), threads)
    engines: dict[str, Any] = {"onnxruntime": lambda: session.run(None, feed)}
    for path in sorted(folder.glob("*.rtmod")):
        engines[path.stem] = (lambda built: lambda: built.run(**inputs))(load_model(path))
    samples = interleaved(engines, rounds=rounds, repeat=repeat, settle_s=settle_s)
    return {name: s.median * 1e3 for name, s in samples.items()}


def build_models(model: TrainedModel, folder: Path, threads: int, thresholds: list[int]) -> None:
    """The model built with default schedules for one core (`serial`) and for `threads` cores with each parallel
    threshold (`min_work_N`: kernels below N iterations of work run serially), saved under `folder`."""
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target
    from search_space.families import common

    fixed = model.fixed_arrays()
    mod, _ = from_onnx(fetch(model), shape_overrides={**model.shapes, **{k: v.shape for k, v in fixed.items()}})
    relay_tune.build(mod, target=Target.host(1), params=fixed or None).save(folder / "serial.rtmod")
    default = common.PARALLEL_MIN_WORK
    try:
        for threshold in thresholds:
            common.PARALLEL_MIN_WORK = threshold  # what `parallel_worthwhile` reads (build workers are forked)
            built = relay_tune.build(mod, target=Target.host(threads), params=fixed or None, kernel_cache=False)
            built.save(folder / f"min_work_{threshold}.rtmod")
    finally:
        common.PARALLEL_MIN_WORK = default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="ppocr_cls,silero_vad", help="comma-separated models of `trained`")
    parser.add_argument("--spins", default=DEFAULT_SPINS, help=f"GOMP_SPINCOUNT values (default {DEFAULT_SPINS})")
    parser.add_argument("--thresholds", default="16384",
                        help="parallel thresholds to build with (PARALLEL_MIN_WORK values, default 16384)")
    parser.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each a fresh process per setting")
    parser.add_argument("--inner-rounds", type=int, default=3, help="interleaved rounds inside each process")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per engine and inner round")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds each engine may wait for the previous engine's threads to go idle (default 0)")
    parser.add_argument("--csv", type=Path, help="write one row per model and setting to this CSV file")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "FOLDER"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    known = {m.name: m for m in MODELS}
    if args.child:
        name, folder = args.child
        print(json.dumps(child(known[name], Path(folder), args.threads, args.inner_rounds, args.repeat,
                               args.settle)))
        return 0
    names = args.models.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    spins = [s.strip() for s in args.spins.split(",") if s.strip()]
    rows: list[dict[str, Any]] = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            build_models(known[name], folder, args.threads, [int(t) for t in args.thresholds.split(",")])
            results: dict[str, list[dict[str, float]]] = {s: [] for s in spins}
            for _ in range(args.rounds):
                for spin in spins:
                    env = {**os.environ, "GOMP_SPINCOUNT": spin}
                    env.pop("OMP_WAIT_POLICY", None)
                    out = subprocess.run(
                        [sys.executable, "-m", "experiments", "spin-policy", "--child", name, str(folder),
                         "--threads", str(args.threads), "--inner-rounds", str(args.inner_rounds),
                         "--repeat", str(args.repeat), "--settle", str(args.settle)],
                        env=env, check=True, capture_output=True, text=True)
                    results[spin].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for spin, measured in results.items():
            med = {k: statistics.median(m[k] for m in measured) for k in measured[0]}
            for build in (k for k in med if k != "onnxruntime"):
                ratios = [m[build] / m["onnxruntime"] for m in measured]
                row = {"model": name, "spin": spin, "build": build, "ort_ms": round(med["onnxruntime"], 3),
                       "relay_tune_ms": round(med[build], 3), "ratio": round(statistics.median(ratios), 3),
                       "ratio_max": round(max(ratios), 3)}
                rows.append(row)
                print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.csv:
        write_rows(args.csv, rows)
    return 0
