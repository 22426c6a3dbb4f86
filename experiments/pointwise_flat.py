"""Flat mode of pointwise convolutions against the row and column modes, kernel by kernel.

    python experiments/pointwise_flat.py [--threads 2] [--rounds 5] [--shapes 512x13x1000,64x13x256]

For the 1x1 convolutions (with bias and relu, constant weights) on the narrow maps of SqueezeNet 1.1, ResNet-50 and
MobileNet v2: the default config (flat mode, `tile_p`) against the config the default rule gave before flat mode
existed (whole rows in one vector on maps narrower than a vector, column tiles otherwise), each compiled once and
timed by the tuner's runner in interleaved rounds; prints both medians and their ratio (> 1: flat is faster).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SHAPES = ("512x13x1000,512x13x64,64x13x256,384x13x64,48x13x192,256x13x48,32x27x128,256x27x32,"
          "1024x14x256,256x14x1024,576x14x96,2048x7x512,512x7x2048,960x7x160")


def task_of(cin: int, size: int, cout: int, target: object) -> object:
    from relay_tune.compile import bind_params
    from relay_tune.text import parse_module
    from relay_tune.tuning.relay_task import tasks_from_module
    from relay_tune.type_infer import infer_types

    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {size}, {size}), float32], %w: Tensor[({cout}, {cin}, 1, 1), float32],
          %b: Tensor[({cout}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, channels={cout}, kernel_size=[1, 1]), %b))
}}"""
    rng = np.random.default_rng(0)
    weights = {"w": (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype("float32"),
               "b": rng.standard_normal(cout).astype("float32")}
    mod = infer_types(bind_params(infer_types(parse_module(source)), weights))
    return next(t for t in tasks_from_module(mod, target) if t.family == "conv2d_nchw")


def previous_default(task: object) -> object:
    """The default rule's config before flat mode: the same rule on the workload without its pointwise fact (column
    tiles), with whole rows per vector (`row_vector`) where the rows are narrower than a vector."""
    from search_space.cpu import _closest_factor, _dividing_factor, _split_value, default_config, vector_registers

    workload = task.workload  # type: ignore[attr-defined]
    dims, lanes = workload.dims, workload.lanes
    config = default_config(dataclasses.replace(workload, pointwise=False))
    config = config.replace(row_vector=False, tile_p=(dims["h"] * dims["w"], 1))
    if dims["w"] >= lanes:
        return config
    space = task.space  # type: ignore[attr-defined]
    rows = max(r for r in range(1, dims["h"] + 1) if dims["h"] % r == 0 and (r == 1 or r * dims["w"] <= 4 * lanes))
    rows = _closest_factor(space.knob("tile_h"), rows)
    fc = _dividing_factor(space.knob("tile_c"), min(int(config["tile_c"][-1]), workload.accumulator_budget //
                                                    vector_registers(rows * dims["w"], lanes)))
    return config.replace(tile_c=_split_value(dims["c"], fc), tile_h=_split_value(dims["h"], rows),
                          tile_w=_split_value(dims["w"], dims["w"]), row_vector=True, pack_w=fc > 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", default=SHAPES, help="CinxSIZExCout,... (1x1 convolutions on SIZExSIZE maps)")
    args = parser.parse_args(argv)

    from relay_tune.compile import resolve_target
    from relay_tune.tuning import InlineBuilder, LocalRunner

    target = resolve_target(f"llvm -num-cores={args.threads}")
    builder, runner = InlineBuilder(), LocalRunner(number=5, repeat=3, min_repeat_ms=20)
    print(f"{'workload':<26} {'before us':>9} {'flat us':>8} {'ratio':>6}  flat config")
    ratios = []
    try:
        for text in args.shapes.split(","):
            cin, size, cout = (int(x) for x in text.lower().split("x"))
            task = task_of(cin, size, cout, target)
            configs = [previous_default(task), task.default_config()]
            artifacts = [builder.build(task, [c])[0].artifact for c in configs]
            times: list[list[float]] = [[], []]
            for _ in range(args.rounds):  # interleaved: the machine's drift hits both alike
                for i, artifact in enumerate(artifacts):
                    result = runner.run(task, artifact)
                    if result.costs is None:
                        raise SystemExit(f"{task.description}: {result.error_msg}")
                    times[i].append(statistics.median(result.costs))
            before, after = (statistics.median(t) for t in times)
            ratios.append(before / after)
            flat = configs[1]
            print(f"{cin}x{size}x{size}->{cout:<10} {before * 1e6:>9.1f} {after * 1e6:>8.1f} {before / after:>6.2f}  "
                  f"tile_c={flat['tile_c']} tile_p={flat['tile_p']}", flush=True)
    finally:
        runner.close()
    print(f"geometric mean ratio {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
