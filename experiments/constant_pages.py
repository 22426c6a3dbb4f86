"""Where a model's constants live: one block on huge pages (what `CompiledModel` does) against ordinary numpy
buffers (what it did before), in one process, interleaved.

    python experiments/constant_pages.py --onnx resnet50.onnx --log logs/resnet50.jsonl
    python experiments/constant_pages.py --model model.rtmod [--rounds 12]

The model is built once; each round profiles it (`CompiledModel.profile_calls`) and times it (`benchmark`) with its
constant slots pointing at its own huge-page block, then at copies of the same bytes in buffers made as numpy
makes them (64-byte aligned `np.empty`, after the build's own allocations, as a loaded or freshly built model had
them). Prints, per task, the in-graph time of both (medians over rounds) and their ratio, the whole model's
latency, and how many bytes of each variant the kernel reports on huge pages (/proc/self/smaps; whole mappings,
so an upper bound for the numpy buffers). Writes experiments/results/constant_pages_<model>.csv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from timing import write_rows  # noqa: E402  (experiments/timing.py)

import relay_tune  # noqa: E402
from relay_tune.codegen.jit import aligned_empty  # noqa: E402
from relay_tune.compile import resolve_target  # noqa: E402
from relay_tune.runtime.model import CompiledModel, load  # noqa: E402
from relay_tune.runtime.pages import huge_page_bytes_backing  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"


def build(args: argparse.Namespace) -> tuple[CompiledModel, str]:
    if args.model:
        return load(args.model), Path(args.model).stem
    from relay_tune.frontend import from_onnx

    mod, _params = from_onnx(args.onnx)
    return relay_tune.build(mod, target=resolve_target(args.target), logs=args.log), Path(args.onnx).stem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--onnx")
    source.add_argument("--model", help="a saved model (.rtmod)")
    parser.add_argument("--log", help="tuning log for --onnx")
    parser.add_argument("--target", default="native")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    model, name = build(args)
    plan = model.plan
    slots = model._executor.slots
    constant_slots = [i for i, s in enumerate(plan.storages) if s.kind == "constant"]
    huge = {i: slots[i] for i in constant_slots}
    plain_arrays = []
    for i in constant_slots:
        source = model._constants[plan.storages[i].index]
        copy = aligned_empty(source.shape, source.dtype)
        np.copyto(copy, source)
        plain_arrays.append(copy)
    plain = {i: a.ctypes.data for i, a in zip(constant_slots, plain_arrays)}
    constant_bytes = sum(a.nbytes for a in plain_arrays)
    first = model._constants[0] if model._constants else np.zeros(1)
    on_huge = {"huge pages": huge_page_bytes_backing(first.ctypes.data, constant_bytes) or 0,
               "numpy buffers": max(huge_page_bytes_backing(a.ctypes.data, a.nbytes) or 0 for a in plain_arrays)}
    inputs = model.random_inputs(seed=0)
    variants = {"huge pages": huge, "numpy buffers": plain}
    profiles: dict[str, list[list[float]]] = {v: [] for v in variants}
    latency: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant, addresses in variants.items():
            for slot, address in addresses.items():
                slots[slot] = address
            profiles[variant].append(model.profile_calls(repeat=3, inputs=inputs))
            latency[variant].append(model.benchmark(repeat=3, inputs=inputs).median)
    for slot, address in huge.items():
        slots[slot] = address

    per_task: dict[str, dict[str, float]] = {}
    for variant, runs in profiles.items():
        for number, call in enumerate(plan.calls):
            if not 0 <= call.task < len(plan.tasks):
                continue
            seconds = statistics.median(run[number] for run in runs)
            entry = per_task.setdefault(plan.tasks[call.task].description, {})
            entry[variant] = entry.get(variant, 0.0) + seconds
            entry["calls " + variant] = entry.get("calls " + variant, 0) + 1
    rows = []
    print(f"{'task':64s} {'calls':>5s} {'huge us':>9s} {'numpy us':>9s} {'huge/numpy':>10s}")
    for task, entry in sorted(per_task.items(), key=lambda kv: -kv[1]["numpy buffers"]):
        calls = int(entry["calls huge pages"])
        h, p = entry["huge pages"] / calls * 1e6, entry["numpy buffers"] / calls * 1e6
        rows.append({"task": task, "calls": calls, "huge_us": h, "numpy_us": p, "ratio": h / p})
        print(f"{task[:64]:64s} {calls:5d} {h:9.1f} {p:9.1f} {h / p:10.3f}")
    h_ms, p_ms = (statistics.median(latency[v]) * 1e3 for v in variants)
    print(f"\nwhole model (benchmark median): huge pages {h_ms:.3f} ms, numpy buffers {p_ms:.3f} ms, "
          f"ratio {h_ms / p_ms:.3f}")
    print(f"constants {constant_bytes / 2**20:.1f} MiB; on huge pages (smaps, whole mappings): "
          + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in on_huge.items()))
    rows.append({"task": "[model] benchmark ms", "calls": None, "huge_us": h_ms, "numpy_us": p_ms,
                 "ratio": h_ms / p_ms})
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"constant_pages_{name}.csv"
    write_rows(out, rows)


if __name__ == "__main__":
    main()
