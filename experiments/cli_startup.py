"""Start-up time of the command line: `relay-tune --help`, this checkout against a baseline checkout.

    git worktree add /tmp/relay-tune-base <commit>      # or any other copy of the project
    python experiments/cli_startup.py /tmp/relay-tune-base [--repeats 7]

Each repeat runs `relay-tune --help` (the `relay_tune.cli` entry point, in a fresh interpreter) once from each
checkout, alternating, so that both see the same machine load; prints the median wall time of each and their
ratio. Imports inside the command functions keep this short: a regression shows here first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HELP = "import sys; sys.argv = ['relay-tune', '--help']; from relay_tune.cli import main; main()"


def startup_seconds(checkout: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    start = time.perf_counter()
    # run from the checkout: `python -c` puts the working directory first on sys.path
    done = subprocess.run([sys.executable, "-c", HELP], env=env, cwd=checkout, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"relay-tune --help failed in {checkout}:\n{done.stderr[-2000:]}")
    return elapsed


def loaded_modules(checkout: Path) -> int:
    """How many modules `import relay_tune.cli` loads (and a check that `checkout`'s code is what runs)."""
    probe = ("import sys, relay_tune.cli; assert relay_tune.cli.__file__.startswith(sys.argv[1]), "
             "relay_tune.cli.__file__; print(len(sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run([sys.executable, "-c", probe, str(checkout)], env=env, cwd=checkout, capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", type=Path, help="root of the baseline checkout")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    checkouts = {"baseline": args.baseline.resolve(), "this checkout": Path(__file__).resolve().parents[1]}
    modules = {name: loaded_modules(path) for name, path in checkouts.items()}
    times: dict[str, list[float]] = {name: [] for name in checkouts}
    for _ in range(args.repeats):
        for name, path in checkouts.items():
            times[name].append(startup_seconds(path))
    for name, values in times.items():
        print(f"{name:14s} median {statistics.median(values):.3f} s, {modules[name]} modules loaded  "
              f"({', '.join(f'{v:.3f}' for v in values)})")
    ratio = statistics.median(times["this checkout"]) / statistics.median(times["baseline"])
    print(f"ratio this/baseline: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
