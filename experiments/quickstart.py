"""The Quickstart on a cold machine: is the before/after ratio the tuner prints what `relay-tune run` measures?

    python -m experiments quickstart [--times 5] [--trials 64] [--runs 3] [--csv results/quickstart.csv]

Each time, in a new temporary folder with a new, empty tuning cache and compiled-kernel cache
(`RELAY_TUNE_CACHE`) and, where this process may, the page cache dropped first:

1. the README's Quickstart command, `relay-tune small_resnet.relay --trials N`, in a fresh process; its printed
   "end-to-end latency: A with default schedules, B tuned (...)" line is read;
2. `relay-tune build small_resnet.relay --no-cache` writes the default build;
3. `relay-tune run default.rtmod TUNED.rtmod` (both builds timed in the same interleaved rounds, as the tuner
   times them), `--runs` times, every one a fresh process; the median of each build's printed medians gives the
   ratio a user would measure. (Timing each build in a process of its own compared machine states seconds apart:
   one saved build gave medians of 1.30-2.01 ms in nine fresh processes in a row on an idle host.)

A time passes when the printed ratio A/B is within `--tolerance` (10%) of the run medians' ratio. The tuner prints
no ratio when its rounds disagree; that time fails and says so. Where the tuner kept the default build ("B with the
records (...): the model is built with default schedules"), the model it wrote is the default build, so the ratio it
claims for that model is 1. Each row also gives the Quickstart's wall time and the host's one-minute load average
before it (the host may be shared: a busy core slows a two-thread model far more than it slows one build against
the other).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.timing import write_rows

EXAMPLE = Path(__file__).resolve().parent.parent / "relay_tune" / "examples" / "small_resnet.relay"
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_E2E = re.compile(r"end-to-end latency: ([\d.]+) (us|ms|s) with default schedules, ([\d.]+) (us|ms|s) "
                  r"(tuned|with the records) \((.*)\)")
_RUN = re.compile(r"^  (\S+\.rtmod): median ([\d.]+) ms", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--times", type=int, default=5, help="cold Quickstarts in a row (default 5)")
    parser.add_argument("--trials", type=int, default=64, help="the Quickstart's --trials (default 64)")
    parser.add_argument("--runs", type=int, default=3,
                        help="`relay-tune run` processes, each timing both builds (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed relative difference (default 0.10)")
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")


def drop_page_cache() -> bool:
    """Write back and drop the kernel's page cache (root on a machine that allows it); whether it was dropped."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def relay_tune(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Output of `relay-tune ARGS` in a fresh process (an error with its output if it fails)."""
    done = subprocess.run([sys.executable, "-m", "relay_tune", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"relay-tune {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def one_time(index: int, args: argparse.Namespace) -> dict[str, Any]:
    """One cold Quickstart and the `relay-tune run` timings of its two builds."""
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        folder = Path(tmp)
        for source in EXAMPLE.parent.glob(f"{EXAMPLE.stem}.*"):
            shutil.copy(source, folder / source.name)
        env = {**os.environ, "RELAY_TUNE_CACHE": str(folder / "cache")}
        dropped = drop_page_cache()
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        tuned_out = relay_tune([EXAMPLE.name, "--trials", str(args.trials)], folder, env)
        quickstart_s = time.monotonic() - started
        printed = _E2E.search(tuned_out)
        model_line = re.search(r"model: (\S+\.rtmod)", tuned_out)
        if model_line is None:
            raise RuntimeError(f"the Quickstart wrote no model:\n{tuned_out}")
        relay_tune(["build", EXAMPLE.name, "--no-cache", "-o", "default.rtmod"], folder, env)
        medians: dict[str, list[float]] = {"default": [], "tuned": []}
        tuned_path = model_line.group(1)
        for _ in range(args.runs):
            printed_runs = dict(_RUN.findall(relay_tune(["run", "default.rtmod", tuned_path], folder, env)))
            assert len(printed_runs) == 2, "relay-tune run prints both builds' medians"
            medians["default"].append(float(printed_runs["default.rtmod"]) * 1e-3)
            medians["tuned"].append(float(printed_runs[tuned_path]) * 1e-3)
    run_default, run_tuned = statistics.median(medians["default"]), statistics.median(medians["tuned"])
    row: dict[str, Any] = {"time": index, "page_cache_dropped": dropped, "load_1min": round(load_before, 2),
                           "quickstart_s": round(quickstart_s, 1),
                           "run_default_ms": round(run_default * 1e3, 4), "run_tuned_ms": round(run_tuned * 1e3, 4),
                           "run_ratio": round(run_default / run_tuned, 3)}
    if printed is None:
        row.update(printed_default_ms=None, printed_tuned_ms=None, printed_ratio=None, agrees=False,
                   printed="no end-to-end line")
        return row
    before = float(printed.group(1)) * _UNITS[printed.group(2)]
    after = float(printed.group(3)) * _UNITS[printed.group(4)]
    verdict = printed.group(6)
    ratio_given = not verdict.startswith("timings too noisy")
    claimed = before / after if printed.group(5) == "tuned" else 1.0  # "with the records": the default build saved
    row.update(printed_default_ms=round(before * 1e3, 4), printed_tuned_ms=round(after * 1e3, 4),
               printed_ratio=round(claimed, 3) if ratio_given else None,
               printed=verdict if printed.group(5) == "tuned" else f"records {verdict}; default build kept")
    row["agrees"] = ratio_given and abs(claimed / row["run_ratio"] - 1) <= args.tolerance
    return row


def run(args: argparse.Namespace) -> int:
    rows = []
    for index in range(1, args.times + 1):
        row = one_time(index, args)
        rows.append(row)
        printed = f"{row['printed_ratio']:.2f}x" if row["printed_ratio"] else "none"
        print(f"time {index}: printed {row['printed_default_ms']} -> {row['printed_tuned_ms']} ms ({row['printed']}; "
              f"ratio {printed}); relay-tune run medians {row['run_default_ms']} -> {row['run_tuned_ms']} ms "
              f"(ratio {row['run_ratio']:.2f}x); {'agrees' if row['agrees'] else 'DISAGREES'}; Quickstart "
              f"{row['quickstart_s']} s, load {row['load_1min']}"
              f"{'' if row['page_cache_dropped'] else ' (page cache not dropped: not permitted here)'}", flush=True)
    agreed = sum(row["agrees"] for row in rows)
    print(f"{agreed} of {len(rows)} cold Quickstarts printed a ratio within {args.tolerance:.0%} of `relay-tune run`")
    if args.csv:
        write_rows(args.csv, rows)
    return 0
