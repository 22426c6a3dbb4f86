"""What the first calls after an idle gap cost, and why: one trained model's build run in fresh processes of this
checkout and of a baseline checkout, turn about, beside onnxruntime and OpenVINO in the same processes.

    python -m experiments first-calls [--model oww_melspectrogram] [--rtmod M.rtmod] [--gaps 1,10,80] [--calls 3]
                                      [--reps 30]
                                      [--processes 3] [--threads 2] [--baseline-tree DIR] [--no-others]
                                      [--csv PATH]

The model (`python -m experiments trained --list`; `RELAY_TUNE_MODEL_CACHE` holds the wheels) is built once here
with default schedules and saved (or `--rtmod` names a saved build of it); every child process loads that file
(the saved-model format is stable, so a baseline checkout runs the very same kernels on its own runtime: thread
team, executor). A child warms every engine
up, then per gap and repetition, engine after engine: sleeps the gap, then times `--calls` calls one by one. Per
call it also reads, for the calling thread, how often it was preempted (`nonvoluntary_ctxt_switches` in
/proc/thread-self/status) and how long it waited on a run queue (`/proc/thread-self/schedstat`): a call that
waits for a core shows there, a call slowed by cold caches does not. Children of the two checkouts alternate
(`--processes` each), so they share the host's load; both run every engine (onnxruntime's and OpenVINO's times
from both are pooled).

Printed per engine, gap and call number: the median time over every process, the mean preemptions and run-queue
wait of the caller, and relay-tune's ratio to the baseline, to onnxruntime and to OpenVINO at the same gap and
call number; then the one-minute load average at the start and the end.
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
from experiments.timing import write_rows

# The child: loads the saved build (and onnxruntime, OpenVINO on the ONNX file), then times first calls after gaps.
_CHILD = r"""
import json, os, sys, threading, time
import numpy as np
spec = json.loads(sys.argv[1])
from relay_tune.runtime.vm import load_model
model = load_model(spec["rtmod"])
rng = np.random.default_rng(0)
low, high = spec["range"]
inputs = {k: rng.uniform(low, high, size=v).astype("float32") for k, v in spec["shapes"].items()}
engines = {"relay-tune": lambda: model.run(**inputs)}
if spec["onnxruntime"]:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = spec["threads"], 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(spec["onnx"], options, providers=["CPUExecutionProvider"])
    engines["onnxruntime"] = lambda: session.run(None, inputs)
if spec["openvino"]:
    import openvino as ov
    core = ov.Core()
    read = core.read_model(spec["onnx"])
    read.reshape({k: list(v) for k, v in spec["shapes"].items()})
    compiled = core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
                                               "INFERENCE_NUM_THREADS": spec["threads"], "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    engines["openvino"] = lambda: request.infer(inputs)

def sched():
    with open("/proc/thread-self/status") as handle:
        switches = next(int(l.split()[1]) for l in handle if l.startswith("nonvoluntary_ctxt_switches"))
    with open("/proc/thread-self/schedstat") as handle:
        waited = int(handle.read().split()[1])
    return switches, waited

for call in engines.values():
    for _ in range(50):
        call()
clock = time.perf_counter
rows = []
for gap in spec["gaps"]:
    for rep in range(spec["reps"]):
        for name, call in engines.items():
            time.sleep(gap / 1e3)
            for number in range(spec["calls"]):
                switches, waited = sched()
                start = clock()
                call()
                seconds = clock() - start
                after = sched()
                rows.append([name, gap, number + 1, seconds, after[0] - switches, after[1] - waited])
print("ROWS " + json.dumps(rows))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="oww_melspectrogram", help="a model of `trained --list`")
    parser.add_argument("--rtmod", type=Path, help="a saved build of the model to run (default: built here first)")
    parser.add_argument("--gaps", default="1,10,80", help="comma-separated idle gaps in ms before each engine's calls")
    parser.add_argument("--calls", type=int, default=3, help="calls timed one by one after each gap (default 3)")
    parser.add_argument("--reps", type=int, default=30, help="gaps per engine and gap length in a process")
    parser.add_argument("--processes", type=int, default=3, help="child processes per checkout (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also run the saved build on the relay-tune checkout in DIR (children alternate)")
    parser.add_argument("--no-others", action="store_true", help="time relay-tune only (no onnxruntime, OpenVINO)")
    parser.add_argument("--csv", type=Path, help="write one row per engine, checkout, gap and call number")


