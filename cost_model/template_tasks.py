"""Schedule-template tuning tasks: dense, conv2d and depthwise conv2d over tensor expressions.

A `TemplateTask` is a self-contained `TuneTask`: its tensor expressions, a search space of schedule knobs, and a
template that turns a config into schedule steps (split/reorder/cache_write/compute_at/unroll/vectorize/parallel,
weight packing), in the style of AutoTVM's x86 templates. `lower(config)` gives the loop nest without compiling
(what the cost model featurizes); `build(config)` compiles it with the LLVM back end into a `BuildArtifact`.

They exist so that the cost model and its search can be exercised and measured on real kernels independently of
model-level task extraction. `TemplateTask.from_spec(task.workload_spec())` rebuilds an equal task, which is how
tuning logs of these tasks are re-lowered for transfer learning.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from relay_tune.kernel import te, tir
from relay_tune.kernel.lower import lower
from relay_tune.kernel.schedule import LayoutTransform, Schedule
from relay_tune.tuning.task import BuildArtifact, KernelArg, LayoutStep, TensorSpec
from search_space import BoolKnob, ChoiceKnob, Config, Constraint, Space, SplitKnob

TemplateKind = Literal["dense", "conv2d", "depthwise_conv2d"]
TEMPLATE_KINDS: tuple[str, ...] = ("dense", "conv2d", "depthwise_conv2d")
SPEC_KIND = "schedule_template"

# Limits that keep every config of a space compilable in well under a second: fully unrolled register tiles
# beyond these sizes only produce huge code that spills.
MAX_UNROLLED_ROWS = 32
MAX_VECTOR_COLUMNS = 128
MAX_ACCUMULATOR_ELEMENTS = 2048
MAX_UNROLLED_BODY = 512


def _inner(value: Any) -> int:
    assert isinstance(value, tuple)
    return int(value[-1])


def _middle(value: Any) -> int:
    assert isinstance(value, tuple) and len(value) == 3
    return int(value[1])


# ---------------------------------------------------------------------------------------------------------------
# Constraints (module-level functions: spaces travel to worker processes)
# ---------------------------------------------------------------------------------------------------------------


def dense_tile_fits(config: Config) -> bool:
    rows, cols, ku = _inner(config["tile_i"]), _inner(config["tile_j"]), _inner(config["tile_k"])
    if rows > MAX_UNROLLED_ROWS or cols > MAX_VECTOR_COLUMNS or rows * cols > MAX_ACCUMULATOR_ELEMENTS:
        return False
    unrolled = (rows if config["unroll_rows"] else 1) * (ku if config["unroll_k"] else 1)
    return unrolled <= MAX_UNROLLED_BODY and ku <= 64


def conv_tile_fits(config: Config) -> bool:
    fi, yi, xi = _inner(config["tile_f"]), _inner(config["tile_y"]), _inner(config["tile_x"])
    if fi > MAX_UNROLLED_ROWS or xi > MAX_VECTOR_COLUMNS or fi * yi * xi > MAX_ACCUMULATOR_ELEMENTS:
        return False
    return fi * yi <= MAX_UNROLLED_BODY


def depthwise_tile_fits(config: Config) -> bool:
    ci, yi, xi = _inner(config["tile_c"]), _inner(config["tile_y"]), _inner(config["tile_x"])
    if xi > MAX_VECTOR_COLUMNS or ci * yi * xi > MAX_ACCUMULATOR_ELEMENTS:
        return False
    return ci * yi <= MAX_UNROLLED_BODY


# ---------------------------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class TemplateTask:
    """One schedule-template workload (see the module docstring).

    shape: dense `(M, N, K)` (C = A @ W^T, W stored `N x K` as in `nn.dense`); conv2d
    `(N, C, H, W, F, KH, KW, pad, stride)` (NCHW, OIHW weights); depthwise_conv2d `(N, C, H, W, KH, KW, pad,
    stride)` (weights `C x 1 x KH x KW`). `num_cores` > 1 adds a `parallel` knob and compiles parallel loops.
    """

    kind: TemplateKind
    shape: tuple[int, ...]
    num_cores: int = 1
    weight: int = 1
    key: str = field(init=False)
    target: str = field(init=False)
    description: str = field(init=False)
    flops: float = field(init=False)
    space: Space = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in TEMPLATE_KINDS:
            raise ValueError(f"unknown template kind {self.kind!r}; expected one of {TEMPLATE_KINDS}")
        self.shape = tuple(int(s) for s in self.shape)
        expected = {"dense": 3, "conv2d": 9, "depthwise_conv2d": 8}[self.kind]
        if len(self.shape) != expected:
            raise ValueError(f"{self.kind} takes {expected} shape numbers, got {self.shape}")
        text = json.dumps(self.workload_spec(), sort_keys=True)
        self.key = f"{self.kind}-" + hashlib.sha256(text.encode()).hexdigest()[:16]
        self.target = _short_target(self.num_cores)
        self.description, self.flops, self.space = _DEFINITIONS[self.kind](self)

    # -- identity ------------------------------------------------------------------------------------------------

    def workload_spec(self) -> dict[str, Any]:
        """JSON-able description from which `from_spec` rebuilds an equal task."""
        return {"kind": SPEC_KIND, "template": self.kind, "shape": list(self.shape), "num_cores": self.num_cores}

    @staticmethod
    def from_spec(spec: dict[str, Any]) -> TemplateTask:
        if spec.get("kind") != SPEC_KIND:
            raise ValueError(f"not a schedule-template workload: {spec!r}")
        return TemplateTask(spec["template"], tuple(spec["shape"]), int(spec.get("num_cores", 1)))

    # -- tensor expressions and schedules -----------------------------------------------------------------------

    def tensors(self) -> tuple[list[te.Tensor], te.Tensor]:
        """(input placeholders in logical order, output tensor); fresh objects on every call."""
        if self.kind == "dense":
            m, n, k_ = self.shape
            a = te.placeholder((m, k_), "float32", "A")
            w = te.placeholder((n, k_), "float32", "W")
            k = te.reduce_axis(k_, "k")
            c = te.compute((m, n), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), "C")
            return [a, w], c
        if self.kind == "conv2d":
            batch, chans, height, width, filters, kh, kw, pad, stride = self.shape
            data = te.placeholder((batch, chans, height, width), "float32", "data")
            weight = te.placeholder((filters, chans, kh, kw), "float32", "weight")
            padded = _pad(data, pad)
            oh, ow = _out_size(height, kh, pad, stride), _out_size(width, kw, pad, stride)
            rc, ry, rx = te.reduce_axis(chans, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
            conv = te.compute(
                (batch, filters, oh, ow),
                lambda n, f, y, x: te.sum(
                    padded[n, rc, y * stride + ry, x * stride + rx] * weight[f, rc, ry, rx], axis=[rc, ry, rx]
                ),
                "conv",
            )
            return [data, weight], conv
        batch, chans, height, width, kh, kw, pad, stride = self.shape
        data = te.placeholder((batch, chans, height, width), "float32", "data")
        weight = te.placeholder((chans, 1, kh, kw), "float32", "weight")
        padded = _pad(data, pad)
        oh, ow = _out_size(height, kh, pad, stride), _out_size(width, kw, pad, stride)
        ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
        conv = te.compute(
            (batch, chans, oh, ow),
            lambda n, c, y, x: te.sum(
                padded[n, c, y * stride + ry, x * stride + rx] * weight[c, 0, ry, rx], axis=[ry, rx]
            ),
            "dwconv",
        )
        return [data, weight], conv

    def schedule(self, config: Config) -> Schedule:
        """The template applied to `config` (the config is validated against the space first)."""
        self.space.validate(config)
        inputs, out = self.tensors()
        return _TEMPLATES[self.kind](self, config, inputs, out)

    def lower(self, config: Config) -> tir.PrimFunc:
        """The loop nest of `config`, without compiling it."""
        return lower(self.schedule(config), self.kernel_name)

    @property
    def kernel_name(self) -> str:
        return self.kind

    # -- the TuneTask protocol ----------------------------------------------------------------------------------

    def default_config(self) -> Config:
        return _DEFAULTS[self.kind](self)

    def input_specs(self) -> Sequence[TensorSpec]:
        inputs, _ = self.tensors()
        return tuple(TensorSpec(t.shape, t.dtype) for t in inputs)

    def reference(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        if self.kind == "dense":
            a, w = (x.astype(np.float64) for x in inputs)
            return ((a @ w.T).astype(np.float32),)
        if self.kind == "conv2d":
            *_, pad, stride = self.shape
            return (_conv_reference(inputs[0], inputs[1], pad, stride, depthwise=False),)
        *_, pad, stride = self.shape
        return (_conv_reference(inputs[0], inputs[1], pad, stride, depthwise=True),)

    def build(self, config: Config) -> BuildArtifact:
        from relay_tune.codegen.llvm import compile_object, required_libraries
        from relay_tune.runtime.kernel import REPEAT_SUFFIX
        from relay_tune.target import Target

        func = self.lower(config)
        target = Target.host(self.num_cores)
        code = compile_object([func], target)
        return BuildArtifact(
            code, "elf-object", func.name, self.kernel_args(func),
            requires_libraries=required_libraries([func], target), repeat_symbol=func.name + REPEAT_SUFFIX,
        )

    def kernel_args(self, func: tir.PrimFunc) -> tuple[KernelArg, ...]:
        """Map the kernel's parameters to logical inputs (packed ones with their layout steps) and the output."""
        inputs, out = self.tensors()
        index_of = {t.name: i for i, t in enumerate(inputs)}
        packed: dict[str, LayoutTransform] = {lt.packed: lt for lt in dict(func.attrs).get("layout_transforms", ())}
        args: list[KernelArg] = []
        for param in func.params:
            spec = TensorSpec(param.shape, param.dtype)
            if param.name in index_of:
                args.append(KernelArg(spec, "input", index_of[param.name]))
            elif param.name in packed:
                lt = packed[param.name]
                args.append(KernelArg(spec, "input", index_of[lt.source], _packing_steps(lt)))
            elif param.name == out.name:
                args.append(KernelArg(spec, "output", 0))
            else:
                raise ValueError(f"kernel parameter {param.name!r} is neither an input nor the output")
        return tuple(args)


