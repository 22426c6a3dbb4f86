"""Build time of whole models, each build in a fresh Python process: a first build (empty caches), a second one with
the compiled-kernel cache only (`RELAY_TUNE_BUILD_CACHE=0`: passes, lowered kernels and objects from the kernel
cache, plan, load), a second one from the build cache (the finished model loaded), and the import time.

    python -m experiments build-time                                   # the nine light CNN graphs
    python -m experiments build-time --baseline-tree /work/main        # before (that checkout) and after, interleaved
    python -m experiments build-time --models light_resnet50 --repeat 3 --csv build_times.csv

A build is timed in its process around `relay_tune.build` (the package and the model imported before; the build
cache's key, loading and storing included); "import" is the wall time of a whole `python -c "import relay_tune,
relay_tune.compile"` process. Each first/second/cached triple gets a new cache folder (`RELAY_TUNE_CACHE`). With
`--baseline-tree`, every repeat runs the same triple with that checkout first on PYTHONPATH (a tree without the
build cache builds its "cached" build like its second), alternating which tree goes first, so a slow spell of a
shared host falls on both; the table shows medians, the ratios before/after, and the stages of the last first and
second (kernel-cache) builds: `onnx` (the ONNX import, outside the build's time), then `build_info["timings"]`
(passes, lower: task lowering, plan, llvm: compiling the kernels, load, total; where the tree reports them the
code generator's stages summed over the modules compiled, `llvm_lower` (loop nests to LLVM IR), `llvm_parse`,
`llvm_optimize`, `llvm_emit` (worker processes' seconds: they overlap), and the build cache's `key` and `store`;
where the tree writes the cache's entry in a background thread, `store` is what the build waited for and
`exit_wait` how long the process then waited at its end for the entry to be written, outside the build's time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments import UsageError
from experiments.timing import write_rows

ROOT = Path(__file__).resolve().parents[1]

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
import relay_tune.compile
start = time.perf_counter()
mod, _ = from_onnx(model)
onnx_s = time.perf_counter() - start
start = time.perf_counter()
built = relay_tune.build(mod)
seconds = time.perf_counter() - start
cache = built.build_info.get("build_cache") or {}
timings = {"onnx_s": onnx_s, **built.build_info.get("timings", {})}
timings.update({k: cache[k] for k in ("key_s", "store_s") if k in cache})
try:  # a tree that writes the build cache's entry in the background: what the process's exit waits for
    from relay_tune.compile.build_cache import wait_for_stores
except ImportError:
    pass
else:
    start = time.perf_counter()
    wait_for_stores()
    timings["exit_wait_s"] = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "timings": timings, "hit": bool(cache.get("hit"))}))
"""

KINDS = ("first", "second", "cached")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="light", help="comma-separated network names of `python -m experiments "
                        "models`, or `light` for the nine light models (default)")
    parser.add_argument("--repeat", type=int, default=1, help="first/second/cached triples per model and tree "
                        "(default 1)")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also time the builds of another checkout of relay-tune (before), interleaved")
    parser.add_argument("--import-repeat", type=int, default=5, help="import timings per tree (default 5)")
    parser.add_argument("--csv", type=Path, help="write one row per model and tree to this CSV file")


