"""Why a kernel's time in the model differs from the runner's: the same compiled kernel timed in one process in
the contexts that differ between the two.

    python experiments/in_graph_context.py --model model.rtmod [--match dense,max_pool2d,global_avg_pool2d]
    python experiments/in_graph_context.py --onnx resnet50.onnx --log logs/resnet50.jsonl

For each kernel call of the model whose task description contains one of `--match` (medians over `--rounds`
interleaved rounds, microseconds per call):

- in-graph: the executor's own timestamps in a model run (`CompiledModel.profile_calls`);
- runner: called back to back as the tuner's runner calls it: weight arguments (model constants) rotating through
  64 MiB of copies on huge pages, activations and outputs in one buffer each;
- act. 4 MiB: the same, with the first activation argument also rotating, through 4 MiB of copies (more than the
  two cores' L2 caches, less than the L3): the input comes from the shared cache, not from the core's own;
- after producer: the call before it in the model, then this one (only this one timed, from Python: about
  0.3 us of call overhead included), on the model's own buffers;

and what the executor's timestamps add to a kernel's in-graph time (`timestamp_cost`).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from relay_tune.runtime.executor import NativeExecutor  # noqa: E402
from relay_tune.runtime.model import CompiledModel, load  # noqa: E402
from relay_tune.runtime.pages import huge_page_empty  # noqa: E402

COLD_WEIGHTS = 64 << 20
COLD_ACTIVATIONS = 4 << 20
BATCH = 50


def build(args: argparse.Namespace) -> CompiledModel:
    if args.model:
        return load(args.model)
    import relay_tune
    from relay_tune.compile import resolve_target
    from relay_tune.frontend import from_onnx

    mod, _params = from_onnx(args.onnx)
    return relay_tune.build(mod, target=resolve_target("native"), logs=args.log)


def copies(address: int, nbytes: int, total: int, keep: list) -> list[int]:
    """Addresses of copies of `nbytes` at `address`, as many as fill `total` bytes (at least two)."""
    count = max(2, min(4096, -(-total // nbytes)))
    step = -(-nbytes // 64) * 64
    block = huge_page_empty(count * step)
    keep.append(block)
    base = block.__array_interface__["data"][0]
    for i in range(count):
        ctypes.memmove(base + i * step, address, nbytes)
    return [base + i * step for i in range(count)]


def rows(pointers: list[int], weight_copies: dict[int, list[int]], activation: int | None,
         act_copies: list[int]) -> list[list[int]]:
    """Argument rows, one per call: copy r of each weight (and of the activation, when it rotates)."""
    count = max([len(c) for c in weight_copies.values()] + [len(act_copies), 1])
    table = []
    for r in range(count):
        row = list(pointers)
        for position, found in weight_copies.items():
            row[position] = found[r % len(found)]
        if activation is not None and act_copies:
            row[activation] = act_copies[r % len(act_copies)]
        table.append(row)
    return table


def timestamp_cost(calls: int = 1000, rounds: int = 20) -> float:
    """Seconds between two timestamps of `run_profiled` around a call that does nothing: an executor of `calls`
    calls of free(NULL) (a no-op by the C standard), median over all calls of `rounds` runs."""
    libc = ctypes.CDLL(None)
    free = ctypes.cast(libc.free, ctypes.c_void_p).value
    executor = NativeExecutor([("free", [0])] * calls, 1, {"free": int(free or 0)})
    executor.slots[0] = None
    spent: list[float] = []
    for _ in range(rounds):
        spent += executor.run_profiled()
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--onnx")
    source.add_argument("--model")
    parser.add_argument("--log")
    parser.add_argument("--match", default="dense,max_pool2d,layout_transform,global_avg_pool2d")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    model = build(args)
    plan, executor = model.plan, model._executor
    inputs = model.random_inputs(seed=0)
    arrays = model._check_inputs((), inputs)
    outputs = model._new_outputs()
    model._bind(arrays, outputs)

    def describe(number: int) -> str:
        task = plan.calls[number].task
        return plan.tasks[task].description if 0 <= task < len(plan.tasks) else "weight packing"

    def kernel(number: int) -> tuple[Callable[..., None], list[int], list[str]]:
        call = plan.calls[number]
        function = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(call.args)))(model._kernels[call.kernel].address)
        storages = [plan.values[v].storage for v in call.args]
        return function, [executor.slots[s] for s in storages], [plan.storages[s].kind for s in storages]

    wanted = [w for w in args.match.split(",") if w]
    chosen = [n for n, _ in enumerate(plan.calls) if any(w in describe(n) for w in wanted)]
    clock = time.perf_counter_ns
    keep: list = []
    print(f"{'call':>4s} {'task':56s} {'in-graph':>9s} {'runner':>8s} {'act.4MiB':>9s} {'producer':>9s}")
    for number in chosen:
        function, pointers, kinds = kernel(number)
        nbytes = [plan.values[v].nbytes for v in plan.calls[number].args]
        weights = [p for p, k in enumerate(kinds) if k == "constant"]
        activation = next((p for p, k in enumerate(kinds) if k in ("arena", "input")), None)
        weight_total = sum(nbytes[p] for p in weights) or 1
        weight_copies = {p: copies(pointers[p], nbytes[p], COLD_WEIGHTS * nbytes[p] // weight_total, keep)
                         for p in weights}
        act_copies = (copies(pointers[activation], nbytes[activation], COLD_ACTIVATIONS, keep)
                      if activation is not None else [])

        variants = {"runner": rows(pointers, weight_copies, None, []),
                    "act": rows(pointers, weight_copies, activation, act_copies)}
        producer = kernel(number - 1) if number > 0 else None
        times: dict[str, list[float]] = {"in-graph": [], "runner": [], "act": [], "producer": []}
        cursor = 0
        for _ in range(args.rounds):
            times["in-graph"].append(statistics.median(executor.run_profiled()[number] for _ in range(3)))
            for name, table in variants.items():
                start = clock()
                for i in range(BATCH):
                    function(*table[(cursor + i) % len(table)])
                times[name].append((clock() - start) * 1e-9 / BATCH)
                cursor += BATCH
            if producer is not None:
                spent = []
                for _ in range(5):
                    producer[0](*producer[1])
                    start = clock()
                    function(*pointers)
                    spent.append((clock() - start) * 1e-9)
                times["producer"].append(statistics.median(spent))
        medians = {k: statistics.median(v) * 1e6 if v else float("nan") for k, v in times.items()}
        print(f"{number:4d} {describe(number)[:56]:56s} {medians['in-graph']:9.1f} {medians['runner']:8.1f} "
              f"{medians['act']:9.1f} {medians['producer']:9.1f}")

    print(f"\nthe executor's timestamps: {timestamp_cost() * 1e9:.0f} ns between two calls of a function that "
          "does nothing (free(NULL)), i.e. what one timestamp adds to a kernel's in-graph time")

if __name__ == "__main__":
    main()
