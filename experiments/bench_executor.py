"""What running a model costs above its kernels: a chain of 100 small elementwise ops, one kernel each.

    python experiments/bench_executor.py [--ops 100] [--shape 1,64 --shape 1,16,32,32 ...] [--rounds 15]

The model is `y = x; y = y * 0.9; y = y + x; ...` (`--ops` operators), built with fusion off so that every
operator is its own kernel call. Per shape, in interleaved rounds (medians over rounds; the machine may be shared):

- compute: every kernel call of the model timed alone with its own repeat loop in generated code (its own
  parallel-region start included), summed over the model's calls: what the model cannot avoid;
- executor: the model's native executor running the whole model back to back (`run_repeat`: no Python at all);
- run(): `CompiledModel.run` on checked inputs, what `benchmark()` times (fresh outputs, one call into the executor);
- python loop: the same kernels called one by one from a Python loop of ctypes calls over the same buffers (how
  models used to run), for comparison.

It prints, per shape, microseconds per kernel call above compute for each way of running.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import relay_tune  # noqa: E402
from relay_tune.codegen.jit import aligned_empty  # noqa: E402
from relay_tune.interpreter import Interpreter  # noqa: E402
from relay_tune.text import parse_module  # noqa: E402


def chain_text(shape: Sequence[int], ops: int) -> str:
    """Relay text of `ops` elementwise operators on one tensor of `shape`: y = y * 0.9, then y = y + x, in turn
    (so that the result depends on every call, in order)."""
    lines = ['#[version = "0.0.5"]', f"def @main(%x: Tensor[({', '.join(map(str, shape))}), float32]) {{"]
    previous = "%x"
    for i in range(ops):
        step = f"multiply({previous}, 0.9f)" if i % 2 == 0 else f"add({previous}, %x)"
        lines.append(f"  %{i} = {step};")
        previous = f"%{i}"
    lines += [f"  {previous}", "}"]
    return "\n".join(lines)


def build_chain(shape: Sequence[int], ops: int) -> tuple[relay_tune.runtime.CompiledModel, object]:
    mod = parse_module(chain_text(shape, ops))
    return relay_tune.build(mod, opt_level=0), mod  # opt_level 0: no fusion, one kernel per operator


def time_alone(kernel: object, packed: object, number: int) -> float:
    start = time.perf_counter()
    kernel.repeat(packed, number)  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / number


def measure(shape: tuple[int, ...], ops: int, rounds: int) -> dict[str, float]:
    model, mod = build_chain(shape, ops)
    inputs = model.random_inputs(seed=0)
    want = np.asarray(Interpreter(mod).run(inputs))
    np.testing.assert_allclose(model.run(**inputs), want, rtol=1e-6, atol=1e-6)
    calls = model.plan.calls
    assert len(calls) == ops, f"expected {ops} kernel calls, the model has {len(calls)}"

    # The same kernels over buffers of our own, for the kernel-alone timings.
    kernels = {c.kernel: model._kernels[c.kernel] for c in calls}
    packed = {}
    own_buffers = []  # alive as long as the packed addresses are used
    for name, kernel in kernels.items():
        own = [aligned_empty(p.shape, p.dtype) for p in kernel.signature.params]
        for array in own:
            array[...] = 1.0
        own_buffers.append(own)
        packed[name] = kernel.pack(own)
    # The Python loop of ctypes calls (how models used to run) over the model's own buffers.
    slots = model._executor.slots
    functions = [(ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(c.args))(kernels[c.kernel].address),
                  [model.plan.values[v].storage for v in c.args]) for c in calls]
    executor = model._executor
    arrays = model._check_inputs((), inputs)
    keep = model._new_outputs()  # the executor writes here while it runs alone
    model._bind(arrays, keep)
    inner = max(1, int(2e-3 / max(1e-7, model.benchmark(repeat=3).median)))  # about 2 ms per timing
    # Each kernel alone is timed with enough calls for about 1 ms per timing (a tiny kernel takes nanoseconds).
    alone = {name: max(1, int(1e-3 / max(1e-8, min(time_alone(k, packed[name], 10) for _ in range(3)))))
             for name, k in kernels.items()}

    def compute() -> float:
        per_kernel = {name: time_alone(k, packed[name], alone[name]) for name, k in kernels.items()}
        return sum(per_kernel[c.kernel] for c in calls)

    def native() -> float:
        model._bind(arrays, keep)
        start = time.perf_counter()
        executor.run_repeat(inner)
        return (time.perf_counter() - start) / inner

    def run_checked() -> float:
        start = time.perf_counter()
        for _ in range(inner):
            model._run_checked(arrays)  # what benchmark() times
        return (time.perf_counter() - start) / inner

    def python_loop() -> float:
        model._bind(arrays, keep)
        prepared = [(fn, [slots[i] for i in where]) for fn, where in functions]
        start = time.perf_counter()
        for _ in range(inner):
            for fn, args in prepared:
                fn(*args)
        return (time.perf_counter() - start) / inner

    ways = {"compute": compute, "executor": native, "run()": run_checked, "python loop": python_loop}
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            samples[name].append(fn())
    return {name: statistics.median(values) for name, values in samples.items()}


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 1,64, got {text!r}") from None
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"expected positive dimensions, got {text!r}")
    return shape


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--shape", type=parse_shape, action="append", help="tensor shape (repeatable)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    if args.ops < 2 or args.rounds < 1:
        parser.error("--ops must be at least 2 and --rounds at least 1")
    shapes = args.shape or [(1, 64), (1, 1024), (1, 4096)]
    print(f"{args.ops} elementwise ops, one kernel each; medians over {args.rounds} interleaved rounds")
    print(f"{'shape':>16} {'compute us':>11} {'executor':>9} {'run()':>9} {'py loop':>9}   "
          "us per kernel above compute: executor / run() / python loop")
    for shape in shapes:
        m = measure(shape, args.ops, args.rounds)
        over = {k: (m[k] - m["compute"]) / args.ops * 1e6 for k in ("executor", "run()", "python loop")}
        print(f"{'x'.join(map(str, shape)):>16} {m['compute'] * 1e6:11.1f} {m['executor'] * 1e6:9.1f} "
              f"{m['run()'] * 1e6:9.1f} {m['python loop'] * 1e6:9.1f}   "
              f"{over['executor']:.3f} / {over['run()']:.3f} / {over['python loop']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