def _child(spec: dict[str, Any], tree: Path | None) -> list[list[Any]]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree.resolve())
    # `python -c` puts the working directory first on sys.path: run in the checkout whose code the child is to run
    folder = tree.resolve() if tree is not None else Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], env=env, capture_output=True,
                          text=True, check=False, cwd=folder)
    line = next((text for text in done.stdout.splitlines() if text.startswith("ROWS ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"child exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return json.loads(line[5:])


def run(args: argparse.Namespace) -> int:
    from experiments.models import openvino_core
    from experiments.trained import MODELS, fetch

    known = {m.name: m for m in MODELS}
    if args.model not in known:
        raise UsageError(f"unknown model {args.model}; known: {', '.join(known)}")
    model = known[args.model]
    if model.fixed or model.carry or model.dtype != "float32":
        raise UsageError(f"{args.model}: first-calls takes models with float32 inputs only, no fixed or carried ones")
    try:
        gaps = [float(g) for g in args.gaps.split(",") if g.strip()]
    except ValueError:
        raise UsageError(f"--gaps {args.gaps}: give milliseconds, comma-separated") from None
    if not gaps or any(g < 0 for g in gaps) or min(args.calls, args.reps, args.processes, args.threads) < 1:
        raise UsageError("--gaps: at least one, none negative; --calls, --reps, --processes, --threads >= 1")
    if args.baseline_tree is not None and not (args.baseline_tree / "relay_tune").is_dir():
        raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
    path = fetch(model)
    if args.rtmod is not None and not args.rtmod.is_file():
        raise UsageError(f"--rtmod {args.rtmod}: no such file")
    if args.rtmod is None:  # the build's imports only where this process builds
        import relay_tune
        from relay_tune.frontend import from_onnx
        from relay_tune.target import Target
    load_start = os.getloadavg()[0]
    trees: dict[str, Path | None] = {"this": None}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree
    samples: dict[tuple[str, float, int], list[tuple[float, int, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="first-calls-") as folder:
        saved = args.rtmod if args.rtmod is not None else Path(folder) / "model.rtmod"
        if args.rtmod is None:
            mod, _ = from_onnx(path, shape_overrides=model.shapes)
            relay_tune.build(mod, target=Target.host(num_cores=args.threads)).save(saved)
        for _ in range(args.processes):
            for tree_name, tree in trees.items():
                # every child runs the other engines too (their threads share the process with relay-tune's), and
                # their times from both checkouts' children are pooled: the same code
                others = not args.no_others
                spec = {"rtmod": str(saved.resolve()), "onnx": str(path.resolve()),
                        "shapes": {k: list(v) for k, v in model.shapes.items()}, "range": list(model.value_range),
                        "threads": args.threads, "gaps": gaps, "reps": args.reps, "calls": args.calls,
                        "onnxruntime": others, "openvino": others and openvino_core() is not None}
                for engine, gap, number, seconds, switches, waited in _child(spec, tree):
                    name = engine if engine != "relay-tune" or tree_name == "this" else "baseline"
                    samples.setdefault((name, gap, number), []).append((seconds, switches, waited))
    rows = []
    for (name, gap, number), values in samples.items():
        rows.append({"engine": name, "gap_ms": gap, "call": number,
                     "median_ms": round(statistics.median(v[0] for v in values) * 1e3, 4),
                     "preempted_per_call": round(statistics.fmean(v[1] for v in values), 3),
                     "runqueue_wait_us": round(statistics.fmean(v[2] for v in values) / 1e3, 1),
                     "samples": len(values)})
    median = {(r["engine"], r["gap_ms"], r["call"]): r["median_ms"] for r in rows}
    print(f"{args.model}: {args.processes} process(es) per checkout, {args.reps} gaps each, {args.threads} threads; "
          f"median ms (caller preempted per call, mean run-queue wait us)")
    for gap in gaps:
        for number in range(1, args.calls + 1):
            cells = [f"{r['engine']} {r['median_ms']:.3f} ({r['preempted_per_call']:.2f}, {r['runqueue_wait_us']:.0f})"
                     for r in rows if r["gap_ms"] == gap and r["call"] == number]
            ours = median[("relay-tune", gap, number)]
            ratios = [f"/{other} {ours / median[(other, gap, number)]:.2f}"
                      for other in ("baseline", "onnxruntime", "openvino") if (other, gap, number) in median]
            print(f"  gap {gap:g} ms, call {number}: {'; '.join(cells)}; relay-tune {' '.join(ratios)}")
    print(f"load average (1 min): {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if args.csv:
        write_rows(args.csv, rows)
    return 0
