"""Kernels of a graph on channel-blocked layouts (`NCHW{b}c`): the blocked convolution families and the kernels
around them (pooling, layout transforms, concatenation), compiled and compared with the reference interpreter.

`nn.contrib_conv2d_NCHWc` on `NCHW{bi}c` x `OIHW{bi}i{bo}o` -> `NCHW{bo}c` is family `conv2d_nchwc`; grouped with
one channel per group (`OIHW1i{b}o`) it is `depthwise_conv2d_nchwc`. Every kernel runs its default config and a
few random configs of its space; fused epilogues (bias broadcast from `(C/b, 1, 1, b)`, ReLU / clip, a residual in
`NCHW{b}c`) are part of the compared outputs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.kernel.analysis import format_func
from relay_tune.testing.blocked_conv import ConvLayer, blocked_module, blocked_source, channel_block, parse_layer
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space.cpu import cpu_space

HOST = resolve_target("llvm -num-cores=2")
LANES = HOST.vector_lanes("float32")
Layer = ConvLayer


def anchor_task(mod: object) -> RelayTuneTask:
    return next(t for t in tasks_from_module(mod, HOST) if t.family != "injective")


def check_configs(task: RelayTuneTask, samples: int, seed: int = 0) -> None:
    """The default config and `samples` random configs of the task's space match the reference."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None
    configs = [task.default_config()] + [task.space.sample(rng) for _ in range(samples)]
    for config in configs:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
        np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4, err_msg=f"{task.description} {config}")


def check_configs_with(task: RelayTuneTask, config: object) -> None:
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
    got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
    np.testing.assert_allclose(got, task.reference(inputs)[0], rtol=1e-5, atol=1e-5, err_msg=str(config))


def blocked_task(layer: object, lanes: int = LANES) -> RelayTuneTask:
    mod = blocked_module(layer, lanes)
    assert mod is not None
    return anchor_task(mod)


CONVS = [  # cin, size, cout, kernel, stride, pad, epilogue
    (32, 14, 64, 3, 1, 1, ("bias", "relu")),
    (64, 7, 32, 3, 1, 1, ("bias", "relu")),              # 7 columns: four channel blocks per tile
    (32, 13, 48, 3, 1, 1, ("bias",)),                    # a prime width: balanced row pieces
    (48, 28, 32, 1, 1, 0, ("bias", "add", "relu")),      # residual add in NCHW16c
    (32, 28, 64, 1, 2, 0, ("bias",)),                    # stride-2 1x1
    (32, 14, 32, 3, 2, 1, ("bias", "relu")),             # stride-2 3x3
    (24, 14, 144, 1, 1, 0, ("bias", "clip")),            # input block 8, output block 16
    (144, 7, 24, 1, 1, 0, ("bias", "add")),              # input block 16, output block 8
    (3, 23, 32, 7, 2, 3, ("bias", "relu")),              # an image stem: NCHW3c x OIHW3i16o
]


@pytest.mark.parametrize(("cin", "size", "cout", "kernel", "stride", "pad", "epilogue"), CONVS)
def test_blocked_conv_matches_reference(cin: int, size: int, cout: int, kernel: int, stride: int, pad: int,
                                        epilogue: tuple[str, ...]) -> None:
    task = blocked_task(Layer(cin, size, size, cout, kernel, stride, pad, 1, epilogue))
    assert task.family == "conv2d_nchwc"
    check_configs(task, samples=2)


@pytest.mark.parametrize(("channels", "size", "stride", "epilogue"), [
    (32, 14, 1, ("bias", "clip")),
    (48, 13, 2, ("bias", "relu")),
    (24, 7, 1, ("bias",)),   # block 8
])
def test_blocked_depthwise_matches_reference(channels: int, size: int, stride: int,
                                             epilogue: tuple[str, ...]) -> None:
    task = blocked_task(Layer(channels, size, size, channels, 3, stride, 1, channels, epilogue))
    assert task.family == "depthwise_conv2d_nchwc"
    check_configs(task, samples=3)


@pytest.mark.slow
@pytest.mark.parametrize(("cin", "size", "cout", "kernel", "stride", "pad"), [
    (256, 14, 256, 3, 1, 1), (128, 28, 128, 3, 1, 1), (64, 56, 64, 3, 1, 1), (256, 56, 128, 1, 2, 0),
])
def test_blocked_conv_resnet_shapes(cin: int, size: int, cout: int, kernel: int, stride: int, pad: int) -> None:
    task = blocked_task(Layer(cin, size, size, cout, kernel, stride, pad, 1, ("bias", "relu")))
    check_configs(task, samples=4, seed=1)


