"""Build time of whole models: a first build (empty compiled-kernel cache) and a second one (the kernels from it).

    python -m experiments build-time                         # the nine light CNN graphs
    python -m experiments build-time --models light_resnet50,resnet50 --repeat 3 --csv build_times.csv

Every build runs in a fresh Python process (`relay_tune.build` on the imported model, timed around the call,
import and weight loading excluded), so nothing from an earlier build is warm except what the kernel cache holds:
a "first" build gets a new, empty cache folder, a "second" build the folder the first one filled. `--repeat`
pairs are run per model; the table shows medians and each build's stages (`build_info["timings"]`: the Relay
passes, lowering, LLVM, loading). `RELAY_TUNE_KERNEL_CACHE=0` builds (the cache off) are the third column: what
every build cost before the cache.
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

_CHILD = r"""
import json, sys, time
name = sys.argv[1]
if name.startswith("light_"):
    from relay_tune.testing.onnx_light import light_model
    model = light_model(name[len("light_"):])
else:
    from relay_tune.testing.onnx_zoo import network
    model = network(name)
from relay_tune.frontend import from_onnx
import relay_tune
mod, _ = from_onnx(model)
start = time.perf_counter()
built = relay_tune.build(mod)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "timings": built.build_info["timings"]}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="light", help="comma-separated network names of `python -m experiments "
                        "models`, or `light` for the nine light models (default)")
    parser.add_argument("--repeat", type=int, default=1, help="first/second build pairs per model (default 1)")
    parser.add_argument("--csv", type=Path, help="write one row per model to this CSV file")


def run(args: argparse.Namespace) -> int:
    from relay_tune.testing.onnx_light import LIGHT
    from relay_tune.testing.onnx_zoo import RELATIVES, SMALL, ZOO

    light = [f"light_{n}" for n in LIGHT]
    names = [n for m in args.models.split(",") if m for n in (light if m == "light" else [m])]
    unknown = [n for n in names if n not in {*light, *ZOO, *RELATIVES, *SMALL}]
    if unknown or not names:
        raise UsageError(f"unknown model(s) {', '.join(unknown) or '(none given)'}")
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    rows = []
    print(f"{'model':22s} {'first s':>8s} {'second s':>9s} {'no cache s':>10s}   second build's stages")
    for name in names:
        first, second, uncached, stages = [], [], [], {}
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as cache:
                first.append(_build(name, {"RELAY_TUNE_CACHE": cache})["seconds"])
                again = _build(name, {"RELAY_TUNE_CACHE": cache})
                second.append(again["seconds"])
                stages = again["timings"]
            with tempfile.TemporaryDirectory() as cache:
                uncached.append(_build(name, {"RELAY_TUNE_CACHE": cache, "RELAY_TUNE_KERNEL_CACHE": "0"})["seconds"])
        row = {"model": name, "first_s": round(statistics.median(first), 3),
               "second_s": round(statistics.median(second), 3), "no_cache_s": round(statistics.median(uncached), 3),
               **{f"second_{k}": round(v, 3) for k, v in stages.items()}}
        rows.append(row)
        stage_text = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in stages.items() if k != "total_s")
        print(f"{name:22s} {row['first_s']:8.2f} {row['second_s']:9.2f} {row['no_cache_s']:10.2f}   {stage_text}",
              flush=True)
    if args.csv is not None:
        write_rows(args.csv, rows)
    return 0


def _build(name: str, env: dict[str, str]) -> dict[str, Any]:
    """One build of `name` in a fresh process with `env` added to the environment: its seconds and stages."""
    done = subprocess.run([sys.executable, "-c", _CHILD, name], env={**os.environ, **env}, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building {name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