def _short_target(num_cores: int) -> str:
    """A short, stable target string for these tasks' records (the full host string lists every feature)."""
    import llvmlite.binding as llvm

    return f"llvm -mcpu={llvm.get_host_cpu_name()} -num-cores={num_cores}"


def _packing_steps(lt: LayoutTransform) -> tuple[LayoutStep, ...]:
    """The numpy steps of `LayoutTransform.pack`, so the runner packs the weight ahead of timing."""
    pads: list[tuple[int, int]] = []
    split_shape: list[int] = []
    axis_names: list[str] = []
    factors = {t: f for t, f in lt.tokens if f is not None}
    for letter, dim in zip(lt.src_layout, lt.src_shape):
        sub = factors.get(letter.lower())
        if sub is None:
            pads.append((0, 0))
            split_shape.append(dim)
            axis_names.append(letter)
        else:
            outer = -(-dim // sub)
            pads.append((0, outer * sub - dim))
            split_shape += [outer, sub]
            axis_names += [letter, letter.lower()]
    order = tuple(axis_names.index(t) for t, _ in lt.tokens)
    steps = [LayoutStep("pad", tuple(pads))] if any(p for _, p in pads) else []
    steps += [LayoutStep("reshape", tuple(split_shape)), LayoutStep("transpose", order)]
    return tuple(steps)


def _out_size(size: int, kernel: int, pad: int, stride: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _pad(data: te.Tensor, pad: int) -> te.Tensor:
    batch, chans, height, width = data.shape
    if pad == 0:
        return data
    return te.compute(
        (batch, chans, height + 2 * pad, width + 2 * pad),
        lambda n, c, y, x: te.if_then_else(
            te.all_of(y >= pad, y < height + pad, x >= pad, x < width + pad), data[n, c, y - pad, x - pad], 0.0
        ),
        "pad",
    )


def _conv_reference(data: np.ndarray, weight: np.ndarray, pad: int, stride: int, depthwise: bool) -> np.ndarray:
    d = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = weight.astype(np.float64)
    n, _, h, wd = d.shape
    f, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, f, oh, ow))
    for ry in range(kh):
        for rx in range(kw):
            patch = d[:, :, ry : ry + stride * oh : stride, rx : rx + stride * ow : stride]
            if depthwise:
                out += patch * w[None, :, 0, ry, rx, None, None]
            else:
                out += np.einsum("nchw,fc->nfhw", patch, w[:, :, ry, rx])
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Spaces and defaults
# ---------------------------------------------------------------------------------------------------------------