def test_spaces_yield_only_valid_configs() -> None:
    """Samples of each blocked space pass its constraints, the default among them; every accumulator tile fits the
    vector registers."""
    layers = [Layer(32, 7, 64, 64, 3, 1, 1, 1, ("bias",)), Layer(64, 56, 56, 64, 1, 1, 0, 1, ()),
              Layer(32, 13, 13, 32, 3, 2, 1, 32, ("bias",))]
    budget = 32 - 4 if LANES == 16 else 16 - 4
    rng = np.random.default_rng(3)
    for layer in layers:
        task = blocked_task(layer)
        space = cpu_space(task.workload)
        assert space.is_valid(task.default_config())
        for _ in range(200):
            config = space.sample(rng)
            assert space.is_valid(config)
            rows = config["tile_cb"] if "tile_cb" in config else config["tile_h"]
            assert rows[-1] * config["tile_w"][-1] <= budget
            task.steps(config)  # the template accepts it


def test_reduction_reads_each_input_channel_without_division() -> None:
    """The input channel is two reduce axes (block, channel of a block): the accumulation indexes the input and the
    weight by the reduce loops themselves, none of them divided or taken modulo (the generic compute reads
    `x[rc // 16, ..., rc % 16]`)."""
    task = blocked_task(Layer(32, 14, 14, 32, 3, 1, 1, 1, ("bias", "relu")))
    text = format_func(task.lower(task.default_config()))
    accumulation = [line for line in text.splitlines() if ".local[" in line and "rci" in line]
    assert len(accumulation) == 1
    assert "[0, rcb, " in accumulation[0] and "rcb, rh, rw, rci, " in accumulation[0]
    assert not re.search(r"\b(rcb|rh|rw|rci)\b[^,\]]*(//|%)", accumulation[0]), accumulation[0]


def test_task_descriptions_parse_into_layers() -> None:
    layer = parse_layer("conv2d_nchw+bias+add+relu 1x64x56x56 * 256x64x1x1 s1 p0")
    assert layer == Layer(64, 56, 56, 256, 1, 1, 0, 1, ("bias", "add", "relu"))
    dw = parse_layer("conv2d_nchw+bias+clip 1x96x112x112 * 96x1x3x3 s2 p1 g96")
    assert dw is not None and dw.groups == 96
    assert channel_block(24, 16) == 8 and channel_block(3, 16) is None
    assert "NCHW3c" in blocked_source(Layer(3, 9, 9, 16, 3, 2, 1, 1, ()), 16)[0]


def _module(source: str) -> object:
    return infer_types(parse_module(source))


@pytest.mark.parametrize("pool", [
    "nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout=\"NCHW16c\")",
    "nn.avg_pool2d(%x, pool_size=[3, 3], strides=[1, 1], padding=[1, 1, 1, 1], layout=\"NCHW16c\")",
    "nn.global_avg_pool2d(%x, layout=\"NCHW16c\")",
])
def test_blocked_pooling_vectorizes_the_block(pool: str) -> None:
    mod = _module(f"#[version = \"0.0.5\"]\ndef @main(%x: Tensor[(1, 4, 13, 13, 16), float32]) {{\n  {pool}\n}}\n")
    task = next(iter(tasks_from_module(mod, HOST)))
    assert task.family == "reduction"
    default = task.default_config()
    assert default["vector"] == 16  # one vector along the block's channels
    check_configs(task, samples=2)
    if "pad" in default:
        # The guard is one condition per block: a strided window reads through it; a window sliding by one reads
        # every value nine times, so the padded copy is written ahead. The other choice still works.
        assert default["pad"] == ("root" if "strides=[1, 1]" in pool else "inline")
        root = default.replace(pad="root")
        assert "w in range(" in format_func(task.lower(root))  # written row by row, a vector per column
        other = default.replace(pad="inline" if default["pad"] == "root" else "root")
        rng = np.random.default_rng(1)
        inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(other))(*inputs)
        np.testing.assert_allclose(got, task.reference(inputs)[0], rtol=1e-5, atol=1e-5)


def test_a_layout_round_trip_is_a_memory_view_not_a_task() -> None:
    """NCHW -> NCHW16c -> NCHW fused into one function is the identity: the build aliases it, nothing to tune."""
    expr = ("layout_transform(layout_transform(%x, src_layout=\"NCHW\", dst_layout=\"NCHW16c\"), "
            "src_layout=\"NCHW16c\", dst_layout=\"NCHW\")")
    mod = _module(f"#[version = \"0.0.5\"]\ndef @main(%x: Tensor[(1, 32, 14, 14), float32]) {{\n  {expr}\n}}\n")
    assert tasks_from_module(mod, HOST) == []


