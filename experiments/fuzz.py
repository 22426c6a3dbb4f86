"""The fuzz campaign: mutated, generated and corrupted inputs through the whole front half of the compiler.

    nice -n 10 python -m experiments fuzz --inputs 100000 --jobs 2       # the full campaign
    python -m experiments fuzz --inputs 2000 --seed 7 --kinds text-char,registry

Every input goes through parse -> type inference -> the graph passes, and (where small) the reference interpreter
before and after the passes, and now and then an LLVM build checked against the interpreter
(`relay_tune.testing.fuzz`, which lists the input kinds and what counts as a defect). Prints the inputs per kind
and stage and every defect; writes all of it, reproducers included, to `--out` as JSON. Exit status 1 when the
campaign found a defect.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from experiments import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from relay_tune.testing.fuzz import KINDS

    parser.add_argument("--inputs", type=int, default=100_000, help="inputs in all (default 100,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="worker processes (0: in this process, without memory limit or alarm)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--build-every", type=int, default=40, help="build every Nth registry program with LLVM")
    parser.add_argument("--no-corpus", action="store_true", help="seeds from the project only")
    parser.add_argument("--shallow", action="store_true", help="parse and type inference only (fast)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/fuzz/campaign.json"))


def run(args: argparse.Namespace) -> int:
    from relay_tune.testing.fuzz import DEFAULT_MIX, KINDS, report, run_campaign

    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise UsageError(f"unknown kinds {', '.join(unknown) or '(none given)'}; choose from {', '.join(KINDS)}")
    if args.inputs < 1 or args.jobs < 0:
        raise UsageError("--inputs must be at least 1 and --jobs at least 0")
    start = time.perf_counter()
    last = [start]

    def progress(done: int) -> None:
        if time.perf_counter() - last[0] > 30:
            last[0] = time.perf_counter()
            print(f"  {done} inputs, {time.perf_counter() - start:.0f} s", flush=True)

    stats = run_campaign(args.inputs, args.seed, args.jobs, {k: v for k, v in DEFAULT_MIX.items() if k in kinds},
                         not args.no_corpus, args.build_every, progress=progress, deep=not args.shallow)
    seconds = time.perf_counter() - start
    print(report(stats, seconds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"inputs": stats.inputs, "seconds": seconds, "by_kind": stats.by_kind,
                                    "by_stage": stats.by_stage, "interpreted": stats.interpreted,
                                    "built": stats.built, "onnx_checked": stats.onnx_checked,
                                    "defects": stats.defects}, indent=1))
    print(f"wrote {args.out}")
    return 1 if stats.defects else 0