def run(args: argparse.Namespace) -> int:
    from relay_tune.testing.onnx_light import LIGHT
    from relay_tune.testing.onnx_zoo import RELATIVES, SMALL, ZOO

    light = [f"light_{n}" for n in LIGHT]
    names = [n for m in args.models.split(",") if m for n in (light if m == "light" else [m])]
    unknown = [n for n in names if n not in {*light, *ZOO, *RELATIVES, *SMALL}]
    if unknown or not names:
        raise UsageError(f"unknown model(s) {', '.join(unknown) or '(none given)'}")
    if args.repeat < 1 or args.import_repeat < 1:
        raise UsageError("--repeat and --import-repeat must be at least 1")
    trees = {"after": ROOT}
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "relay_tune").is_dir():
            raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
        trees = {"before": args.baseline_tree.resolve(), "after": ROOT}
    print(f"load average at start: {_load()}")

    imports: dict[str, list[float]] = {t: [] for t in trees}
    for number in range(args.import_repeat):
        for label in _order(trees, number):
            imports[label].append(_import_seconds(trees[label]))
    print("import (python -c 'import relay_tune, relay_tune.compile', whole process): "
          + ", ".join(f"{t} {statistics.median(v):.2f} s" for t, v in imports.items()))

    rows = []
    header = f"{'model':22s} {'tree':6s} {'first s':>8s} {'second s':>9s} {'cached s':>9s}   second build's stages"
    print(header)
    for name in names:
        seconds: dict[str, dict[str, list[float]]] = {t: {k: [] for k in KINDS} for t in trees}
        stages: dict[str, dict[str, dict[str, float]]] = {t: {} for t in trees}
        for number in range(args.repeat):
            for label in _order(trees, number):
                with tempfile.TemporaryDirectory() as cache:
                    env = {"RELAY_TUNE_CACHE": cache}
                    first = _build(trees[label], name, env)
                    seconds[label]["first"].append(first["seconds"])
                    stages[label]["first"] = first["timings"]
                    second = _build(trees[label], name, {**env, "RELAY_TUNE_BUILD_CACHE": "0"})
                    seconds[label]["second"].append(second["seconds"])
                    stages[label]["second"] = second["timings"]
                    seconds[label]["cached"].append(_build(trees[label], name, env)["seconds"])
        for label in trees:
            medians = {k: statistics.median(v) for k, v in seconds[label].items()}
            row: dict[str, Any] = {"model": name, "tree": label,
                                   "import_s": round(statistics.median(imports[label]), 3),
                                   **{f"{k}_s": round(v, 3) for k, v in medians.items()}}
            for kind in ("first", "second"):
                row.update({f"{kind}_{k}": round(v, 3) for k, v in stages[label][kind].items()})
            rows.append(row)
            print(f"{name:22s} {label:6s} {medians['first']:8.2f} {medians['second']:9.2f} {medians['cached']:9.2f}"
                  f"   second: {_stage_text(stages[label]['second'])}", flush=True)
            print(f"{'':22s} {'':6s} {'':8s} {'':9s} {'':9s}   first:  {_stage_text(stages[label]['first'])}",
                  flush=True)
        if "before" in trees:
            ratios = [rows[-2][f"{k}_s"] / rows[-1][f"{k}_s"] for k in KINDS]
            print(f"{'':22s} {'ratio':6s} " + " ".join(f"{r:8.2f}x" for r in ratios) + "   before / after",
                  flush=True)
    print(f"load average at end: {_load()}")
    if args.csv is not None:
        # Trees report different stages (an older tree no code generator's): every column, empty where missing.
        columns = list(dict.fromkeys(key for row in rows for key in row))
        write_rows(args.csv, [{key: row.get(key, "") for key in columns} for row in rows])
    return 0


def _stage_text(timings: dict[str, float]) -> str:
    """A build's stages in seconds, in the order the build reports them (llvm_*: summed over the modules that
    worker processes compiled, so they overlap; total: the build without the build cache's key and store)."""
    return ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in timings.items())


def _order(trees: dict[str, Path], number: int) -> list[str]:
    """The trees in the order of repeat `number`: alternating, so neither always runs first."""
    labels = list(trees)
    return labels if number % 2 == 0 else labels[::-1]


def _env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, **extra, "PYTHONPATH": path}


def _import_seconds(tree: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import relay_tune, relay_tune.compile"], env=_env(tree, {}),
                   check=True, cwd=tree)
    return time.perf_counter() - start


def _build(tree: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    """One build of `name` by the code in `tree`, in a fresh process with `env` added: its seconds and stages."""
    done = subprocess.run([sys.executable, "-c", _CHILD, name], env=_env(tree, env), capture_output=True,
                          text=True, check=False, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"building {name} with {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"