@pytest.mark.parametrize("expr", [
    "layout_transform(%x, src_layout=\"NCHW\", dst_layout=\"NCHW16c\")",
    "layout_transform(nn.relu(layout_transform(%x, src_layout=\"NCHW\", dst_layout=\"NCHW16c\")), "
    "src_layout=\"NCHW16c\", dst_layout=\"NCHW\")",
])
def test_layout_transforms_match_reference(expr: str) -> None:
    mod = _module(f"#[version = \"0.0.5\"]\ndef @main(%x: Tensor[(1, 32, 14, 14), float32]) {{\n  {expr}\n}}\n")
    tasks = tasks_from_module(mod, HOST)
    assert tasks
    for task in tasks:
        blocked = len(task.func.ret_type.shape) == 5  # written in NCHW16c
        changes = blocked != (len(task.func.params[0].checked_type.shape) == 5)  # not both transforms in one kernel
        # every index affine in the vector (tests/test_layout_transform_kernels.py)
        assert (task.default_config()["mode"] == "transpose") == changes
        check_configs(task, samples=2)
        if blocked:  # the earlier default, a row's columns and blocks at once, with a row tail of 8 lanes
            check_configs_with(task, task.default_config().replace(mode="rows", vector=LANES // 2))


def test_blocked_concatenate_matches_reference() -> None:
    mod = _module("#[version = \"0.0.5\"]\ndef @main(%a: Tensor[(1, 2, 7, 7, 16), float32], "
                  "%b: Tensor[(1, 3, 7, 7, 16), float32]) {\n  concatenate((%a, %b), axis=1)\n}\n")
    (task,) = tasks_from_module(mod, HOST)
    assert task.default_config()["mode"] == "rows"  # 7 x 16 = 112 lanes per row: vectors of 64, a tail of 48
    check_configs(task, samples=2)


def test_generic_conv_keeps_other_layouts() -> None:
    """A blocked convolution whose data and kernel blocks differ stays on the generic path, and is correct."""
    source = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 4, 7, 7, 8), float32], %w: Tensor[(2, 2, 3, 3, 16, 16), float32]) {
  nn.contrib_conv2d_NCHWc(%x, %w, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3], data_layout="NCHW8c",
                          kernel_layout="OIHW16i16o", out_layout="NCHW16c")
}"""
    rng = np.random.default_rng(0)
    mod = infer_types(bind_params(_module(source), {"w": rng.standard_normal((2, 2, 3, 3, 16, 16))
                                                     .astype("float32")}))
    task = anchor_task(mod)
    assert task.family == "reduction"
    check_configs(task, samples=1)


def test_cost_model_features_of_blocked_families() -> None:
    """The loop-nest features describe the blocked templates (finite, and different configs differ), and transfer
    counts them as the convolution operators they are."""
    from cost_model.features import loop_nest_features
    from cost_model.transfer import operator_family

    for layer, operator in ((Layer(32, 14, 14, 64, 3, 1, 1, 1, ("bias", "relu")), "conv2d"),
                            (Layer(32, 14, 14, 32, 3, 1, 1, 32, ("bias",)), "depthwise_conv2d")):
        task = blocked_task(layer)
        assert operator_family(task) == operator
        rng = np.random.default_rng(4)
        configs = [task.default_config(), *(task.space.sample(rng) for _ in range(4))]
        vectors = [loop_nest_features(task.lower(c)) for c in configs]
        assert all(np.all(np.isfinite(v)) for v in vectors)
        assert len({v.tobytes() for v in vectors}) == len({str(c) for c in configs})


@pytest.mark.parametrize("layer", [Layer(32, 14, 14, 64, 3, 1, 1, 1, ("bias", "relu")),
                                   Layer(48, 13, 13, 48, 3, 2, 1, 48, ("bias",)),
                                   Layer(24, 28, 28, 40, 1, 1, 0, 1, ("bias", "add"))])
def test_avx2_blocks_of_eight(layer: object) -> None:
    """On an AVX2 target (8 lanes, 16 registers) blocks of 8: the defaults fit its registers and compute right."""
    avx2 = resolve_target("llvm -mcpu=haswell -num-cores=2")
    mod = blocked_module(layer, avx2.vector_lanes("float32"))
    task = next(t for t in tasks_from_module(mod, avx2) if t.family != "injective")
    config = task.default_config()
    rows = config["tile_cb"] if "tile_cb" in config else config["tile_h"]
    assert rows[-1] * config["tile_w"][-1] <= 16 - 4
    check_configs(task, samples=1)


def test_five_dimensional_bias_and_residual_epilogue() -> None:
    """A bias shaped `(1, C/b, 1, 1, b)` and a residual add, fused into the blocked convolution: the epilogue reads
    both along the block's lanes."""
    source = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 2, 9, 9, 16), float32], %w: Tensor[(3, 2, 3, 3, 16, 16), float32],
          %b: Tensor[(1, 3, 1, 1, 16), float32], %r: Tensor[(1, 3, 9, 9, 16), float32]) {
  nn.relu(add(add(nn.contrib_conv2d_NCHWc(%x, %w, padding=[1, 1, 1, 1], channels=48, kernel_size=[3, 3],
                                          data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c"),
                  %b), %r))
}"""
    rng = np.random.default_rng(6)
    mod = infer_types(bind_params(_module(source), {
        "w": (rng.standard_normal((3, 2, 3, 3, 16, 16)) * 0.1).astype("float32"),
        "b": rng.standard_normal((1, 3, 1, 1, 16)).astype("float32")}))
    task = anchor_task(mod)
    assert task.family == "conv2d_nchwc"
    lines = format_func(task.lower(task.default_config())).splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("relu["))
    assert "p2[0, " in lines[at] and "p3[0, " in lines[at]
    assert lines[at - 1].rstrip().endswith("in range(16) vectorized:")  # the block's lanes, one vector
    check_configs(task, samples=2)