def _parallel_knob(task: TemplateTask) -> list[ChoiceKnob]:
    # On one core a parallel loop is just a loop: the knob would only add indistinguishable configs.
    return [ChoiceKnob("parallel", ["outer", "fused"])] if task.num_cores > 1 else []


def _define_dense(task: TemplateTask) -> tuple[str, float, Space]:
    m, n, k = task.shape
    space = Space(
        [
            SplitKnob("tile_i", m, 3),
            SplitKnob("tile_j", n, 3),
            SplitKnob("tile_k", k, 2),
            ChoiceKnob("order", ["i_outer", "j_outer"]),
            BoolKnob("pack_weight"),
            BoolKnob("unroll_k"),
            BoolKnob("unroll_rows"),
            *_parallel_knob(task),
        ],
        [Constraint("register_tile_fits", dense_tile_fits)],
    )
    return f"dense {m}x{k} @ ({n}x{k})^T float32", 2.0 * m * n * k, space


def _define_conv2d(task: TemplateTask) -> tuple[str, float, Space]:
    batch, chans, height, width, filters, kh, kw, pad, stride = task.shape
    oh, ow = _out_size(height, kh, pad, stride), _out_size(width, kw, pad, stride)
    space = Space(
        [
            SplitKnob("tile_f", filters, 3),
            SplitKnob("tile_y", oh, 2),
            SplitKnob("tile_x", ow, 2),
            SplitKnob("tile_rc", chans, 2),
            ChoiceKnob("reduce_order", ["rc_outer", "kernel_outer", "rc_inner"]),
            ChoiceKnob("pad", ["inline", "at_tile"]),
            BoolKnob("unroll_kw"),
            *_parallel_knob(task),
        ],
        [Constraint("register_tile_fits", conv_tile_fits)],
    )
    desc = f"conv2d {batch}x{chans}x{height}x{width} * {filters}x{chans}x{kh}x{kw} pad {pad} stride {stride} float32"
    return desc, 2.0 * batch * filters * oh * ow * chans * kh * kw, space


