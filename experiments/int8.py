"""An int8 (QDQ) ResNet-50 against our fp32 build and onnxruntime, and the int8 convolution kernels against the peak.

    python -m experiments int8 [--per-channel] [--no-preprocess] [--weights full reduced] [--baseline-tree DIR]
                               [--rounds 5] [--repeat 3] [--threads 2] [--skip-model] [--skip-kernels] [--verbose]
                               [--profile] [--without-pass NAME ...]

1. ResNet-50 with random weights (`relay_tune.testing.onnx_light`), prepared by onnxruntime's `quant_pre_process`
   (the quantization guide's first step: shape inference and its graph optimisations, which fold each BatchNorm into
   its convolution; `--no-preprocess` skips it, leaving each BatchNorm between two QuantizeLinear/DequantizeLinear
   pairs) and quantized by `quantize_static` (QDQ, uint8 activations, int8 weights, a calibration reader of a few
   random images) with full-range weights (its default) and with `reduce_range` (7-bit weights), by default both;
2. builds each with relay-tune (`QuantizedProducts` turns its convolutions into int8 products, `PlanLayouts` into
   the packed `nn.contrib_conv2d_NCHWc_int8` with the requantization fused) and the float model too, and times,
   interleaved in the same run (`experiments.timing`): relay-tune fp32; per weight range relay-tune's default
   build (every product on the integers where the target has an exact path: int16 pairs and vpmaddwd on AVX2 for
   full-range weights, see `relay_tune.passes.quantized_products`), the same build without the full-range path
   (`full_range_int8="float"`: float products where a weight's pairs do not fit int16) and onnxruntime int8; and
   onnxruntime fp32 (same threads, all optimisations); with `--baseline-tree DIR` also the default int8 builds of
   that checkout (built in a subprocess with it first on PYTHONPATH); prints the medians and the ratios the issue
   asks about (int8 speed-up over our fp32; our int8 against onnxruntime's int8), and how far our int8 output is from
   onnxruntime's unoptimised QDQ graph (exact float semantics) and from its optimised int8 kernels;
3. measures the per-core peaks of this CPU (`experiments.int8_peaks`: fp32 FMA, vpmaddwd, vpmaddubsw + vpmaddwd,
   vpdpbusd where VNNI exists), then builds ResNet-50's convolution shapes and a 2048 -> 1000 dense product as fp32
   and as int8 models (uint8 x int8 -> int32: the packed `conv2d_nchwc_int8` kernel, `int8` with weights in
   [-64, 64] whose pairs never saturate vpmaddubsw, `int8 full` with weights in [-127, 127], the target's exact
   path: int16 pairs and vpmaddwd on x86 without VNNI, vpdpbusd with it) and
   prints each product kernel's GOPS (its in-graph time from the profiler, the models alternating round by round)
   against the measured peak; with `--baseline-tree DIR` also the int8 kernels built by that checkout, and their
   time against ours.

`--profile` prints, per weight range, where the default int8 build's kernel time goes (and the baseline tree's
build's): in-graph time summed by each fused function's first operator, and the slowest tasks.

`--without-pass NAME` (repeatable) also builds,
in the same process, each int8 model with those graph passes skipped (e.g. `SimplifyRequantize`), times it
interleaved with the rest, and prints its latency and in-graph kernel time against the default build's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from experiments.timing import interleaved

# (name, in channels, out channels, kernel, stride, map size): ResNet-50's convolutions, one of each kind
CONV_SHAPES: tuple[tuple[str, int, int, int, int, int], ...] = (
    ("1x1 256->64 @56", 256, 64, 1, 1, 56),
    ("3x3 64->64 @56", 64, 64, 3, 1, 56),
    ("1x1 512->128 @28", 512, 128, 1, 1, 28),
    ("3x3 256->256 @14", 256, 256, 3, 1, 14),
    ("3x3 128->128 s2 @56", 128, 128, 3, 2, 56),
    ("1x1 1024->2048 s2 @14", 1024, 2048, 1, 2, 14),
)


def cpu_features() -> tuple[set[str], float]:
    """The CPU flags and clock (GHz, as /proc/cpuinfo reports it: the nominal clock on most VMs) from /proc/cpuinfo
    (empty and 0 elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set(), 0.0
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return set(flags.group(1).split()) if flags else set(), float(mhz.group(1)) / 1e3 if mhz else 0.0


def quantize_model(src: Path, dst: Path, input_name: str, shape: tuple[int, ...], per_channel: bool,
                   reduce_range: bool, preprocess: bool = False) -> None:
    """Quantize `src` into `dst` with onnxruntime's static QDQ quantizer; `preprocess` runs its `quant_pre_process`
    first (written beside `dst`)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    if preprocess:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        prepared = dst.with_name(dst.stem + ".prepared.onnx")
        quant_pre_process(str(src), str(prepared))
        src = prepared

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


RANGES = {"full": False, "reduced": True}
"""onnxruntime's weight ranges by name: `reduce_range` off (8-bit weights, its default) or on (7-bit)."""


@contextlib.contextmanager
def passes_skipped(names: list[str]) -> Iterator[None]:
    """Builds inside skip the graph passes `names` (each raised above every optimisation level for the while)."""
    from relay_tune.passes import get_pass

    with contextlib.ExitStack() as stack:
        for pass_name in names:
            stack.enter_context(mock.patch.object(type(get_pass(pass_name)), "opt_level", 1 << 20))
        yield


def _kernel_ms(model: Any, inputs: dict[str, Any], repeat: int) -> float:
    """A model's in-graph kernel time (`CompiledModel.profile`, median of `3 * repeat` runs per call), in ms."""
    return 1e3 * sum(row.seconds for row in model.profile(repeat=3 * repeat, inputs=inputs))


def model_comparison(args: argparse.Namespace) -> None:
    import onnx

    from relay_tune import build
    from relay_tune.frontend import from_onnx
    from relay_tune.testing.onnx_light import light_model

    model = light_model("resnet50")
    name = model.graph.input[0].name
    shape = (1, 3, 224, 224)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    feeds = {name: x}
    engines: dict[str, Any] = {}
    shares: list[str] = []
    ablated_models: dict[str, tuple[Any, Any]] = {}
    ablated = "without " + "+".join(args.without_pass) if args.without_pass else ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "r50.onnx"
        onnx.save(model, str(src))
        fp32 = build(from_onnx(model)[0], "llvm")
        engines["relay-tune fp32"] = lambda: fp32.run(**feeds)
        ort_fp32 = ort_session(src, args.threads)
        engines["onnxruntime fp32"] = lambda: ort_fp32.run(None, feeds)
        for weights in args.weights:
            dst = Path(tmp) / f"r50.int8.{weights}.onnx"
            quantize_model(src, dst, name, shape, args.per_channel, RANGES[weights], preprocess=args.preprocess)
            quantized = onnx.load(str(dst))
            qmodel = from_onnx(quantized)[0]
            int8 = build(qmodel, "llvm")  # the default build: the target's exact path for every product
            # the default without an exact full-range path: float products where a weight's pairs do not fit int16
            float_products = build(qmodel, "llvm", full_range_int8="float")
            ort_int8 = ort_session(dst, args.threads)
            ours, exact = int8.run(**feeds), ort_session(dst, args.threads, optimize=False).run(None, feeds)[0]
            theirs = ort_int8.run(None, feeds)[0]
            print(f"int8 {weights}-range output: max |ours - onnxruntime unoptimised QDQ| = "
                  f"{np.abs(ours - exact).max():.3g}, max |ours - onnxruntime int8| = "
                  f"{np.abs(ours - theirs).max():.3g}, max |onnxruntime int8 - unoptimised| = "
                  f"{np.abs(theirs - exact).max():.3g}")
            shares.append(f"{weights}: {_integer_share(int8)} "
                          f"(float-products build: {_integer_share(float_products)})")
            if args.profile:
                print_profile(f"int8 {weights}-range default build", int8, feeds, args.repeat)
            engines[f"relay-tune int8 {weights}"] = functools.partial(int8.run, **feeds)
            engines[f"relay-tune int8 {weights} float"] = functools.partial(float_products.run, **feeds)
            engines[f"onnxruntime int8 {weights}"] = functools.partial(ort_int8.run, None, feeds)
            if ablated:
                with passes_skipped(args.without_pass):
                    without = build(qmodel, "llvm", build_cache=False)
                ablated_models[weights] = (int8, without)
                engines[f"relay-tune int8 {weights} {ablated}"] = functools.partial(without.run, **feeds)
            if args.baseline_tree is not None:  # the default build of the unchanged code, in a subprocess
                from experiments.models import baseline_build

                before = baseline_build(args.baseline_tree, quantized, args.threads)
                if args.profile:
                    print_profile(f"int8 {weights}-range baseline tree's build", before, feeds, args.repeat)
                engines[f"relay-tune int8 {weights} baseline"] = functools.partial(before.run, **feeds)
    samples = interleaved(engines, rounds=args.rounds, repeat=args.repeat, settle_s=0.5)
    if ablated:
        print_ablation(ablated_models, ablated, feeds, args.repeat, args.rounds)
    width = max(len(engine) for engine in samples)
    for engine, sample in samples.items():
        print(f"{engine:{width}} {sample.describe()}")
    print(f"quantized {'after' if args.preprocess else 'without'} onnxruntime's quant_pre_process; int8 products: "
          + "; ".join(shares))
    med = {k: v.median for k, v in samples.items()}
    for weights in args.weights:
        ours = med[f"relay-tune int8 {weights}"]
        parts = [f"speed-up over our fp32 {med['relay-tune fp32'] / ours:.2f}x (target >= 1.6x)",
                 f"our int8 / onnxruntime int8 latency {ours / med[f'onnxruntime int8 {weights}']:.2f} (target <= 1.0)",
                 f"our int8 / float-products build {ours / med[f'relay-tune int8 {weights} float']:.2f}"]
        if args.baseline_tree is not None:
            parts.append(f"our int8 / baseline tree's build {ours / med[f'relay-tune int8 {weights} baseline']:.2f}")
        if ablated:
            parts.append(f"our int8 / build {ablated} {ours / med[f'relay-tune int8 {weights} {ablated}']:.2f}")
        parts.append(f"onnxruntime int8 speed-up over its fp32 "
                     f"{med['onnxruntime fp32'] / med[f'onnxruntime int8 {weights}']:.2f}x")
        print(f"{weights}-range weights: " + "; ".join(parts))


def print_ablation(models: dict[str, tuple[Any, Any]], ablated: str, inputs: dict[str, Any], repeat: int,
                   rounds: int, top: int = 6) -> None:
    """In-graph kernel time (`CompiledModel.profile_calls`) of each default int8 build and of the same build
    `ablated`, profiled alternately `rounds` times: the medians of the totals and, where both plans make the same
    number of calls, the `top` calls whose medians moved most."""
    for weights, (default, without) in models.items():
        runs: dict[str, list[list[float]]] = {"default": [], ablated: []}
        for _ in range(rounds):
            runs["default"].append(default.profile_calls(3 * repeat, inputs))
            runs[ablated].append(without.profile_calls(3 * repeat, inputs))
        ours = statistics.median(1e3 * sum(run) for run in runs["default"])
        theirs = statistics.median(1e3 * sum(run) for run in runs[ablated])
        print(f"int8 {weights}-range in-graph kernel time (median of {rounds}): default build {ours:.2f} ms "
              f"({len(default.plan.calls)} calls), {ablated} {theirs:.2f} ms ({len(without.plan.calls)} calls): "
              f"ratio {ours / theirs:.3f}")
        if len(default.plan.calls) != len(without.plan.calls):
            continue
        per_call = [(1e3 * float(np.median(a)), 1e3 * float(np.median(b)), call)
                    for a, b, call in zip(np.array(runs["default"]).T, np.array(runs[ablated]).T, default.plan.calls)]
        per_call.sort(key=lambda row: row[0] - row[1])
        for mine, other, call in per_call[:top]:
            described = "pack" if call.task < 0 else default.plan.tasks[call.task].description
            print(f"    {other:7.3f} -> {mine:7.3f} ms  {described[:100]}")


def print_profile(title: str, model: Any, inputs: dict[str, Any], repeat: int, top: int = 10) -> None:
    """Where a model's time goes: in-graph kernel time (`CompiledModel.profile`, median of `3 * repeat` runs) summed
    by the first operator of each fused function, and its `top` slowest tasks."""
    rows = model.profile(repeat=3 * repeat, inputs=inputs)
    total = sum(r.seconds for r in rows)
    kinds: dict[str, list[float]] = {}
    for row in rows:
        kind = kinds.setdefault(row.description.split("+")[0].split(" ")[0], [0.0, 0])
        kind[0] += row.seconds
        kind[1] += row.calls
    ranked = sorted(kinds.items(), key=lambda item: -item[1][0])
    print(f"{title}: {1e3 * total:.2f} ms of kernels; by first operator: "
          + "; ".join(f"{kind} {100 * s / total:.1f}% ({int(n)} calls)" for kind, (s, n) in ranked))
    for row in rows[:top]:
        print(f"    {100 * row.seconds / total:5.1f}%  {1e3 * row.seconds:7.3f} ms  {row.calls:2d} calls  "
              f"{row.description[:100]}")


def _integer_share(model: Any) -> str:
    """How many of a model's kernels are the packed int8 convolution, of its product kernels."""
    names = [task.description for task in model.plan.tasks]
    products = [n for n in names if "conv" in n or "dense" in n or "matmul" in n]
    packed = [n for n in products if "NCHWc_int8" in n]
    return f"{len(packed)} of {len(products)} product kernels packed int8"


def _conv_module(cin: int, cout: int, k: int, stride: int, size: int, int8: bool,
                 weight_limit: int = 128) -> tuple[Any, dict[str, Any]]:
    """One NCHW convolution: uint8 x int8 -> int32 (weights in (-weight_limit, weight_limit)) or fp32."""
    from relay_tune.text import parse_module

    rng = np.random.default_rng(0)
    if int8:
        weight = rng.integers(1 - weight_limit, weight_limit, (cout, cin, k, k)).astype(np.int8)
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


def _dense_module(k: int, n: int, int8: bool) -> tuple[Any, dict[str, Any]]:
    """One dense product of a row: uint8 x int8 -> int32 (weights in [-64, 64]) or fp32."""
    from relay_tune.text import parse_module

    rng = np.random.default_rng(0)
    if int8:
        weight = rng.integers(-64, 65, (n, k)).astype(np.int8)
        x: np.ndarray = rng.integers(0, 256, (1, k)).astype(np.uint8)
        dtypes, extra = ("uint8", "int32"), ', out_dtype="int32"'
    else:
        weight, x = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((1, k)).astype(np.float32)
        dtypes, extra = ("float32", "float32"), ""
    text = f'''#[version = "0.0.5"]
def @main(%x: Tensor[(1, {k}), {dtypes[0]}]) -> Tensor[(1, {n}), {dtypes[1]}] {{
  nn.dense(%x, meta[relay.Constant][0], units={n}{extra})
}}'''
    return parse_module(text, constants=[weight]), {"x": x}


_BASELINE_KERNEL = """
import json, sys, relay_tune
import experiments.int8 as int8
spec = json.loads(sys.argv[1])
mod, _ = getattr(int8, spec["maker"])(*spec["args"], **spec["kwargs"])
relay_tune.build(mod, "llvm").save(sys.argv[2])
"""
"""Builds one product module of `kernel_comparison` with another checkout's code (`models.built_by_tree`)."""

_LAYOUT_OPS = ("layout_transform", "pad", "strided_slice", "reshape")


def _anchor_seconds(model: Any, inputs: dict[str, Any], repeat: int) -> tuple[float, str]:
    """In-graph seconds of the model's product kernels (a Winograd convolution's transforms and batched product
    included; the layout transforms of the model's input and output left out: in a network they are rare) and
    their descriptions."""
    rows = [r for r in model.profile(repeat=repeat, inputs=inputs)
            if r.description.split("+")[0].split(" ")[0] not in _LAYOUT_OPS]
    return sum(r.seconds for r in rows), "; ".join(r.description for r in rows)


def kernel_comparison(args: argparse.Namespace) -> None:
    """Peaks of this CPU, then each product shape as an fp32 and as an int8 kernel (in-graph kernel times from the
    profiler, the engines alternating round by round)."""
    from experiments.int8_peaks import measure_peaks
    from relay_tune import build

    flags, ghz = cpu_features()
    cores = args.threads
    print(f"CPU: {ghz:.2f} GHz (reported), {cores} threads, VNNI: "
          f"{sorted(flags & {'avx_vnni', 'avx512_vnni'}) or 'none'}; per-core peaks measured "
          f"(`experiments.int8_peaks`, best of 5 loops, ops/cycle at the reported clock):")
    peaks = {p.name: p for p in measure_peaks(ghz)}
    for p in peaks.values():
        print(f"  {p.name:18} {p.gops:7.1f} GOPS/core  {p.ops_per_cycle:5.1f} ops/cycle")
    int8_name = "vpdpbusd" if "vpdpbusd" in peaks else "pmaddubsw+pmaddwd"
    int8_peak, fp32_peak = peaks[int8_name].gops * cores, peaks["fma"].gops * cores
    print(f"  int8 / fp32 peak: {int8_peak / fp32_peak:.2f}x ({int8_name} against fma); "
          f"{cores}-thread peaks {int8_peak:.0f} GOPS int8, {fp32_peak:.0f} GFLOPS fp32")
    # (label, builder of the module, its positional arguments, operations)
    shapes: list[tuple[str, str, tuple[int, ...], int]] = []
    for label, cin, cout, k, stride, size in CONV_SHAPES:
        out = (size + 2 * (k // 2) - k) // stride + 1
        shapes.append((label, "_conv_module", (cin, cout, k, stride, size), 2 * cin * cout * k * k * out * out))
    shapes.append(("dense 2048->1000", "_dense_module", (2048, 1000), 2 * 2048 * 1000))
    builders = {"_conv_module": _conv_module, "_dense_module": _dense_module}
    for label, maker, shape_args, ops in shapes:
        engines: dict[str, tuple[Any, dict[str, Any]]] = {}
        for kind in ("fp32", "int8", "int8 full"):
            if kind == "int8 full" and maker == "_dense_module":
                continue
            int8 = kind != "fp32"
            kwargs = {"weight_limit": 65} if kind == "int8" and maker == "_conv_module" else {}
            mod, inputs = builders[maker](*shape_args, int8, **kwargs)
            engines[kind] = (build(mod, "llvm"), inputs)
            if args.baseline_tree is not None and int8:  # the same kernel built by the unchanged code
                from experiments.models import built_by_tree

                spec = json.dumps({"maker": maker, "args": [*shape_args, int8], "kwargs": kwargs})
                engines[f"{kind} baseline"] = (built_by_tree(args.baseline_tree, _BASELINE_KERNEL, [spec]), inputs)
        times: dict[str, list[float]] = {kind: [] for kind in engines}
        described: dict[str, str] = {}
        for _ in range(args.rounds):
            for kind, (model, inputs) in engines.items():
                seconds, described[kind] = _anchor_seconds(model, inputs, args.repeat)
                times[kind].append(seconds)
        med = {kind: statistics.median(v) for kind, v in times.items()}
        rate = {kind: ops / seconds / 1e9 for kind, seconds in med.items()}
        peak = {kind: fp32_peak if kind == "fp32" else int8_peak for kind in med}
        parts = [f"{kind} {rate[kind]:6.1f} GOPS ({100 * rate[kind] / peak[kind]:4.1f}%)" for kind in med]
        parts.append(f"fp32/int8 time {med['fp32'] / med['int8']:.2f}x")
        parts += [f"{kind}/ours time {med[kind] / med[kind.removesuffix(' baseline')]:.2f}x"
                  for kind in med if kind.endswith(" baseline")]
        print(f"{label:18} " + "  ".join(parts))
        if args.verbose:
            for kind, text in described.items():
                print(f"    {kind}: {text}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--per-channel", action="store_true", help="per-channel weight scales (default per tensor)")
    parser.add_argument("--no-preprocess", dest="preprocess", action="store_false",
                        help="quantize the model as it is, without onnxruntime's quant_pre_process (its BatchNorms "
                             "then stay float between QuantizeLinear/DequantizeLinear pairs)")
    parser.add_argument("--weights", nargs="+", choices=list(RANGES), default=list(RANGES),
                        help="weight ranges of the quantized models timed (default both): full (8-bit, onnxruntime's "
                             "default) and reduced (`reduce_range`: 7-bit, its u8 x s8 AVX2 kernels never saturate)")
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR",
                        help="also time the default int8 builds of another checkout (e.g. /work/main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--skip-model", action="store_true", help="only the kernels")
    parser.add_argument("--skip-kernels", action="store_true", help="only the model")
    parser.add_argument("--verbose", action="store_true", help="name the kernels timed")
    parser.add_argument("--without-pass", nargs="+", default=[], metavar="NAME",
                        help="also time each int8 build with these graph passes skipped (e.g. SimplifyRequantize)")
    parser.add_argument("--profile", action="store_true",
                        help="print where the default int8 builds' time goes (in-graph kernel times by operator)")


def run(args: argparse.Namespace) -> int:
    if not args.skip_model:
        model_comparison(args)
    if not args.skip_kernels:
        kernel_comparison(args)
    return 0
