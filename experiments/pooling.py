"""Pooling kernels of quantized graphs: alone, against a baseline checkout, and `QuantizedPooling` in the int8 graph.

    python -m experiments pooling [--baseline-tree DIR] [--rounds 5] [--repeat 20] [--only TEXT] [--skip-kernels]
                                  [--skip-model]

1. Kernels: ResNet-50's stem max pool (3x3, stride 2, padding 1, on 1x8x112x112x8 NCHW8c) as the float32 pool
   alone, the float32 pool with a quantizing epilogue (QuantizeLinear to uint8: what the QDQ graph fuses), the uint8
   pool alone and the uint8 pool with a dequantize + quantize epilogue (what `QuantizedPooling` leaves); and global
   average and global max pools of 1x256x7x7x8, float32 and uint8. Each is a one-kernel model built with default
   schedules by this checkout and, with `--baseline-tree DIR`, by that checkout (in a subprocess with it first on
   PYTHONPATH); all are timed interleaved (`experiments.timing`), medians and baseline / ours printed. `--only TEXT`
   keeps the kernels whose name contains TEXT.
2. Model: the QDQ ResNet-50 of `python -m experiments int8` (random weights, onnxruntime's `quantize_static`, 7-bit
   weights) built by this checkout with and without `QuantizedPooling` (its `opt_level` raised above the build's for
   the second build), both profiled in the same process in interleaved rounds: the stem convolution's and the stem
   pool's in-graph times (medians) and both models' latencies; and the largest difference of their outputs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.timing import interleaved

STEM = (1, 8, 112, 112, 8)
HEAD = (1, 256, 7, 7, 8)
STEM_POOL = 'nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout="NCHW8c")'
QUANTIZE = ("%1 = divide(%0, 0.05f); %2 = round(%1); %3 = add(%2, 3f); %4 = clip(%3, a_min=0f, a_max=255f); "
            'cast(%4, dtype="uint8")')
REQUANTIZE = ('%1 = cast(%0, dtype="float32"); %2 = subtract(%1, 3f); %3 = multiply(%2, 0.05f); '
              "%4 = divide(%3, 0.05f); %5 = round(%4); %6 = add(%5, 3f); %7 = clip(%6, a_min=0f, a_max=255f); "
              'cast(%7, dtype="uint8")')
# (name, input shape, dtype, pool, epilogue statements ending in the result)
KERNELS: tuple[tuple[str, tuple[int, ...], str, str, str], ...] = (
    ("stem max pool f32", STEM, "float32", STEM_POOL, "%0"),
    ("stem max pool f32 + quantize", STEM, "float32", STEM_POOL, QUANTIZE),
    ("stem max pool u8", STEM, "uint8", STEM_POOL, "%0"),
    ("stem max pool u8 + dq + q", STEM, "uint8", STEM_POOL, REQUANTIZE),
    ("global avg pool f32", HEAD, "float32", 'nn.global_avg_pool2d(%x, layout="NCHW8c")', "%0"),
    ("global avg pool u8", HEAD, "uint8", 'nn.global_avg_pool2d(%x, layout="NCHW8c")', "%0"),
    ("global max pool u8", HEAD, "uint8", 'nn.global_max_pool2d(%x, layout="NCHW8c")', "%0"),
)


def kernel_source(shape: tuple[int, ...], dtype: str, pool: str, epilogue: str) -> str:
    """Relay text of one pooling kernel: `%0` is the pool, `epilogue` the statements after it (its last the
    result)."""
    body = ";\n  ".join([f"%0 = {pool}"] + [s.strip() for s in epilogue.split(";")])
    return f'#[version = "0.0.5"]\ndef @main(%x: Tensor[{shape}, {dtype}]) {{\n  {body}\n}}\n'


_BASELINE_KERNEL = """
import sys, relay_tune
from relay_tune.text import parse_module
relay_tune.build(parse_module(open(sys.argv[1]).read()), "llvm").save(sys.argv[2])
"""
"""Builds one kernel's Relay text with another checkout's code (`models.built_by_tree`)."""


def kernel_comparison(args: argparse.Namespace) -> None:
    from experiments.models import built_by_tree
    from relay_tune import build
    from relay_tune.text import parse_module

    kernels = [k for k in KERNELS if args.only is None or args.only in k[0]]
    if not kernels:
        raise UsageError(f"no pooling kernel name contains {args.only!r}")
    engines: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        for name, shape, dtype, pool, epilogue in kernels:
            source = kernel_source(shape, dtype, pool, epilogue)
            x = (rng.integers(0, 256, shape) if dtype == "uint8" else rng.standard_normal(shape)).astype(dtype)
            ours = build(parse_module(source), "llvm")
            engines[name] = (lambda m=ours, x=x: m.run(x=x))
            if args.baseline_tree is not None:
                path = Path(folder) / "kernel.relay"
                path.write_text(source)
                before = built_by_tree(args.baseline_tree, _BASELINE_KERNEL, [str(path)])
                np.testing.assert_array_equal(before.run(x=x), ours.run(x=x))
                engines[f"{name} baseline"] = (lambda m=before, x=x: m.run(x=x))
        samples = interleaved(engines, rounds=args.rounds, repeat=args.repeat)
    for name, *_ in kernels:
        line = f"{name:32} ours {samples[name].describe()}"
        if f"{name} baseline" in samples:
            base = samples[f"{name} baseline"]
            line += f"  baseline {base.describe()}  baseline/ours {base.median / samples[name].median:.2f}x"
        print(line)


def model_comparison(args: argparse.Namespace) -> None:
    import onnx

    from experiments.int8 import RANGES, passes_skipped, quantize_model
    from relay_tune import build
    from relay_tune.frontend import from_onnx
    from relay_tune.testing.onnx_light import light_model

    model = light_model("resnet50")
    name, shape = model.graph.input[0].name, (1, 3, 224, 224)
    feeds = {name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    with tempfile.TemporaryDirectory() as folder:
        src, dst = Path(folder) / "r50.onnx", Path(folder) / "r50.int8.onnx"
        onnx.save(model, str(src))
        quantize_model(src, dst, name, shape, False, RANGES["reduced"])
        mod = from_onnx(onnx.load(str(dst)))[0]
    builds = {"QuantizedPooling": build(mod, "llvm", build_cache=False)}
    with passes_skipped(["QuantizedPooling"]):
        builds["float pool"] = build(mod, "llvm", build_cache=False)
    outputs = [np.asarray(m.run(**feeds)) for m in builds.values()]
    print(f"max |with - without QuantizedPooling| = {np.abs(outputs[0] - outputs[1]).max():.3g}")
    stem: dict[str, dict[str, list[float]]] = {k: {"conv": [], "pool": []} for k in builds}
    described: dict[str, dict[str, str]] = {k: {} for k in builds}
    for _ in range(args.rounds):
        for key, built in builds.items():
            # in call order: the model's first convolution and first max pool are the stem's
            calls = [(built.plan.tasks[c.task].description if c.task >= 0 else "", seconds)
                     for c, seconds in zip(built.plan.calls, built.profile_calls(args.repeat, feeds))]
            conv = next(c for c in calls if "conv2d" in c[0])
            pool = next(c for c in calls if c[0].startswith("max_pool2d"))
            for part, (description, seconds) in (("conv", conv), ("pool", pool)):
                stem[key][part].append(seconds)
                described[key][part] = description
    for key in builds:
        for part in ("conv", "pool"):
            print(f"{key:17} stem {part} {1e3 * statistics.median(stem[key][part]):7.3f} ms  "
                  f"{described[key][part][:100]}")
    samples = interleaved(builds, rounds=args.rounds, repeat=args.repeat, inputs=feeds)
    for key, s in samples.items():
        print(f"{key:17} model {s.describe()}")
    print(f"float pool / QuantizedPooling {samples['float pool'].median / samples['QuantizedPooling'].median:.3f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also time the kernels as another checkout of relay-tune builds them")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per engine and round (default 20)")
    parser.add_argument("--only", metavar="TEXT", help="only the kernels whose name contains TEXT")
    parser.add_argument("--skip-kernels", action="store_true", help="leave out the single kernels")
    parser.add_argument("--skip-model", action="store_true", help="leave out the int8 ResNet-50")


def run(args: argparse.Namespace) -> int:
    if not args.skip_kernels:
        kernel_comparison(args)
    if not args.skip_model:
        model_comparison(args)
    return 0