def _define_depthwise(task: TemplateTask) -> tuple[str, float, Space]:
    batch, chans, height, width, kh, kw, pad, stride = task.shape
    oh, ow = _out_size(height, kh, pad, stride), _out_size(width, kw, pad, stride)
    space = Space(
        [
            SplitKnob("tile_c", chans, 2),
            SplitKnob("tile_y", oh, 2),
            SplitKnob("tile_x", ow, 2),
            ChoiceKnob("order", ["c_outer", "y_outer"]),
            ChoiceKnob("pad", ["inline", "at_tile"]),
            BoolKnob("cache_accumulator"),
            BoolKnob("unroll_kernel"),
            *_parallel_knob(task),
        ],
        [Constraint("register_tile_fits", depthwise_tile_fits)],
    )
    desc = f"depthwise conv2d {batch}x{chans}x{height}x{width} * {chans}x1x{kh}x{kw} pad {pad} stride {stride} float32"
    return desc, 2.0 * batch * chans * oh * ow * kh * kw, space


def _split_value(extent: int, *inner: int) -> tuple[int, ...]:
    """A split knob value whose inner factors are `inner`, clamped to the extent (largest fitting power of 2)."""
    fitted: list[int] = []
    product = 1
    for f in inner:
        while f > 1 and product * f > extent:
            f //= 2
        fitted.append(f)
        product *= f
    return (-(-extent // product), *fitted)


def _default_dense(task: TemplateTask) -> Config:
    m, n, k = task.shape
    values: dict[str, Any] = {
        "tile_i": _split_value(m, 1, 4), "tile_j": _split_value(n, 1, 16), "tile_k": _split_value(k, 1),
        "order": "i_outer", "pack_weight": False, "unroll_k": False, "unroll_rows": True,
    }
    if task.num_cores > 1:
        values["parallel"] = "outer"
    return Config(values)


def _default_conv2d(task: TemplateTask) -> Config:
    _, chans, height, width, filters, kh, kw, pad, stride = task.shape
    oh, ow = _out_size(height, kh, pad, stride), _out_size(width, kw, pad, stride)
    values: dict[str, Any] = {
        "tile_f": _split_value(filters, 1, 4), "tile_y": _split_value(oh, 1), "tile_x": _split_value(ow, 8),
        "tile_rc": _split_value(chans, 1), "reduce_order": "rc_outer", "pad": "inline", "unroll_kw": False,
    }
    if task.num_cores > 1:
        values["parallel"] = "outer"
    return Config(values)


def _default_depthwise(task: TemplateTask) -> Config:
    _, chans, height, width, kh, kw, pad, stride = task.shape
    oh, ow = _out_size(height, kh, pad, stride), _out_size(width, kw, pad, stride)
    values: dict[str, Any] = {
        "tile_c": _split_value(chans, 1), "tile_y": _split_value(oh, 1), "tile_x": _split_value(ow, 8),
        "order": "c_outer", "pad": "inline", "cache_accumulator": False, "unroll_kernel": False,
    }
    if task.num_cores > 1:
        values["parallel"] = "outer"
    return Config(values)


# ---------------------------------------------------------------------------------------------------------------
# Templates: config -> schedule
# ---------------------------------------------------------------------------------------------------------------


def _annotate_inner(s: Schedule, stage: str, loop: str, extent: int, how: str) -> None:
    """Unroll/vectorize a loop when it has more than one iteration (extent-1 loops disappear in lowering)."""
    if extent > 1:
        s.unroll(stage, loop) if how == "unroll" else s.vectorize(stage, loop)


def _parallelize(s: Schedule, stage: str, config: Config, outer: Sequence[str]) -> None:
    """Mark the outermost tile loop (or the first two fused) parallel, on multi-core targets."""
    if "parallel" not in config:
        return
    if config["parallel"] == "fused" and len(outer) >= 2:
        s.parallel(stage, s.fuse(stage, outer[0], outer[1]))
    else:
        s.parallel(stage, outer[0])


def _dense_template(task: TemplateTask, config: Config, inputs: list[te.Tensor], out: te.Tensor) -> Schedule:
    _, w = inputs
    tile_i, tile_j, tile_k = config["tile_i"], config["tile_j"], config["tile_k"]
    rows, cols, ku = _inner(tile_i), _inner(tile_j), _inner(tile_k)
    s = Schedule(out)
    if config["pack_weight"] and cols > 1:
        s.transform_layout(w, "NK", f"NK{cols}n")  # panels of `cols` columns: unit-stride vector loads
    acc = s.cache_write(out, "local")
    io, im, ii = s.split(out, "i", factors=(None, _middle(tile_i), rows))
    jo, jm, ji = s.split(out, "j", factors=(None, _middle(tile_j), cols))
    outer = [io, jo, im, jm] if config["order"] == "i_outer" else [jo, io, jm, im]
    s.reorder(out, *outer, ii, ji)
    _annotate_inner(s, out.name, ji, cols, "vectorize")
    # The accumulator tile lives at the innermost tile loop; fusing for parallelism must not move that loop.
    s.compute_at(acc, out, outer[-1])
    _parallelize(s, out.name, config, outer[:2])
    ko, ki = s.split(acc, "k", factor=ku)
    s.reorder(acc, ko, ki, "i", "j")
    if config["unroll_k"]:
        _annotate_inner(s, acc, ki, ku, "unroll")
    if config["unroll_rows"]:
        _annotate_inner(s, acc, "i", rows, "unroll")
    _annotate_inner(s, acc, "j", cols, "vectorize")
    return s


def _conv2d_template(task: TemplateTask, config: Config, inputs: list[te.Tensor], out: te.Tensor) -> Schedule:
    tile_f, tile_y, tile_x, tile_rc = config["tile_f"], config["tile_y"], config["tile_x"], config["tile_rc"]
    fi, yi, xi, rci = _inner(tile_f), _inner(tile_y), _inner(tile_x), _inner(tile_rc)
    s = Schedule(out)
    padded = _padded_stage(s)
    acc = s.cache_write(out, "local")
    fo, fm, fin = s.split(out, "f", factors=(None, _middle(tile_f), fi))
    yo, yin = s.split(out, "y", factor=yi)
    xo, xin = s.split(out, "x", factor=xi)
    outer = ["n", fo, yo, fm, xo]
    s.reorder(out, *outer, fin, yin, xin)
    _annotate_inner(s, out.name, xin, xi, "vectorize")
    s.compute_at(acc, out, xo)
    rco, rcin = s.split(acc, "rc", factor=rci)
    order = config["reduce_order"]
    if order == "rc_outer":
        reduce = [rco, rcin, "ry", "rx"]
    elif order == "kernel_outer":
        reduce = ["ry", "rx", rco, rcin]
    else:
        reduce = [rco, "ry", "rx", rcin]
    s.reorder(acc, *reduce, "n", "f", "y", "x")
    if config["unroll_kw"]:
        _annotate_inner(s, acc, "rx", task.shape[6], "unroll")
    _annotate_inner(s, acc, "f", fi, "unroll")
    _annotate_inner(s, acc, "x", xi, "vectorize")
    _place_padding(s, padded, out.name, xo, str(config["pad"]))
    _parallelize(s, out.name, config, [fo, yo])
    return s


def _depthwise_template(task: TemplateTask, config: Config, inputs: list[te.Tensor], out: te.Tensor) -> Schedule:
    tile_c, tile_y, tile_x = config["tile_c"], config["tile_y"], config["tile_x"]
    ci, yi, xi = _inner(tile_c), _inner(tile_y), _inner(tile_x)
    s = Schedule(out)
    padded = _padded_stage(s)
    acc = s.cache_write(out, "local") if config["cache_accumulator"] else None
    co, cin = s.split(out, "c", factor=ci)
    yo, yin = s.split(out, "y", factor=yi)
    xo, xin = s.split(out, "x", factor=xi)
    outer = ["n", co, yo, xo] if config["order"] == "c_outer" else ["n", yo, co, xo]
    inner = [cin, yin, xin]
    if acc is None:
        s.reorder(out, *outer, *inner, "ry", "rx")
        if config["unroll_kernel"]:
            _annotate_inner(s, out.name, "ry", task.shape[4], "unroll")
            _annotate_inner(s, out.name, "rx", task.shape[5], "unroll")
        # The reduction loops sit innermost here, so only the accumulator variant can vectorize x.
    else:
        s.reorder(out, *outer, *inner)
        _annotate_inner(s, out.name, xin, xi, "vectorize")
        s.compute_at(acc, out, xo)
        s.reorder(acc, "ry", "rx", "n", "c", "y", "x")
        if config["unroll_kernel"]:
            _annotate_inner(s, acc, "ry", task.shape[4], "unroll")
            _annotate_inner(s, acc, "rx", task.shape[5], "unroll")
        _annotate_inner(s, acc, "x", xi, "vectorize")
    _place_padding(s, padded, out.name, xo, str(config["pad"]))
    _parallelize(s, out.name, config, [outer[1], outer[2]])
    return s


def _padded_stage(s: Schedule) -> str | None:
    return "pad" if "pad" in s.stages else None


def _place_padding(s: Schedule, padded: str | None, consumer: str, loop: str, how: str) -> None:
    if padded is None:
        return
    if how == "inline":
        s.compute_inline(padded)
    else:
        s.compute_at(padded, consumer, loop)  # pad only the window one output tile reads


_DEFINITIONS = {"dense": _define_dense, "conv2d": _define_conv2d, "depthwise_conv2d": _define_depthwise}
_DEFAULTS = {"dense": _default_dense, "conv2d": _default_conv2d, "depthwise_conv2d": _default_depthwise}
_TEMPLATES = {"dense": _dense_template, "conv2d": _conv2d_template, "depthwise_conv2d": _depthwise_template}


@functools.cache
def resnet50_conv3x3() -> TemplateTask:
    """A ResNet-50 stage-1 3x3 convolution: 1x64x56x56 * 64x64x3x3, pad 1."""
    return TemplateTask("conv2d", (1, 64, 56, 56, 64, 3, 3, 1, 1))


@functools.cache
def mobilenet_depthwise() -> TemplateTask:
    """A MobileNet-v2 depthwise 3x3 convolution: 1x144x56x56, pad 1."""
    return TemplateTask("depthwise_conv2d", (1, 144, 56, 56, 3, 3, 1, 1))


@functools.cache
def dense_1024() -> TemplateTask:
    return TemplateTask("dense", (1024, 1024, 1024))


__all__ = [
    "SPEC_KIND",
    "TEMPLATE_KINDS",
    "TemplateTask",
    "dense_1024",
    "mobilenet_depthwise",
    "resnet50_conv3x3",
]
