"""One saved build timed in many fresh processes: how far apart are the medians of separate processes, and under
which runtime settings?

    python -m experiments fresh-processes [--model M.rtmod] [--processes 6] [--variants default,native,...]
                                          [--baseline-tree DIR] [--csv PATH]

Without `--model` the README's Quickstart model (`relay_tune/examples/small_resnet.relay`) is built with default
schedules first. Each variant is one way to start `relay-tune run MODEL` (what the Quickstart check compares
with): `default` as a user runs it, the others with one setting changed through the environment, to test one
hypothesis about what differs between processes:

- `native` / `openmp`: RELAY_TUNE_THREADING (the native thread team, libgomp);
- `native_spin0` / `openmp_spin0`: GOMP_SPINCOUNT=0 (idle workers sleep at once; the native team reads it too);
- `openmp_bind`: libgomp with OMP_PROC_BIND=true (its threads pinned, one per core);
- `blas1`: OPENBLAS_NUM_THREADS=1 (numpy's BLAS has no pool threads that could spin);
- `nogc`: Python's garbage collector disabled for the whole run;
- `one_core`: the process pinned to one CPU with a team of 2 threads (OMP_NUM_THREADS=2), so that the caller and
  the team's worker always share a core: what a process whose two team threads land on one core pays.

With `--baseline-tree DIR` every variant runs a second time as `VARIANT@baseline`, on the relay-tune code in DIR
(for example the unchanged main branch) and the same saved build.

The variants' processes run interleaved (variant after variant, `--processes` times), so they share the host's
load. Printed per variant: the median of the per-process medians, their range and max/min (the spread between
processes), the range of the per-process minima, and the one-minute load average before the variant's first run;
for its fastest and slowest process, every thread's CPU seconds and the core it last ran on (does a pool thread of
numpy's BLAS burn CPU, does a team worker do its share, do two threads share a core).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments import UsageError
from experiments.timing import write_rows

EXAMPLE = Path(__file__).resolve().parent.parent / "relay_tune" / "examples" / "small_resnet.relay"
_RUN = re.compile(r"latency: median ([\d.]+) ms, min ([\d.]+) ms")
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "native": {"RELAY_TUNE_THREADING": "native"},
    "openmp": {"RELAY_TUNE_THREADING": "openmp"},
    "native_spin0": {"RELAY_TUNE_THREADING": "native", "GOMP_SPINCOUNT": "0"},
    "openmp_spin0": {"RELAY_TUNE_THREADING": "openmp", "GOMP_SPINCOUNT": "0"},
    "openmp_bind": {"RELAY_TUNE_THREADING": "openmp", "OMP_PROC_BIND": "true"},
    "blas1": {"OPENBLAS_NUM_THREADS": "1"},
    "nogc": {"FRESH_PROCESSES_NOGC": "1"},
    "one_core": {"FRESH_PROCESSES_ONE_CORE": "1", "OMP_NUM_THREADS": "2"},
}
BASELINE = "@baseline"
# The child: the command line (with the collector off for `nogc`, pinned for `one_core`: no environment switch does
# either), then the CPU
# seconds and last core of each of its threads (/proc/self/task: the caller, the team's workers, numpy's BLAS pool).
_CHILD = """
import gc, os, sys
if os.environ.get("FRESH_PROCESSES_NOGC"):
    gc.disable()
if os.environ.get("FRESH_PROCESSES_ONE_CORE"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from relay_tune.cli import main
code = main(sys.argv[1:])
threads = []
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    threads.append((round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2), int(fields[36])))
print("threads:", " ".join(f"{cpu}s@{core}" for cpu, core in sorted(threads, reverse=True)))
sys.exit(code)
"""
_THREADS = re.compile(r"threads: (.*)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="a saved build (.rtmod); default: the Quickstart model, built")
    parser.add_argument("--processes", type=int, default=6, help="fresh processes per variant (default 6)")
    parser.add_argument("--variants", default="default,native,openmp,openmp_spin0,blas1",
                        help=f"comma-separated, from: {', '.join(VARIANTS)}")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="run every variant also as VARIANT@baseline: the relay-tune checkout in DIR runs the "
                             "same saved build")
    parser.add_argument("--csv", type=Path, help="also write one row per process")


def run_once(model: Path, variant: str, baseline_tree: Path | None = None) -> tuple[float, float, str]:
    """(median, min) seconds `relay-tune run MODEL` printed in a fresh process started as `variant` says, and its
    threads' CPU seconds and last cores ("1.52s@0 0.81s@1 0.0s@1 ...", busiest first)."""
    name, on_baseline = variant.removesuffix(BASELINE), variant.endswith(BASELINE)
    env = {**os.environ, **VARIANTS[name]}
    if on_baseline:
        if baseline_tree is None:
            raise UsageError(f"{variant} needs --baseline-tree DIR")
        env["PYTHONPATH"] = str(baseline_tree.resolve())
    # `python -c` puts the working directory first on sys.path: run in the checkout whose code the child is to run
    folder = Path(__file__).resolve().parents[1]
    if on_baseline and baseline_tree is not None:
        folder = baseline_tree.resolve()
    done = subprocess.run([sys.executable, "-c", _CHILD, "run", str(model.resolve())], env=env, capture_output=True,
                          text=True, check=False, cwd=folder)
    found, threads = _RUN.search(done.stdout), _THREADS.search(done.stdout)
    if done.returncode != 0 or found is None or threads is None:
        raise RuntimeError(f"relay-tune run ({variant}) exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return float(found.group(1)) * 1e-3, float(found.group(2)) * 1e-3, threads.group(1)


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants or args.processes < 1:
        raise UsageError(f"--variants from {', '.join(VARIANTS)} (unknown: {', '.join(unknown)}); --processes >= 1")
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "relay_tune").is_dir():
            raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
        variants = [v + suffix for v in variants for suffix in ("", BASELINE)]
    with tempfile.TemporaryDirectory(prefix="fresh-processes-") as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "default.rtmod"
            subprocess.run([sys.executable, "-m", "relay_tune", "build", str(EXAMPLE), "--no-cache", "-o",
                            str(model)], check=True, capture_output=True, cwd=EXAMPLE.parent)
        rows: list[dict[str, Any]] = []
        loads: dict[str, float] = {}
        for index in range(args.processes):
            for variant in variants:
                loads.setdefault(variant, os.getloadavg()[0])
                median, least, threads = run_once(model, variant, args.baseline_tree)
                rows.append({"process": index, "variant": variant, "median_ms": round(median * 1e3, 4),
                             "min_ms": round(least * 1e3, 4), "load_1min": round(os.getloadavg()[0], 2),
                             "threads": threads})
    print(f"{model.name if args.model else 'Quickstart model, default build'}: {args.processes} fresh processes per "
          f"variant, interleaved")
    for variant in variants:
        medians = [r["median_ms"] for r in rows if r["variant"] == variant]
        minima = [r["min_ms"] for r in rows if r["variant"] == variant]
        print(f"  {variant:22} median of medians {statistics.median(medians):.3f} ms, medians "
              f"{min(medians):.3f}-{max(medians):.3f} (max/min {max(medians) / min(medians):.2f}), minima "
              f"{min(minima):.3f}-{max(minima):.3f} ms; load {loads[variant]:.2f} at its first run", flush=True)
        ranked = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["median_ms"])
        for label, row in (("fastest", ranked[0]), ("slowest", ranked[-1])):
            print(f"      {label} process {row['median_ms']:.3f} ms, threads (CPU s @ last core): {row['threads']}")
    if args.csv:
        write_rows(args.csv, rows)
    return 0
