"""Where a dequantize runs: an int8 QDQ ResNet-50 whose projection shortcuts return uint8 (the dequantize in the
consumer's kernel, `PassConfig.dequantize_in_consumers`) against a checkout that returns their float32 result.

    python -m experiments dequantize-fusion --baseline-tree /work/main [--models PATH ...] [--rounds 5] [--repeat 3]
                                            [--threads 2]

Without `--models`, ResNet-50 with random weights (`relay_tune.testing.onnx_light`) is quantized by onnxruntime's
`quantize_static` (QDQ, uint8 activations, 7-bit int8 weights, `experiments.int8.quantize_model`) twice: as it is
(BatchNorm left between Q/DQ pairs) and after onnxruntime's `quant_pre_process`. For each model the script

1. builds it with this checkout (default options) and with the checkout in `--baseline-tree` (in a subprocess:
   `experiments.models.baseline_build`), and checks both outputs against onnxruntime's unoptimised QDQ session
   (the float semantics);
2. in each of `--rounds` rounds, alternating the two builds, takes each one's in-graph per-call profile
   (`CompiledModel.profile_calls`, median of `--repeat` runs) and then times both end to end
   (`experiments.timing.interleaved`);
3. prints the medians: end-to-end latency and total kernel time of each build, the summed time of the calls whose
   fused function differs, and, call by call where the two plans have the same calls, every call whose fused
   function differs or whose time changed by more than 10 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from experiments import UsageError
from experiments.timing import interleaved


def _default_models(folder: Path) -> list[Path]:
    """The light ResNet-50 quantized with 7-bit weights, without and with onnxruntime's pre-processing."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from experiments.int8 import quantize_model
    from relay_tune.testing.onnx_light import light_model

    model = light_model("resnet50")
    name = model.graph.input[0].name
    src = folder / "r50.onnx"
    onnx.save(model, str(src))
    plain, pre_src, pre = folder / "r50.int8.onnx", folder / "r50.pre.onnx", folder / "r50.pre.int8.onnx"
    quantize_model(src, plain, name, (1, 3, 224, 224), False, True)
    quant_pre_process(str(src), str(pre_src))
    quantize_model(pre_src, pre, name, (1, 3, 224, 224), False, True)
    return [plain, pre]


def _describe(model: Any) -> list[str]:
    return ["pack" if call.task < 0 else model.plan.tasks[call.task].description for call in model.plan.calls]


def compare(path: Path, args: argparse.Namespace) -> None:
    import onnx

    from experiments.int8 import ort_session
    from experiments.models import baseline_build, random_inputs
    from relay_tune import build
    from relay_tune.frontend import from_onnx

    quantized = onnx.load(str(path))
    feeds = random_inputs(quantized, 1)
    builds = {"ours": build(from_onnx(quantized)[0], "llvm"),
              "baseline": baseline_build(args.baseline_tree, quantized, args.threads)}
    exact = ort_session(path, args.threads, optimize=False).run(None, feeds)[0]
    for label, model in builds.items():
        print(f"{path.name} {label}: max |output - onnxruntime unoptimised QDQ| = "
              f"{np.abs(model.run(**feeds) - exact).max():.3g}")
    calls: dict[str, list[list[float]]] = {label: [] for label in builds}
    samples: dict[str, list[float]] = {label: [] for label in builds}
    for _ in range(args.rounds):
        for label, model in builds.items():
            calls[label].append(model.profile_calls(repeat=args.repeat, inputs=feeds))
        timed = interleaved({label: (lambda m=model: m.run(**feeds)) for label, model in builds.items()},
                            rounds=1, repeat=args.repeat, settle_s=0.2)
        for label, sample in timed.items():
            samples[label].extend(sample.seconds)
    per_call = {label: [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]
                for label, runs in calls.items()}
    for label in builds:
        print(f"{path.name} {label:8s}: end to end {1e3 * statistics.median(samples[label]):7.2f} ms, kernels "
              f"{1e3 * sum(per_call[label]):7.2f} ms ({len(per_call[label])} calls)")
    ours, base = statistics.median(samples["ours"]), statistics.median(samples["baseline"])
    print(f"{path.name}: ours / baseline end to end {ours / base:.3f}, kernels "
          f"{sum(per_call['ours']) / sum(per_call['baseline']):.3f}")
    names = {label: _describe(model) for label, model in builds.items()}
    if len(names["ours"]) != len(names["baseline"]):
        print(f"{path.name}: the plans differ in their calls; no call-by-call comparison")
        return
    moved = [i for i, name in enumerate(names["ours"]) if name != names["baseline"][i]]
    if moved:
        before, after = (sum(per_call[label][i] for i in moved) for label in ("baseline", "ours"))
        print(f"{path.name}: the {len(moved)} calls whose fused function differs: baseline {1e3 * before:.2f} ms, "
              f"ours {1e3 * after:.2f} ms ({after / before:.3f})")
        # A busy host slows whole profiles: the same round's ratio over the unchanged calls is the yardstick.
        same = [i for i in range(len(names["ours"])) if i not in set(moved)]

        def share(run: list[float], which: list[int]) -> float:
            return sum(run[i] for i in which)

        ratios = [(share(o, moved) / share(b, moved), share(o, same) / share(b, same))
                  for o, b in zip(calls["ours"], calls["baseline"])]
        print(f"{path.name}: per round, ours / baseline over the differing calls: median "
              f"{statistics.median(m for m, _ in ratios):.3f}; over the unchanged calls "
              f"{statistics.median(u for _, u in ratios):.3f}; the first over the second "
              f"{statistics.median(m / u for m, u in ratios):.3f} (quartiles "
              + " ".join(f"{q:.3f}" for q in statistics.quantiles([m / u for m, u in ratios], n=4)) + ")")
    print("   call  baseline ms   ours ms  ratio  fused function (ours; * differs from the baseline's)")
    for i, (a, b) in enumerate(zip(per_call["baseline"], per_call["ours"])):
        differs = names["ours"][i] != names["baseline"][i]
        if differs or abs(b / a - 1) > 0.1:
            print(f"  {i:5d}  {1e3 * a:10.3f}  {1e3 * b:8.3f}  {b / a:5.2f}  {'*' if differs else ' '}"
                  f"{names['ours'][i][:90]}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline-tree", type=Path, metavar="DIR", required=True,
                        help="a relay-tune checkout to compare with (for example the unchanged main branch)")
    parser.add_argument("--models", type=Path, nargs="+", metavar="PATH",
                        help="QDQ ONNX models (default: ResNet-50 quantized without and with pre-processing)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))


def run(args: argparse.Namespace) -> int:
    if not (args.baseline_tree / "relay_tune").is_dir():
        raise UsageError(f"--baseline-tree {args.baseline_tree} is not a relay-tune checkout")
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.models or _default_models(Path(tmp)):
            compare(path, args)
    return 0
