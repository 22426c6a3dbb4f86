"""Convolutions of ResNet-50 and MobileNet v2: today's NCHW kernel against the same layer on channel-blocked layouts.

    python experiments/bench_blocked_conv.py [--models resnet50 mobilenet_v2] [--rounds 5] [--only 56x56]

For every distinct convolution task of the model (`relay_tune.testing.zoo`, the tasks a build of the model runs,
with the epilogue fused into each: bias, ReLU / clip, residual add), two kernels are built with their default
configs and timed in interleaved rounds (NCHW, blocked, NCHW, blocked, ...) by the tuner's own runner
(process-isolated, every output checked against the numpy reference interpreter):

- **nchw**: the model's task itself, exactly the kernel an untuned build of the model runs now;
- **blocked**: the same layer as `nn.contrib_conv2d_NCHWc` on `NCHW{b}c` data with an `OIHW{b}i{b}o` weight (a
  constant, already packed, as a layout-planned graph holds it), bias `(C/b, 1, 1, b)`, the same activation and a
  residual in `NCHW{b}c`; depthwise layers as a grouped `nn.contrib_conv2d_NCHWc` with an `OIHW1i{b}o` weight.
  The block `b` is the target's float32 lanes where the channels divide by it, else the largest power of two that
  divides them (24 channels: 8); input and output blocks are chosen apart.

Each kernel is valued at the median of its rounds. Prints per layer both times and nchw / blocked (above 1: the
blocked kernel is faster), and per model the sum over the model's calls (each layer times how often it occurs).
An image stem's 3 input channels are one block (`NCHW3c` data, `OIHW3i{b}o` weight); layers whose channels no
other block divides are listed and skipped. Writes a CSV
to experiments/results/bench_blocked_conv.csv.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for entry in (REPO_ROOT, REPO_ROOT / "experiments"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import numpy as np  # noqa: E402
from timing import write_rows  # noqa: E402

RESULTS = REPO_ROOT / "experiments" / "results"
_CONV = re.compile(r"^conv2d_nchw\+?([+\w]*) 1x(\d+)x(\d+)x(\d+) \* (\d+)x(\d+)x(\d+)x(\d+) s(\d+) p(\d+)(?: g(\d+))?$")


@dataclass(frozen=True)
class ConvLayer:
    """One convolution as a task describes it (NCHW, batch 1, square stride and padding)."""

    cin: int
    height: int
    width: int
    cout: int
    kernel: int
    stride: int
    pad: int
    groups: int
    epilogue: tuple[str, ...]  # of "bias", "relu", "clip", "add", in order

    @property
    def name(self) -> str:
        kind = "dw" if self.groups > 1 else "conv"
        return (f"{kind} {self.cin}x{self.height}x{self.width} -> {self.cout} {self.kernel}x{self.kernel} "
                f"s{self.stride}{' +add' if 'add' in self.epilogue else ''}")


def parse_layer(description: str) -> ConvLayer | None:
    """The layer of a task description (`conv2d_nchw+bias+relu 1x64x56x56 * 64x64x3x3 s1 p1`), None when it is not
    a square 2-D convolution."""
    found = _CONV.match(description)
    if not found:
        return None
    epilogue, cin, h, w, cout, _ci, kh, kw, stride, pad, groups = found.groups()
    if kh != kw:
        return None
    return ConvLayer(int(cin), int(h), int(w), int(cout), int(kh), int(stride), int(pad), int(groups or 1),
                     tuple(e for e in epilogue.split("+") if e))


def channel_block(channels: int, lanes: int) -> int | None:
    """The block of a channel count: `lanes` when it divides them, else the largest power of two that does (4 at
    least: a smaller block leaves most of a vector empty); None when none does."""
    block = lanes
    while block >= 4:
        if channels % block == 0:
            return block
        block //= 2
    return None


def blocked_source(layer: ConvLayer, lanes: int) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """Relay text of the blocked form of `layer` and the shapes of its constants (weight, bias), or None when its
    channels have no block."""
    bi, bo = channel_block(layer.cin, lanes), channel_block(layer.cout, lanes)
    if bi is None and layer.groups == 1 and layer.cin < 4:
        bi = layer.cin  # an image's 3 channels: one block of all of them (`NCHW3c`), broadcast one at a time
    if bi is None or bo is None:
        return None
    depthwise = layer.groups > 1
    if depthwise:
        if layer.groups != layer.cin or layer.cin != layer.cout:
            return None
        bi = bo = min(bi, bo)
    k, s, p = layer.kernel, layer.stride, layer.pad
    oh = (layer.height + 2 * p - k) // s + 1
    ow = (layer.width + 2 * p - k) // s + 1
    if depthwise:
        weight = (layer.cout // bo, 1, k, k, 1, bo)
        kernel_layout = f"OIHW1i{bo}o"
    else:
        weight = (layer.cout // bo, layer.cin // bi, k, k, bi, bo)
        kernel_layout = f"OIHW{bi}i{bo}o"
    out_ty = f"Tensor[(1, {layer.cout // bo}, {oh}, {ow}, {bo}), float32]"
    params = [f"%x: Tensor[(1, {layer.cin // bi}, {layer.height}, {layer.width}, {bi}), float32]",
              f"%w: Tensor[{weight}, float32]"]
    constants: dict[str, tuple[int, ...]] = {"w": weight}
    expr = (f"nn.contrib_conv2d_NCHWc(%x, %w, strides=[{s}, {s}], padding=[{p}, {p}, {p}, {p}], "
            f"groups={layer.groups}, channels={layer.cout}, kernel_size=[{k}, {k}], data_layout=\"NCHW{bi}c\", "
            f"kernel_layout=\"{kernel_layout}\", out_layout=\"NCHW{bo}c\")")
    for step in layer.epilogue:
        if step == "bias":
            params.append(f"%b: Tensor[({layer.cout // bo}, 1, 1, {bo}), float32]")
            constants["b"] = (layer.cout // bo, 1, 1, bo)
            expr = f"add({expr}, %b)"
        elif step == "relu":
            expr = f"nn.relu({expr})"
        elif step == "clip":
            expr = f"clip({expr}, a_min=0f, a_max=6f)"
        elif step == "add":
            params.append(f"%r: {out_ty}")
            expr = f"add({expr}, %r)"
        else:
            return None
    source = f"#[version = \"0.0.5\"]\ndef @main({', '.join(params)}) -> {out_ty} {{\n  {expr}\n}}\n"
    return source, constants


def blocked_module(layer: ConvLayer, lanes: int, seed: int = 0) -> Any:
    """The type-checked blocked form of `layer` with seeded random constants at trained scale, or None."""
    from relay_tune.compile import bind_params
    from relay_tune.text import parse_module
    from relay_tune.type_infer import infer_types

    made = blocked_source(layer, lanes)
    if made is None:
        return None
    source, constants = made
    rng = np.random.default_rng(seed)
    fan_in = layer.kernel * layer.kernel * layer.cin // layer.groups
    values = {name: (rng.standard_normal(shape) * (np.sqrt(2.0 / fan_in) if name == "w" else 0.1))
              .astype("float32") for name, shape in constants.items()}
    return infer_types(bind_params(infer_types(parse_module(source)), values))


def _time(runner: Any, tasks: list[Any], artifacts: list[Any], rounds: int) -> list[float | None]:
    samples: list[list[float]] = [[] for _ in artifacts]
    for _ in range(rounds):
        for i, (task, artifact) in enumerate(zip(tasks, artifacts)):
            if artifact is None:
                continue
            result = runner.run(task, artifact)
            if result.error_kind is not None:
                print(f"  {task.description}: {result.error_kind} {result.error_msg[:200]}", flush=True)
            elif result.costs:
                samples[i].append(statistics.median(result.costs))
    return [statistics.median(s) if s else None for s in samples]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2"])
    parser.add_argument("--target", default="llvm", help="target (default: this machine)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per layer (default 5)")
    parser.add_argument("--only", default="", help="only layers whose name contains this")
    parser.add_argument("--csv", default=str(RESULTS / "bench_blocked_conv.csv"))
    args = parser.parse_args(argv)

    from relay_tune.compile import resolve_target
    from relay_tune.testing import zoo
    from relay_tune.tuning import InlineBuilder, LocalRunner
    from relay_tune.tuning.relay_task import tasks_from_module

    target = resolve_target(args.target)
    lanes = target.vector_lanes("float32")
    builder = InlineBuilder()
    runner = LocalRunner(number=1, repeat=3, min_repeat_ms=40.0)  # the tuner's runner settings
    rows: list[dict[str, Any]] = []
    print(f"target {target.log_name}, {lanes} float32 lanes; times in ms, ratio = nchw / blocked (>1: blocked "
          "faster)")
    try:
        for model in args.models:
            print(f"\n{model}\n{'layer':44} {'n':>2} {'family':22} {'nchw':>8} {'blocked':>8} {'ratio':>6}  block")
            for task in tasks_from_module(zoo.full(model), target):
                layer = parse_layer(task.description)
                if layer is None or (args.only and args.only not in layer.name):
                    continue
                mod = blocked_module(layer, lanes)
                if mod is None:
                    print(f"{layer.name:44} {task.weight:>2} skipped: no channel block divides its channels")
                    continue
                blocked = next(t for t in tasks_from_module(mod, target) if t.family != "injective")
                pair = [task, blocked]
                built = [builder.build(t, [t.default_config()])[0] for t in pair]
                artifacts = [b.artifact if b.error_kind is None else None for b in built]
                for t, b in zip(pair, built):
                    if b.error_kind is not None:
                        print(f"  {t.description}: build failed ({b.error_kind})")
                nchw_s, blocked_s = _time(runner, pair, artifacts, args.rounds)
                ratio = nchw_s / blocked_s if nchw_s and blocked_s else None
                config = blocked.default_config()
                block = "x".join(str(v[-1]) for k, v in config.items() if k in ("tile_cb", "tile_h", "tile_w"))
                rows.append({"model": model, "layer": layer.name, "weight": task.weight, "nchw_family": task.family,
                             "blocked_family": blocked.family, "nchw_ms": nchw_s and nchw_s * 1e3,
                             "blocked_ms": blocked_s and blocked_s * 1e3, "ratio": ratio,
                             "blocked_config": dict(config)})
                shown = "-" if ratio is None else f"{ratio:.2f}"
                print(f"{layer.name:44} {task.weight:>2} {task.family:22} {rows[-1]['nchw_ms'] or float('nan'):8.3f} "
                      f"{rows[-1]['blocked_ms'] or float('nan'):8.3f} {shown:>6}  {block}", flush=True)
            mine = [r for r in rows if r["model"] == model and r["ratio"]]
            if mine:
                nchw_total = sum(r["weight"] * r["nchw_ms"] for r in mine)
                blocked_total = sum(r["weight"] * r["blocked_ms"] for r in mine)
                wins = sum(r["ratio"] >= 0.97 for r in mine)
                print(f"{model}: sum over the model's calls: nchw {nchw_total:.2f} ms, blocked {blocked_total:.2f} ms, "
                      f"ratio {nchw_total / blocked_total:.2f}; blocked wins or ties (>= 0.97) on {wins} of "
                      f"{len(mine)} layers; geometric mean of ratios "
                      f"{float(np.exp(np.mean(np.log([r['ratio'] for r in mine])))):.2f}")
    finally:
        runner.close()
    if rows:
        write_rows(Path(args.csv), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
