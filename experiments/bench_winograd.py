"""ResNet-50's 3x3 stride-1 convolutions: the direct blocked convolution against Winograd F(2x2, 3x3) and F(4x4, 3x3).

    python experiments/bench_winograd.py [--rounds 7] [--layers 64x56 128x28 256x14 512x7] [--modes off f2 f4]

Each layer is a model of one `conv2d(3x3, stride 1, padding 1) + bias + ReLU` on a 1xCxHxH input (He-initialised
weight, as trained), built with layout planning and default schedules three ways (`winograd="off"`: the direct
`nn.contrib_conv2d_NCHWc`; "f2", "f4": input transform, batched product, output transform with the bias and ReLU
fused). Every build's output is checked against the numpy reference interpreter (the largest error relative to
the output's scale is printed). The models are timed in interleaved rounds (off, f2, f4, off, f2, f4, ...) by the
executor's in-graph profile, summing the convolution's kernels only (the layout transforms at the model's input
and output are the same in every build and are left out); each build is valued at the median of its rounds.
Prints per layer the time of each build and direct / winograd (above 1: Winograd is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

import relay_tune  # noqa: E402
from relay_tune.interpreter import Interpreter  # noqa: E402
from relay_tune.ir import Call, Function, IRModule, TensorType, Var, const, op  # noqa: E402
from relay_tune.op.registry import get_op  # noqa: E402

LAYERS = ("64x56", "128x28", "256x14", "512x7")


def _call(name: str, *args: object, **attrs: object) -> Call:
    return Call(op(name), tuple(args), get_op(name).make_attrs(attrs))  # type: ignore[arg-type]


def conv_layer(channels: int, size: int, seed: int = 0) -> IRModule:
    """conv2d 3x3 s1 p1 (C -> C) + bias + ReLU on 1xCxSxS, weights at a trained scale."""
    rng = np.random.default_rng(seed)
    x = Var("x", TensorType((1, channels, size, size), "float32"))
    w = (rng.standard_normal((channels, channels, 3, 3)) * np.sqrt(2.0 / (9 * channels))).astype(np.float32)
    b = (rng.standard_normal(channels) * 0.1).astype(np.float32)
    conv = _call("nn.conv2d", x, const(w), padding=(1, 1), kernel_size=(3, 3), channels=channels)
    return IRModule({"main": Function((x,), _call("nn.relu", _call("nn.bias_add", conv, const(b))))})


def conv_seconds(model: relay_tune.CompiledModel, inputs: dict[str, np.ndarray]) -> float:
    """Seconds of one run spent in the model's kernels other than layout transforms (in-graph profile)."""
    per_call = model.profile_calls(repeat=5, inputs=inputs)
    total = 0.0
    for call, seconds in zip(model.plan.calls, per_call):
        info = model.plan.tasks[call.task] if 0 <= call.task < len(model.plan.tasks) else None
        if info is not None and "layout_transform" not in info.description:
            total += seconds
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), help="CxS: channels x map size")
    parser.add_argument("--modes", nargs="+", default=["off", "f2", "f4"], choices=["off", "f2", "f4"])
    args = parser.parse_args(argv)
    print(f"{'layer':>9}  " + "  ".join(f"{m + ' ms':>9}" for m in args.modes) + "  "
          + "  ".join(f"{'off/' + m:>7}" for m in args.modes if m != "off") + "  max error / scale")
    for layer in args.layers:
        channels, size = (int(v) for v in layer.split("x"))
        mod = conv_layer(channels, size)
        inputs = {"x": np.random.default_rng(1).standard_normal((1, channels, size, size)).astype(np.float32)}
        expected = np.asarray(Interpreter(mod).run(inputs))
        models = {}
        errors = []
        for mode in args.modes:
            model = relay_tune.build(mod, target="llvm", winograd=mode)
            got = model.run(**inputs)
            errors.append(float(np.abs(got - expected).max() / np.abs(expected).max()))
            models[mode] = model
        times: dict[str, list[float]] = {m: [] for m in args.modes}
        for _ in range(args.rounds):
            for mode in args.modes:
                times[mode].append(conv_seconds(models[mode], inputs))
        med = {m: statistics.median(t) for m, t in times.items()}
        ratios = [med["off"] / med[m] for m in args.modes if m != "off"] if "off" in med else []
        print(f"{layer:>9}  " + "  ".join(f"{med[m] * 1e3:9.3f}" for m in args.modes) + "  "
              + "  ".join(f"{r:7.2f}" for r in ratios) + "  " + " ".join(f"{e:.1e}" for e in errors), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
