"""An int8 (QDQ) ResNet-50 against our fp32 build and onnxruntime, and the int8 convolution kernels against the peak.

    python -m experiments int8 [--per-channel] [--reduce-range] [--rounds 5] [--repeat 3] [--threads 2]
                               [--skip-model] [--skip-kernels]

1. ResNet-50 with random weights (`relay_tune.testing.onnx_light`), quantized by onnxruntime's `quantize_static`
   (QDQ, uint8 activations, int8 weights, a calibration reader of a few random images);
2. builds it with relay-tune (the `QuantizedProducts` pass turns its convolutions into int8 products with the
   requantization fused) and the float model too, and times, interleaved in the same run (`experiments.timing`):
   relay-tune fp32, relay-tune int8, onnxruntime fp32 and onnxruntime int8 (same threads, all optimisations);
   prints the medians and the ratios the issue asks about (int8 speed-up over our fp32; our int8 against
   onnxruntime's int8), and how far our int8 output is from onnxruntime's unoptimised QDQ graph (exact
   float semantics) and from its optimised int8 kernels;
3. times ResNet-50's convolution shapes as single int8 kernels (uint8 x int8 -> int32) and as fp32 kernels and
   prints their GOPS against the peaks of this CPU: u8 x s8 with vpmaddubsw + vpmaddwd (AVX2; 64 ops per cycle per
   core with two multiply ports) or vpdpbusd (AVX-VNNI / AVX512-VNNI), fp32 with two FMA ports.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from experiments.timing import interleaved

# (name, in channels, out channels, kernel, stride, map size): ResNet-50's convolutions, one of each kind
CONV_SHAPES: tuple[tuple[str, int, int, int, int, int], ...] = (
    ("1x1 256->64 @56", 256, 64, 1, 1, 56),
    ("3x3 64->64 @56", 64, 64, 3, 1, 56),
    ("1x1 512->128 @28", 512, 128, 1, 1, 28),
    ("3x3 256->256 @14", 256, 256, 3, 1, 14),
)


def cpu_features() -> tuple[set[str], float]:
    """The CPU flags and clock (GHz) from /proc/cpuinfo (empty and 0 elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set(), 0.0
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return set(flags.group(1).split()) if flags else set(), float(mhz.group(1)) / 1e3 if mhz else 0.0


def int8_ops_per_cycle(flags: set[str]) -> tuple[int, str]:
    """Peak u8 x s8 multiply-add ops (2 per MAC) per cycle and core, and the instructions that reach it."""
    if "avx512_vnni" in flags:
        return 2 * 64 * 2, "vpdpbusd zmm (2 ports)"  # 64 MACs per instruction
    if "avx_vnni" in flags:
        return 2 * 32 * 2, "vpdpbusd ymm (2 ports)"
    if "avx512bw" in flags:
        return 2 * 64, "vpmaddubsw + vpmaddwd zmm"
    # vpmaddubsw (32 MACs) and the vpmaddwd that widens its pairs share the two multiply ports: one pair per cycle
    return 2 * 32, "vpmaddubsw + vpmaddwd ymm"


def fp32_ops_per_cycle(flags: set[str]) -> int:
    lanes = 16 if "avx512f" in flags else 8
    return 2 * lanes * 2  # two FMA ports, 2 flops each


def quantize_model(src: Path, dst: Path, input_name: str, shape: tuple[int, ...], per_channel: bool,
                   reduce_range: bool) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.batches = iter([{input_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=per_channel, reduce_range=reduce_range)


def ort_session(path: Path, threads: int, optimize: bool = True) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def model_comparison(args: argparse.Namespace) -> None:
    import onnx

    from relay_tune import build
    from relay_tune.frontend import from_onnx
    from relay_tune.testing.onnx_light import light_model

    model = light_model("resnet50")
    name = model.graph.input[0].name
    shape = (1, 3, 224, 224)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "r50.onnx", Path(tmp) / "r50.int8.onnx"
        onnx.save(model, str(src))
        quantize_model(src, dst, name, shape, args.per_channel, args.reduce_range)
        qmodel = onnx.load(str(dst))
        fp32 = build(from_onnx(model)[0], "llvm")
        int8 = build(from_onnx(qmodel)[0], "llvm", opt_level=4)  # integer products (QuantizedProducts)
        int8_float = build(from_onnx(qmodel)[0], "llvm")  # the default: float products, weights dequantized
        ort_fp32, ort_int8 = ort_session(src, args.threads), ort_session(dst, args.threads)
        ort_reference = ort_session(dst, args.threads, optimize=False)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ours = int8.run(**{name: x})
    exact = ort_reference.run(None, {name: x})[0]
    theirs = ort_int8.run(None, {name: x})[0]
    print(f"int8 output: max |ours - onnxruntime unoptimised QDQ| = {np.abs(ours - exact).max():.3g}, "
          f"max |ours - onnxruntime int8| = {np.abs(ours - theirs).max():.3g}, "
          f"max |onnxruntime int8 - unoptimised| = {np.abs(theirs - exact).max():.3g}")
    feeds = {name: x}
    samples = interleaved({
        "relay-tune fp32": lambda: fp32.run(**feeds),
        "relay-tune int8": lambda: int8.run(**feeds),
        "relay-tune QDQ float": lambda: int8_float.run(**feeds),
        "onnxruntime fp32": lambda: ort_fp32.run(None, feeds),
        "onnxruntime int8": lambda: ort_int8.run(None, feeds),
    }, rounds=args.rounds, repeat=args.repeat, settle_s=0.5)
    for engine, s in samples.items():
        print(f"{engine:18} {s.describe()}")
    med = {k: v.median for k, v in samples.items()}
    print(f"int8 speed-up over our fp32: {med['relay-tune fp32'] / med['relay-tune int8']:.2f}x (target >= 1.6x)")
    print(f"our int8 / onnxruntime int8 latency: {med['relay-tune int8'] / med['onnxruntime int8']:.2f} "
          f"(target <= 1.0)")
    print(f"onnxruntime int8 speed-up over its fp32: {med['onnxruntime fp32'] / med['onnxruntime int8']:.2f}x")


def _conv_module(cin: int, cout: int, k: int, stride: int, size: int, int8: bool) -> tuple[Any, dict[str, Any]]:
    from relay_tune.text import parse_module

    rng = np.random.default_rng(0)
    if int8:
        weight = rng.integers(-127, 128, (cout, cin, k, k)).astype(np.int8)
        x: np.ndarray = rng.integers(0, 256, (1, cin, size, size)).astype(np.uint8)
        dtypes, extra = ("uint8", "int32"), ', out_dtype="int32"'
    else:
        weight = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
        x = rng.standard_normal((1, cin, size, size)).astype(np.float32)
        dtypes, extra = ("float32", "float32"), ""
    pad = k // 2
    out = (size + 2 * pad - k) // stride + 1
    text = f'''#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {size}, {size}), {dtypes[0]}]) -> Tensor[(1, {cout}, {out}, {out}), {dtypes[1]}] {{
  nn.conv2d(%x, meta[relay.Constant][0], strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}],
            channels={cout}, kernel_size=[{k}, {k}]{extra})
}}'''
    return parse_module(text, constants=[weight]), {"x": x}


def kernel_comparison(args: argparse.Namespace) -> None:
    from relay_tune import build

    flags, ghz = cpu_features()
    cores = args.threads
    int8_peak, how = int8_ops_per_cycle(flags)
    fp32_peak = fp32_ops_per_cycle(flags)
    print(f"CPU: {ghz:.2f} GHz, {cores} threads, VNNI: {sorted(flags & {'avx_vnni', 'avx512_vnni'}) or 'none'}; "
          f"int8 peak {int8_peak * ghz * cores:.0f} GOPS ({how}), fp32 peak {fp32_peak * ghz * cores:.0f} GFLOPS")
    for label, cin, cout, k, stride, size in CONV_SHAPES:
        engines: dict[str, Any] = {}
        feeds: dict[str, dict[str, Any]] = {}
        for kind in ("fp32", "int8"):
            mod, inputs = _conv_module(cin, cout, k, stride, size, kind == "int8")
            compiled = build(mod, "llvm")
            feeds[kind] = inputs
            engines[kind] = (lambda c, i: lambda: c.run(**i))(compiled, inputs)
        samples = interleaved(engines, rounds=args.rounds, repeat=args.repeat)
        out = (size + 2 * (k // 2) - k) // stride + 1
        ops = 2 * cin * cout * k * k * out * out
        fp32_s, int8_s = samples["fp32"].median, samples["int8"].median
        fp32_rate, int8_rate = ops / fp32_s / 1e9, ops / int8_s / 1e9
        print(f"{label:18} fp32 {fp32_rate:7.1f} GFLOPS ({100 * fp32_rate / (fp32_peak * ghz * cores):4.1f}% of peak)"
              f"  int8 {int8_rate:7.1f} GOPS ({100 * int8_rate / (int8_peak * ghz * cores):4.1f}% of peak)"
              f"  int8/fp32 time {int8_s / fp32_s:.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--per-channel", action="store_true", help="per-channel weight scales (default per tensor)")
    parser.add_argument("--reduce-range", action="store_true",
                        help="7-bit weights (onnxruntime's u8 x s8 AVX2 kernels then never saturate)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--skip-model", action="store_true", help="only the kernels")
    parser.add_argument("--skip-kernels", action="store_true", help="only the model")


def run(args: argparse.Namespace) -> int:
    if not args.skip_model:
        model_comparison(args)
    if not args.skip_kernels:
        kernel_comparison(args)
    return 0
