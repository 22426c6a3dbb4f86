"""Tuning tasks of single operators whose weight is a model constant: dense, conv2d, depthwise conv2d.

    task = dense(64, 48, 40)                       # a RelayTuneTask: the model tuner's own space and templates
    task = conv2d(1, 64, 56, 56, 64, 3, pad=1)     # the ResNet-50 3x3 convolution
    task.lower(task.default_config())              # the loop nest of the default schedule

They are one-operator Relay models tuned exactly as `relay-tune` tunes a model's task (`RelayTuneTask`, the
templates of `search_space.cpu`), for benchmarks and for tests of the cost model and the search on a known workload.
`task.workload_spec()` describes them, so transfer learning rebuilds them from a log.
"""

from __future__ import annotations

from relay_tune.compile import resolve_target
from relay_tune.ir import IRModule
from relay_tune.passes import layout_block, optimize
from relay_tune.passes.extract_tasks import extract_tasks
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask
from relay_tune.type_infer import infer_types

__all__ = ["conv2d", "dense", "dense_1024", "mobilenet_depthwise", "operator_task", "resnet50_conv3x3"]

DEFAULT_TARGET = "llvm -num-cores=1"


def operator_task(source: str, target: str = DEFAULT_TARGET, layout_planning: bool | None = None) -> RelayTuneTask:
    """The task of a Relay program holding one operator call `op(%x, %w)`, whose `%w` is a constant weight.

    Optimised like a model for `target` (`layout_planning` as in `relay_tune.build`): with planned layouts the
    program also transforms its input, weight and output, and the task is the operator's own (blocked) kernel,
    the one of most FLOPs."""
    layout = layout_block(resolve_target(target), layout_planning)
    fused = optimize(infer_types(parse_module(source)), opt_level=3, layout_block=layout)
    specs = extract_tasks(IRModule({"main": fused["main"]}))
    spec = max(specs, key=lambda s: s.flops)
    return RelayTuneTask(spec, target, constants=(1,))  # parameter 1 of the fused function: the weight


def dense(m: int, n: int, k: int, target: str = DEFAULT_TARGET) -> RelayTuneTask:
    """`nn.dense` of an (m, k) input by a constant (n, k) weight."""
    return operator_task(f"""#[version = "0.0.5"]
def @main(%x: Tensor[({m}, {k}), float32], %w: Tensor[({n}, {k}), float32]) {{
  nn.dense(%x, %w)
}}""", target)


def conv2d(batch: int, channels: int, height: int, width: int, filters: int, kernel: int, stride: int = 1,
           pad: int = 0, groups: int = 1, target: str = DEFAULT_TARGET,
           layout_planning: bool | None = None) -> RelayTuneTask:
    """NCHW `nn.conv2d` with a constant OIHW weight (`groups == channels == filters`: depthwise). With layout
    planning (`None`: the default) the task is the blocked convolution a planned model runs."""
    return operator_task(f"""#[version = "0.0.5"]
def @main(%x: Tensor[({batch}, {channels}, {height}, {width}), float32],
          %w: Tensor[({filters}, {channels // groups}, {kernel}, {kernel}), float32]) {{
  nn.conv2d(%x, %w, strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}], groups={groups},
            channels={filters}, kernel_size=[{kernel}, {kernel}])
}}""", target, layout_planning)


def dense_1024(target: str = DEFAULT_TARGET) -> RelayTuneTask:
    return dense(1024, 1024, 1024, target)


def resnet50_conv3x3(target: str = DEFAULT_TARGET) -> RelayTuneTask:
    """ResNet-50's first-stage 3x3 convolution: 1x64x56x56, 64 filters, pad 1."""
    return conv2d(1, 64, 56, 56, 64, 3, pad=1, target=target)


def mobilenet_depthwise(target: str = DEFAULT_TARGET) -> RelayTuneTask:
    """A MobileNet v2 depthwise 3x3 convolution: 1x144x56x56, pad 1."""
    return conv2d(1, 144, 56, 56, 144, 3, pad=1, groups=144, target=target)
