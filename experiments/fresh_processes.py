"""One saved build timed in many fresh processes: how far apart are the medians of separate processes, and under
which runtime settings?

    python -m experiments fresh-processes [--model M.rtmod] [--processes 6] [--variants default,native,...]
                                          [--csv PATH]

Without `--model` the README's Quickstart model (`relay_tune/examples/small_resnet.relay`) is built with default
schedules first. Each variant is one way to start `relay-tune run MODEL` (what the Quickstart check compares
with): `default` as a user runs it, the others with one setting changed through the environment, to test one
hypothesis about what differs between processes:

- `native` / `openmp`: RELAY_TUNE_THREADING (the native thread team, libgomp);
- `openmp_spin0`: libgomp with GOMP_SPINCOUNT=0 (its idle threads sleep at once);
- `openmp_bind`: libgomp with OMP_PROC_BIND=true (its threads pinned, one per core);
- `blas1`: OPENBLAS_NUM_THREADS=1 (numpy's BLAS has no pool threads that could spin);
- `nogc`: Python's garbage collector disabled for the whole run.

The variants' processes run interleaved (variant after variant, `--processes` times), so they share the host's
load. Printed per variant: the median of the per-process medians, their range and max/min (the spread between
processes), the range of the per-process minima, and the one-minute load average before the variant's first run.
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
    "openmp_spin0": {"RELAY_TUNE_THREADING": "openmp", "GOMP_SPINCOUNT": "0"},
    "openmp_bind": {"RELAY_TUNE_THREADING": "openmp", "OMP_PROC_BIND": "true"},
    "blas1": {"OPENBLAS_NUM_THREADS": "1"},
    "nogc": {},
}
# `nogc` runs the command line in a process whose collector is off (there is no environment switch for that)
_NOGC = "import gc, sys; gc.disable(); from relay_tune.cli import main; sys.exit(main(sys.argv[1:]))"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="a saved build (.rtmod); default: the Quickstart model, built")
    parser.add_argument("--processes", type=int, default=6, help="fresh processes per variant (default 6)")
    parser.add_argument("--variants", default="default,native,openmp,openmp_spin0,blas1",
                        help=f"comma-separated, from: {', '.join(VARIANTS)}")
    parser.add_argument("--csv", type=Path, help="also write one row per process")


def run_once(model: Path, variant: str) -> tuple[float, float]:
    """(median, min) seconds `relay-tune run MODEL` printed in a fresh process started as `variant` says."""
    env = {**os.environ, **VARIANTS[variant]}
    if variant == "nogc":
        command = [sys.executable, "-c", _NOGC, "run", str(model)]
    else:
        command = [sys.executable, "-m", "relay_tune", "run", str(model)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found = _RUN.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"relay-tune run ({variant}) exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return float(found.group(1)) * 1e-3, float(found.group(2)) * 1e-3


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants or args.processes < 1:
        raise UsageError(f"--variants from {', '.join(VARIANTS)} (unknown: {', '.join(unknown)}); --processes >= 1")
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
                median, least = run_once(model, variant)
                rows.append({"process": index, "variant": variant, "median_ms": round(median * 1e3, 4),
                             "min_ms": round(least * 1e3, 4), "load_1min": round(os.getloadavg()[0], 2)})
    print(f"{model.name if args.model else 'Quickstart model, default build'}: {args.processes} fresh processes per "
          f"variant, interleaved")
    for variant in variants:
        medians = [r["median_ms"] for r in rows if r["variant"] == variant]
        minima = [r["min_ms"] for r in rows if r["variant"] == variant]
        print(f"  {variant:13} median of medians {statistics.median(medians):.3f} ms, medians "
              f"{min(medians):.3f}-{max(medians):.3f} (max/min {max(medians) / min(medians):.2f}), minima "
              f"{min(minima):.3f}-{max(minima):.3f} ms; load {loads[variant]:.2f} at its first run", flush=True)
    if args.csv:
        write_rows(args.csv, rows)
    return 0
