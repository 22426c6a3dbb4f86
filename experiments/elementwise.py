"""A network's element-wise kernels (the injective family) standalone, before and after, against memory speed.

    python -m experiments elementwise --model light_densenet121 [--only multiply] [--top 8] [--rounds 7]

The network is imported and optimised as `relay_tune.build` does for this host (default pipeline, layout planning)
and every fused function that the injective family schedules (element-wise groups, concatenations, layout
transforms) is built on its own with its default schedule. Two builds of each, paired by their place in the network:

- `before`: the graph without `FoldScaleShift` and the code generator without window loads
  (`LLVMCodegenBase.max_window_load = 0`: a load whose lanes repeat a short pattern, such as a per-channel
  parameter along a row of `NCHW8c` blocks, is a gather of single elements);
- `after`: the default pipeline and code generator.

The bar is a STREAM triad `a = b + s * c` over as many elements as the kernel's output, built by relay-tune (the
same code generator, parallel over the same cores), so it runs from the same level of the cache hierarchy. GB/s
counts the bytes every kernel must move: each input element read once, each output element written once (the
triad: 12 bytes per element, as STREAM counts). The engines are timed in interleaved rounds
(`experiments.timing`), each sample at least `--min-ms` long; figures are medians. `after` is checked against
`before` on random inputs first. The functions are listed largest first (`--top` of them, 0: all), then the sums;
"code" says whether the two builds' LLVM IR is the same (a ratio away from 1 there is the host's noise).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.layers import network_builders
from experiments.matvec import TRIAD_BYTES_PER_ELEMENT, triad_kernel
from experiments.timing import Samples, TimedCallable, interleaved
from relay_tune.codegen.llvm import emit_llvm_ir
from relay_tune.codegen.llvm_base import LLVMCodegenBase
from relay_tune.compile.primitive import CompiledPrimitive, build_primitive
from relay_tune.ir import Constant, TensorType
from relay_tune.kernel.compute import primitive_compute
from relay_tune.passes import PassConfig, TaskSpec, extract_tasks, layout_block, optimize, winograd_mode
from relay_tune.target import Target
from search_space.cpu import family_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="light_densenet121",
                        help="a network of `python -m experiments models` (default light_densenet121)")
    parser.add_argument("--only", default="", help="only the functions whose description contains this text")
    parser.add_argument("--top", type=int, default=8, help="functions listed, most bytes first (default 8; 0: all)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--min-ms", type=float, default=10.0, help="minimum duration of one timed sample")
    parser.add_argument("--cores", type=int, default=0, help="cores (default: all of the host's)")


def _bytes(task: TaskSpec) -> int:
    types = [*task.input_types, task.output_type]
    return sum(t.size * np.dtype(t.dtype).itemsize for t in types if isinstance(t, TensorType) and t.is_static)


def injective_tasks(onnx_model: Any, target: Target, before: bool) -> list[TaskSpec]:
    """The tasks of the network that the injective family schedules, in network order (`before`: without
    FoldScaleShift)."""
    from relay_tune.frontend import from_onnx

    mod, _ = from_onnx(onnx_model)
    config = PassConfig(disabled_passes=frozenset({"FoldScaleShift"} if before else set()))
    fused = optimize(mod, 3, config, layout_block=layout_block(target), winograd=winograd_mode())
    return [task for task in extract_tasks(fused) if family_of(primitive_compute(task.func)) == "injective"]


def call_inputs(task: TaskSpec, seed: int = 0) -> list[np.ndarray]:
    """Arguments of the task's first call in the network: its constants (folded parameters) as they are, the
    activations random (seeded, so two builds of one function get the same ones)."""
    rng = np.random.default_rng(seed)
    inputs = []
    for arg, ty in zip(task.call_sites[0].args, task.input_types):
        if isinstance(arg, Constant):
            inputs.append(np.ascontiguousarray(arg.data))
        else:
            assert isinstance(ty, TensorType)
            inputs.append(rng.standard_normal(ty.static_shape).astype(ty.dtype))
    return inputs


def kernel_call(built: CompiledPrimitive, inputs: list[np.ndarray], number: int = 1
                ) -> tuple[Callable[[], None], np.ndarray]:
    """A call that runs the kernel `number` times on `inputs` and the array its (first) output lands in."""
    outputs = [np.empty(s, d) for s, d in zip(built.packing.output_shapes, built.packing.output_dtypes)]
    arguments = built.packing.kernel_arguments(inputs, outputs)
    packed = built.kernel.pack(arguments)
    kernel = built.kernel

    def call(alive: object = (arguments, outputs)) -> None:  # `alive` keeps the packed arrays referenced
        kernel.repeat(packed, number)

    return call, outputs[0]


def _per_sample(call: Callable[[], None], min_seconds: float) -> int:
    call()
    start = time.perf_counter()
    call()
    return max(1, math.ceil(min_seconds / max(time.perf_counter() - start, 1e-9)))


def bench_pair(old: TaskSpec, new: TaskSpec, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds of `before`, `after` and the triad bar of one function, and its bytes."""
    old_inputs, new_inputs = call_inputs(old), call_inputs(new)
    saved = LLVMCodegenBase.max_window_load
    LLVMCodegenBase.max_window_load = 0
    try:
        built_old = build_primitive(old.func, target)
        code_old = emit_llvm_ir([built_old.prim_func], target).replace(built_old.prim_func.name, "kernel")
    finally:
        LLVMCodegenBase.max_window_load = saved
    built_new = build_primitive(new.func, target)
    code_new = emit_llvm_ir([built_new.prim_func], target).replace(built_new.prim_func.name, "kernel")
    check_old, out_old = kernel_call(built_old, old_inputs)
    check_new, out_new = kernel_call(built_new, new_inputs)
    check_old()
    check_new()
    np.testing.assert_allclose(out_new, out_old, rtol=1e-5, atol=1e-5, err_msg=new.description)
    elements = out_new.size
    _, triad, _alive = triad_kernel(elements, target)
    engines: dict[str, Any] = {}
    for name, call in (("before", check_old), ("after", check_new), ("triad", triad)):
        number = _per_sample(call, args.min_ms / 1000.0)
        engines[name] = TimedCallable(call, number)
    samples: dict[str, Samples] = interleaved(engines, rounds=args.rounds, repeat=1)
    return {"description": new.description, "bytes": _bytes(new), "same_code": code_old == code_new,
            "triad_bytes": TRIAD_BYTES_PER_ELEMENT * elements,
            **{name: s.median for name, s in samples.items()}}


