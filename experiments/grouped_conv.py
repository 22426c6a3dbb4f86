"""Grouped convolutions on ShuffleNet v1 (the onnx package's light_shufflenet, random weights): relay-tune before
and after a change, onnxruntime and OpenVINO, timed in the same interleaved rounds.

    git worktree add /tmp/base main          # or: git archive main | tar -x -C /tmp/base
    python -m experiments grouped-conv --baseline-tree /tmp/base --rounds 9

"before" is built by the code in `--baseline-tree` (in a subprocess with that tree first on PYTHONPATH, saved as a
.rtmod file and loaded here); "after" by this checkout. Both use default schedules. Every engine's output is
checked against onnxruntime's; the table gives each engine's median latency, spread and ratio to onnxruntime and to
OpenVINO, then the ten slowest tasks of each relay-tune build (in-graph profile).

    python -m experiments grouped-conv --kernels

times single grouped 1x1 convolution kernels (+relu; ShuffleNet v1's shapes and two others), one core, interleaved:
the `group_conv2d_nchw` default config, the same with its weight packed by channel tile (`pack_w`), and the
`reduction` family's default (what grouped convolutions got before the family existed).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from experiments import UsageError
from experiments.models import (
    built_by_tree,
    first_output,
    matches,
    openvino_core,
    openvino_engine,
    ort_session,
    random_inputs,
)
from experiments.timing import interleaved

_BUILD_AND_SAVE = """
import sys
import relay_tune
from relay_tune.frontend import from_onnx
from relay_tune.target import Target
from relay_tune.testing.onnx_light import light_model
mod, _ = from_onnx(light_model("shufflenet"))
relay_tune.build(mod, target=Target.host(num_cores=int(sys.argv[1]))).save(sys.argv[2])
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline-tree", type=Path, help="a checkout of the code to compare with (\"before\")")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--repeat", type=int, default=3, help="timed inferences per engine and round (default 3)")
    parser.add_argument("--settle", type=float, default=0.2,
                        help="at most this many seconds to wait for an idle process before each engine's turn")
    parser.add_argument("--rtol", type=float, default=1e-3, help="largest error relative to the output's scale")
    parser.add_argument("--kernels", action="store_true", help="time single grouped convolution kernels instead")


KERNEL_SHAPES = ((272, 14, 4), (136, 28, 4), (544, 7, 4), (240, 28, 3), (384, 14, 8))
"""(channels in and out, map size, groups) of the kernels `--kernels` times."""


def kernels(rounds: int) -> int:
    """Time the grouped 1x1 convolutions of KERNEL_SHAPES under three configs (module docstring)."""
    import numpy as np

    from relay_tune.compile import bind_params
    from relay_tune.compile.primitive import build_primitive
    from relay_tune.kernel.compute import primitive_compute
    from relay_tune.text import parse_module
    from relay_tune.tuning.relay_task import tasks_from_module
    from relay_tune.type_infer import infer_types
    from search_space import Config
    from search_space.families import family_named

    rng = np.random.default_rng(0)
    good = True
    for channels, size, groups in KERNEL_SHAPES:
        source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {size}, {size}), float32],
          %w: Tensor[({channels}, {channels // groups}, 1, 1), float32]) {{
  nn.relu(nn.conv2d(%x, %w, groups={groups}, channels={channels}, kernel_size=[1, 1]))
}}"""
        weight = rng.standard_normal((channels, channels // groups, 1, 1)).astype("float32")
        mod = infer_types(bind_params(infer_types(parse_module(source)), {"w": weight}))
        task = tasks_from_module(mod, "llvm -num-cores=1", layout_planning=False)[0]
        inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
        want = task.reference(inputs)[0]
        default = task.default_config()
        configs = {"default": task.steps(default), "pack_w": task.steps(default.replace(pack_w=True)),
                   "reduction": family_named("reduction").steps(
                       primitive_compute(task.func), Config({"family": "reduction", "vector": 8, "parallel": 0}),
                       task.target_info)}
        built = {name: build_primitive(task.func, task.target_info, schedule_steps=steps)
                 for name, steps in configs.items()}
        for name, kernel in built.items():
            if not np.allclose(kernel(*inputs), want, rtol=1e-4, atol=1e-3):
                print(f"  {name}: output differs from the interpreter's")
                good = False
        engines = {name: functools.partial(kernel, *inputs) for name, kernel in built.items()}
        timed = interleaved(engines, rounds=rounds, repeat=10)
        base = timed["default"].median
        print(f"{task.description}: " + ", ".join(
            f"{name} {samples.median * 1e6:.0f} us ({samples.median / base:.2f}x)" for name, samples in timed.items()))
    return 0 if good else 1


def run(args: argparse.Namespace) -> int:
    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target
    from relay_tune.testing.onnx_light import light_model

    if args.kernels:
        return kernels(args.rounds)
    if args.baseline_tree is not None and not (args.baseline_tree / "relay_tune").is_dir():
        raise UsageError(f"--baseline-tree {args.baseline_tree} holds no relay_tune package")
    if args.threads < 1 or args.rounds < 1 or args.repeat < 1:
        raise UsageError("--threads, --rounds and --repeat must be at least 1")
    onnx_model = light_model("shufflenet")
    inputs = random_inputs(onnx_model, 0)
    session = ort_session(onnx_model, args.threads)
    want = first_output(session.run(None, inputs))
    engines: dict[str, Any] = {"onnxruntime": lambda: session.run(None, inputs)}
    builds: dict[str, Any] = {}
    if args.baseline_tree is not None:
        builds["before"] = built_by_tree(args.baseline_tree, _BUILD_AND_SAVE, [str(args.threads)])
    mod, _ = from_onnx(onnx_model)
    builds["after"] = relay_tune.build(mod, target=Target.host(num_cores=args.threads))
    engines.update(builds)
    if openvino_core() is not None:
        engines["openvino"] = functools.partial(openvino_engine(onnx_model, args.threads, "f32"), inputs)
    good = True
    for label, engine in engines.items():
        got = first_output(engine.run(**inputs) if label in builds else engine())
        ok, error = matches(got, want, args.rtol)
        good = good and ok
        print(f"{label:12s} output error relative to onnxruntime {error:.2e}{'' if ok else '  MISMATCH'}")
    timed = interleaved(engines, rounds=args.rounds, repeat=args.repeat, inputs=inputs, settle_s=args.settle)
    base = timed["onnxruntime"].median
    vino = timed["openvino"].median if "openvino" in timed else None
    print(f"\nlight_shufflenet, {args.threads} threads, {args.rounds} rounds x {args.repeat}")
    print(f"{'engine':12s} {'median ms':>10s} {'rel IQR':>8s} {'/ ort':>7s} {'/ openvino':>10s}")
    for label, samples in timed.items():
        ratio_vino = f"{samples.median / vino:10.2f}" if vino else f"{'-':>10s}"
        print(f"{label:12s} {samples.median * 1e3:10.2f} {samples.spread:8.2f} "
              f"{samples.median / base:7.2f} {ratio_vino}")
    if "before" in timed:
        print(f"after / before: {timed['after'].median / timed['before'].median:.2f}")
    for label, build in builds.items():
        print(f"\n{label}: slowest tasks (in-graph ms, calls)")
        for row in build.profile(repeat=5)[:10]:
            print(f"  {row.seconds * 1e3:7.3f} {row.calls:3d}  {row.description}")
    return 0 if good else 1
