"""bf16 builds (`precision="bf16-emulated"` on a CPU without AVX512_BF16) against our fp32 build, same run.

    python -m experiments bf16 [--only dense resnet50] [--dense 4096,9216] [--baseline-tree DIR] [--rounds 5]
                               [--repeat 3] [--threads 2]

A CPU without AVX512_BF16 runs bf16 products through the widening path (each bfloat16 pair widened to float32 by a
shift and a mask, two FMAs: `relay_tune.codegen.llvm_dot.widened_dot2_bf16`); this measures what that gives, not
what vdpbf16ps would:

1. `dense`: AlexNet's fc6 at batch 1 (`nn.dense(x[1, 9216], W[4096, 9216])`; `--dense N,K`: another shape),
   memory-bound: the bf16 weight is half the fp32 weight's 151 MB, both far larger than the last-level cache;
   built as a model at fp32 (the dense family's matrix-vector schedule) and at bf16
   (`nn.contrib_conv2d_NCHWc_bf16` over the row as a 1x1 map), with numpy's sgemv (OpenBLAS, `--threads`
   threads) beside them; GB/s counts each build's own weight bytes;
2. `resnet50`: ResNet-50 with random weights (`relay_tune.testing.onnx_light`) at fp32 and bf16 (every blocked
   convolution and the classifier in bf16, the 3-channel stem in fp32), with `--baseline-tree DIR` also the fp32
   build of that checkout (built in a subprocess with it first on PYTHONPATH).

Engines are timed in interleaved rounds (`experiments.timing`, default schedules, every core of the target) and
each bf16 output's relative error (L2) against the fp32 build's is printed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from experiments.timing import interleaved

PARTS = ("dense", "resnet50")


def _relative(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _report(samples: dict[str, Any], reference: str, weight_bytes: dict[str, float] | None = None) -> None:
    width = max(len(name) for name in samples)
    for name, sample in samples.items():
        ratio = sample.median / samples[reference].median
        line = f"{name:{width}} {sample.describe()}  ratio to {reference} {ratio:.2f}"
        if weight_bytes and name in weight_bytes:
            line += f"  {weight_bytes[name] / sample.median / 1e9:.1f} GB/s of weights"
        print(line)


def dense_comparison(args: argparse.Namespace) -> None:
    from relay_tune import build
    from relay_tune.text import parse_module

    n, k = args.dense
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    mod = parse_module(f'#[version = "0.0.5"]\ndef @main(%x: Tensor[(1, {k}), float32]) {{\n'
                       f'  nn.dense(%x, meta[relay.Constant][0], units={n})\n}}\n', constants=[weight])
    fp32 = build(mod, "llvm")
    bf16 = build(mod, "llvm", precision="bf16-emulated")
    want = x @ weight.T
    print(f"dense 1x{k} * {n}x{k}: bf16 relative error against fp32 {_relative(bf16.run(x=x), fp32.run(x=x)):.2e} "
          f"(fp32 against numpy {_relative(fp32.run(x=x), want):.1e}); kernels: "
          + ", ".join(t.description for t in bf16.plan.tasks if t.kernel))
    with threadpool_limits(args.threads):
        samples = interleaved({"relay-tune fp32": fp32, "relay-tune bf16 (widened)": bf16,
                               "numpy sgemv": lambda: x @ weight.T},
                              rounds=args.rounds, repeat=args.repeat, inputs={"x": x}, settle_s=0.5)
    _report(samples, "relay-tune fp32", {"relay-tune fp32": 4.0 * n * k, "relay-tune bf16 (widened)": 2.0 * n * k,
                                         "numpy sgemv": 4.0 * n * k})


def resnet_comparison(args: argparse.Namespace) -> None:
    from relay_tune import build
    from relay_tune.frontend import from_onnx
    from relay_tune.testing.onnx_light import light_model

    model = light_model("resnet50")
    mod = from_onnx(model)[0]
    fp32 = build(mod, "llvm")
    bf16 = build(mod, "llvm", precision="bf16-emulated")
    inputs = fp32.random_inputs(seed=1)
    products = [t.description for t in bf16.plan.tasks if "conv" in t.description or "dense" in t.description]
    print(f"resnet50: bf16 relative error against fp32 {_relative(bf16.run(**inputs), fp32.run(**inputs)):.2e}; "
          f"{sum('bf16' in p for p in products)} of {len(products)} product kernels bf16")
    engines: dict[str, Any] = {"relay-tune fp32": fp32, "relay-tune bf16 (widened)": bf16}
    if args.baseline_tree is not None:
        from experiments.models import baseline_build

        engines["baseline tree fp32"] = baseline_build(args.baseline_tree, model, args.threads)
    samples = interleaved(engines, rounds=args.rounds, repeat=args.repeat, inputs=inputs, settle_s=0.5)
    _report(samples, "relay-tune fp32")


def _shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N,K (two integers), got {text!r}") from None
    if n < 1 or k < 2 or k % 2:
        raise argparse.ArgumentTypeError(f"N must be positive and K even and positive, got {text!r}")
    return n, k


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default all)")
    parser.add_argument("--dense", type=_shape, default=(4096, 9216), metavar="N,K",
                        help="the dense product's weight shape (default 4096,9216: AlexNet's fc6)")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also time the fp32 ResNet-50 build of another checkout (e.g. /work/main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="numpy's threads")


def run(args: argparse.Namespace) -> int:
    parts = {"dense": dense_comparison, "resnet50": resnet_comparison}
    for part in args.only:
        parts[part](args)
    return 0