def run(args: argparse.Namespace) -> int:
    builders = network_builders()
    if args.model not in builders:
        raise UsageError(f"unknown network {args.model!r}; choose from {', '.join(builders)}")
    if args.rounds < 1 or args.top < 0 or args.cores < 0:
        raise UsageError("--rounds must be at least 1, --top and --cores at least 0")
    host = Target.host()
    target = host.with_cores(args.cores or host.num_cores)
    onnx_model = builders[args.model]()
    old_tasks, new_tasks = injective_tasks(onnx_model, target, True), injective_tasks(onnx_model, target, False)
    if len(old_tasks) != len(new_tasks):
        raise AssertionError(f"{len(old_tasks)} injective functions before, {len(new_tasks)} after: cannot pair")
    pairs = [(o, n) for o, n in zip(old_tasks, new_tasks) if args.only in n.description]
    if not pairs:
        raise UsageError(f"no injective function of {args.model} has {args.only!r} in its description")
    pairs.sort(key=lambda pair: -_bytes(pair[1]))
    if args.top:
        pairs = pairs[:args.top]
    print(f"{args.model}: {len(pairs)} injective functions; target llvm -mcpu={target.mcpu}, "
          f"{target.num_cores} cores", flush=True)
    rows = []
    for old, new in pairs:
        row = bench_pair(old, new, target, args)
        rows.append(row)
        print(f"  {row['description'][:60]:60s} before {row['before'] * 1e3:7.3f} ms  after "
              f"{row['after'] * 1e3:7.3f} ms  triad {row['triad'] * 1e3:7.3f} ms", flush=True)
    print(f"\nmedians of {args.rounds} interleaved rounds; GB/s: bytes read and written once (triad: STREAM's count)")
    print(f"{'function':60s} {'MB':>6} {'before':>8} {'after':>8} {'ratio':>6} {'GB/s':>6} {'triad':>6} code")
    for row in rows:
        print(f"{row['description'][:60]:60s} {row['bytes'] / 1e6:6.2f} {row['before'] * 1e3:8.3f} "
              f"{row['after'] * 1e3:8.3f} {row['after'] / row['before']:6.2f} {row['bytes'] / row['after'] / 1e9:6.1f} "
              f"{row['triad_bytes'] / row['triad'] / 1e9:6.1f} {'same' if row['same_code'] else 'new'}")
    before, after = sum(r["before"] for r in rows), sum(r["after"] for r in rows)
    print(f"{'sum':60s} {sum(r['bytes'] for r in rows) / 1e6:6.2f} {before * 1e3:8.3f} {after * 1e3:8.3f} "
          f"{after / before:6.2f}")
    return 0
