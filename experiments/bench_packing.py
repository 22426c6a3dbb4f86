"""Run-time weight packing: the scheduled packing kernel against the plain loop nest it replaced, in one run.

    python experiments/bench_packing.py [--rounds 15] [--per-round 10]

A dense weight that is a model input and a schedule that reads it in panels (`NK -> NK<bn>n`) make the model pack
it on every run, before the dense kernel (and the tuner's runner times the two together). For a few weights,
four kernels are compiled and each checked against numpy's packing (`LayoutTransform.pack`):

- `serial`: the plain loop nest (`Schedule([packed])`, the packing kernel before it was scheduled);
- `gather`: outer panel loop in parallel, the last packed axis vectorized (each vector of stores is a gather of
  rows that lie a whole row apart in the source);
- `scheduled`: `relay_tune.compile.tasks.packing_kernel`, as models and the runner run it
  (`LayoutTransform.pack_schedule`: parallel outer loops, the source rows read in unrolled 16-element blocks);
- `numpy`: `LayoutTransform.pack` (pad, reshape, transpose, copy), for scale.

Timed in interleaved rounds (per round and kernel: `--per-round` back-to-back calls after a warm-up call, their
median kept; the median over rounds). Printed, and written to experiments/results/packing.csv: microseconds and
the speed-up of each over `serial`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from timing import write_rows  # noqa: E402

from relay_tune.codegen.llvm import build_llvm  # noqa: E402
from relay_tune.compile import resolve_target  # noqa: E402
from relay_tune.compile.tasks import packing_kernel  # noqa: E402
from relay_tune.kernel.lower import lower  # noqa: E402
from relay_tune.kernel.schedule import LayoutTransform, Schedule  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"

# (source shape, packed layout): the dense 1024^3 weight in the panel widths the tuner picks, a 512 square, a
# shape no panel or block divides, and a small weight.
CASES = [((1024, 1024), "NK16n"), ((1024, 1024), "NK32n"), ((1024, 1024), "NK64n"), ((512, 512), "NK32n"),
         ((1000, 1023), "NK48n"), ((128, 128), "NK32n")]


def variants(lt: LayoutTransform, target: object) -> dict[str, object]:
    _, packed = lt.pack_compute()
    serial = lower(Schedule([packed]), "pack_serial")
    _, packed = lt.pack_compute()
    gather = Schedule([packed])
    gather.parallel(packed.name, "ax0")
    gather.vectorize(packed.name, f"ax{len(lt.packed_shape) - 1}")
    return {"serial": serial, "gather": lower(gather, "pack_gather"),
            "scheduled": packing_kernel(lt, "pack_scheduled", target)}


def interleaved(engines: dict[str, Callable[[], object]], rounds: int, per_round: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in engines}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, run in engines.items():
            run()
            times = []
            for _ in range(per_round):
                start = clock()
                run()
                times.append(clock() - start)
            samples[name].append(statistics.median(times))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--target", default="native")
    args = parser.parse_args()
    target = resolve_target(args.target)
    print(f"target: {target}")
    rows = []
    for shape, layout in CASES:
        lt = LayoutTransform("b", "b.packed", "NK", layout, shape, "float32")
        source = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        want = lt.pack(source)
        funcs = variants(lt, target)
        library = build_llvm(list(funcs.values()), target)
        engines: dict[str, Callable[[], object]] = {}
        for name, func in funcs.items():
            kernel = library.get(func.name)
            out = np.full(lt.packed_shape, np.nan, np.float32)
            kernel(source, out)
            np.testing.assert_array_equal(out, want)
            engines[name] = lambda kernel=kernel, out=out, source=source: kernel(source, out)
        engines["numpy"] = lambda lt=lt, source=source: lt.pack(source)
        times = interleaved(engines, args.rounds, args.per_round)
        row = {"shape": "x".join(map(str, shape)), "layout": layout}
        for name, seconds in times.items():
            row[f"{name}_us"] = round(seconds * 1e6, 1)
            row[f"{name}_speedup"] = round(times["serial"] / seconds, 2)
        rows.append(row)
        print(f"NK {row['shape']} -> {layout}: " + ", ".join(
            f"{name} {times[name] * 1e6:.0f} us ({times['serial'] / times[name]:.2f}x)" for name in times))
    write_rows(RESULTS / "packing.csv", rows)


if __name__ == "__main__":
    main()
