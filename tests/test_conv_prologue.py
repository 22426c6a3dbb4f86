"""Element-wise prologues of 1x1 blocked convolutions: `FuseOps` fuses a pre-activation (scale, shift, ReLU) that
only a 1x1 `nn.contrib_conv2d_NCHWc` reads into that convolution's group, and the `conv2d_nchwc` template computes
it one input row at a time; without a prologue, its default order puts rows first where the input outweighs the
weight. Kernels and whole models are compared with the reference interpreter on random non-zero inputs and odd
shapes; block sizes follow the host's vector lanes."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import Interpreter
from relay_tune.kernel.analysis import format_func
from relay_tune.passes import FuseOps, PassConfig, fused_groups
from relay_tune.testing.blocked_conv import ConvLayer, blocked_module, channel_block
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types

HOST = resolve_target("llvm -num-cores=2")
LANES = HOST.vector_lanes("float32")
PROLOGUE = ("multiply", "add", "nn.relu", "nn.contrib_conv2d_NCHWc")


def _block(channels: int) -> int:
    block = channel_block(channels, LANES)
    assert block is not None
    return block


def blocked_preactivation(cin: int, height: int, width: int, cout: int, kernel: int = 1, *,
                          extra_use: bool = False, seed: int = 0) -> object:
    """relu(x * s + t) into a blocked convolution (bias and ReLU after it), typed, with random constants; with
    `extra_use` the activated map is also an output."""
    bi, bo = _block(cin), _block(cout)
    pad = kernel // 2
    x_ty = f"Tensor[(1, {cin // bi}, {height}, {width}, {bi}), float32]"
    per_in = f"Tensor[({cin // bi}, 1, 1, {bi}), float32]"
    weight = (cout // bo, cin // bi, kernel, kernel, bi, bo)
    conv = (f"nn.contrib_conv2d_NCHWc(%0, %w, padding=[{pad}, {pad}, {pad}, {pad}], channels={cout}, "
            f"kernel_size=[{kernel}, {kernel}], data_layout=\"NCHW{bi}c\", kernel_layout=\"OIHW{bi}i{bo}o\", "
            f"out_layout=\"NCHW{bo}c\")")
    result = "(%2, %0)" if extra_use else "%2"
    source = f"""#[version = "0.0.5"]
def @main(%x: {x_ty}, %s: {per_in}, %t: {per_in}, %w: Tensor[{weight}, float32],
          %b: Tensor[({cout // bo}, 1, 1, {bo}), float32]) {{
  %0 = nn.relu(add(multiply(%x, %s), %t));
  %1 = {conv};
  %2 = nn.relu(add(%1, %b));
  {result}
}}
"""
    rng = np.random.default_rng(seed)
    values = {"s": rng.uniform(0.5, 1.5, (cin // bi, 1, 1, bi)), "t": rng.standard_normal((cin // bi, 1, 1, bi)),
              "w": rng.standard_normal(weight) * np.sqrt(2.0 / (cin * kernel * kernel)),
              "b": rng.standard_normal((cout // bo, 1, 1, bo)) * 0.1}
    params = {name: value.astype("float32") for name, value in values.items()}
    return infer_types(bind_params(infer_types(parse_module(source)), params))


def _groups(mod: object) -> list[tuple[str, ...]]:
    return fused_groups(FuseOps()(mod, PassConfig()))


def anchor_task(mod: object) -> RelayTuneTask:
    return next(t for t in tasks_from_module(mod, HOST) if t.family == "conv2d_nchwc")


def test_preactivation_joins_the_pointwise_convolution() -> None:
    groups = _groups(blocked_preactivation(40, 7, 9, 24))
    assert groups == [(*PROLOGUE, "add", "nn.relu")]


def test_preactivation_read_elsewhere_stays_its_own_kernel() -> None:
    groups = _groups(blocked_preactivation(40, 7, 9, 24, extra_use=True))
    assert ("multiply", "add", "nn.relu") in groups
    assert ("nn.contrib_conv2d_NCHWc", "add", "nn.relu") in groups


def test_preactivation_of_a_spatial_convolution_stays_its_own_kernel() -> None:
    groups = _groups(blocked_preactivation(40, 7, 9, 24, kernel=3))
    assert ("multiply", "add", "nn.relu") in groups


def test_a_convolutions_epilogue_does_not_become_the_next_ones_prologue() -> None:
    """conv -> bias -> relu -> 1x1 conv: two groups (a group holds one convolution)."""
    bi = _block(16)
    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 2, 5, 7, {bi}), float32], %w1: Tensor[(2, 2, 1, 1, {bi}, {bi}), float32],
          %w2: Tensor[(2, 2, 1, 1, {bi}, {bi}), float32], %b: Tensor[(2, 1, 1, {bi}), float32]) {{
  %0 = nn.contrib_conv2d_NCHWc(%x, %w1, channels={2 * bi}, kernel_size=[1, 1], data_layout="NCHW{bi}c",
                               kernel_layout="OIHW{bi}i{bi}o", out_layout="NCHW{bi}c");
  %1 = nn.relu(add(%0, %b));
  nn.contrib_conv2d_NCHWc(%1, %w2, channels={2 * bi}, kernel_size=[1, 1], data_layout="NCHW{bi}c",
                          kernel_layout="OIHW{bi}i{bi}o", out_layout="NCHW{bi}c")
}}
"""
    groups = _groups(infer_types(parse_module(source)))
    assert groups == [("nn.contrib_conv2d_NCHWc", "add", "nn.relu"), ("nn.contrib_conv2d_NCHWc",)]


@pytest.mark.parametrize(("cin", "height", "width", "cout"), [
    (40, 7, 9, 24),     # odd map, 5 input blocks of 8 (or 10 of 4)
    (24, 5, 13, 48),    # a prime width: the last column tile over-covers the row
    (64, 3, 3, 16),     # more input than output channels (DenseNet's bottleneck in small)
])
def test_fused_prologue_matches_reference(cin: int, height: int, width: int, cout: int) -> None:
    task = anchor_task(blocked_preactivation(cin, height, width, cout))
    assert task.description.startswith("multiply+bias+relu+contrib_conv2d_NCHWc")
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None and np.count_nonzero(expected[0]) > expected[0].size // 4
    configs = [task.default_config()] + [task.space.sample(rng) for _ in range(4)]
    for config in configs:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
        np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4, err_msg=f"{task.description} {config}")


def test_prologue_is_computed_one_row_at_a_time() -> None:
    """The activated row is written once per output row, outside the channel-block tiles, its block vectorized;
    the reduction reads that row, not the kernel input."""
    task = anchor_task(blocked_preactivation(40, 7, 9, 24))
    config = task.default_config()
    assert config["order"] == "hc" and config["parallel"] == 1
    text = format_func(task.lower(config))
    lines = text.splitlines()
    alloc = next(i for i, line in enumerate(lines) if "alloc relu:" in line)
    assert f"x{_block(40)}] local" in lines[alloc] and "x1x9x" in lines[alloc]  # one row, every channel
    assert "parallel" in lines[alloc - 1]
    prologue_loop = lines[alloc + 1: alloc + 5]
    assert any("vectorized" in line for line in prologue_loop)
    accumulation = [line for line in lines if ".local[" in line and "rci" in line and "+" in line]
    assert accumulation and all("relu[" in line and "p0[" not in line for line in accumulation)


def test_prologue_space_keeps_rows_outermost() -> None:
    task = anchor_task(blocked_preactivation(40, 7, 9, 24))
    rng = np.random.default_rng(3)
    for _ in range(20):
        config = task.space.sample(rng)
        assert config["order"] == "hc" and config["parallel"] in (0, 1)
        task.steps(config)


def _densenet_block(cin: int, growth: int, layers: int) -> tuple[str, dict[str, np.ndarray]]:
    """A small DenseNet block in NCHW: per layer BN-ReLU-Conv1x1 (4 * growth), BN-ReLU-Conv3x3 (growth), the
    result concatenated to the block's input; random batch-norm statistics."""
    rng = np.random.default_rng(11)
    params: dict[str, np.ndarray] = {}
    lines = []
    value, channels = "%x", cin
    for i in range(layers):
        for name, c in ((f"a{i}", channels), (f"c{i}", 4 * growth)):
            params[f"{name}g"] = rng.uniform(0.5, 1.5, c).astype("float32")
            params[f"{name}b"] = rng.standard_normal(c).astype("float32") * 0.2
            params[f"{name}m"] = rng.standard_normal(c).astype("float32") * 0.2
            params[f"{name}v"] = rng.uniform(0.5, 1.5, c).astype("float32")
        params[f"w1_{i}"] = (rng.standard_normal((4 * growth, channels, 1, 1)) / np.sqrt(channels)).astype("float32")
        params[f"w3_{i}"] = (rng.standard_normal((growth, 4 * growth, 3, 3)) / np.sqrt(36 * growth)).astype("float32")
        first = 7 * i  # the text format numbers the bindings of a function
        n, r, p, q, s, t, y = (f"%{first + k}" for k in range(7))
        lines += [
            f"{n} = nn.batch_norm({value}, %a{i}g, %a{i}b, %a{i}m, %a{i}v);",
            f"{r} = nn.relu({n}.0);",
            f"{p} = nn.conv2d({r}, %w1_{i}, channels={4 * growth}, kernel_size=[1, 1]);",
            f"{q} = nn.batch_norm({p}, %c{i}g, %c{i}b, %c{i}m, %c{i}v);",
            f"{s} = nn.relu({q}.0);",
            f"{t} = nn.conv2d({s}, %w3_{i}, padding=[1, 1, 1, 1], channels={growth}, kernel_size=[3, 3]);",
            f"{y} = concatenate(({value}, {t}), axis=1);",
        ]
        value, channels = y, channels + growth
    header = ", ".join(f"%{name}: Tensor[{tuple(v.shape)}, float32]".replace(",)", ")") for name, v in params.items())
    body = "\n  ".join(lines)
    source = (f"#[version = \"0.0.5\"]\ndef @main(%x: Tensor[(1, {cin}, 9, 11), float32], {header}) {{\n  {body}\n"
              f"  {value}\n}}\n")
    return source, params


def test_densenet_block_matches_reference() -> None:
    source, params = _densenet_block(cin=24, growth=8, layers=3)
    mod = relay_tune.bind_params(parse_module(source), params)
    model = relay_tune.build(mod, target=HOST)
    fused = [t.description for t in model.plan.tasks if t.description.startswith("multiply+bias+relu+contrib")]
    assert len(fused) >= 2, [t.description for t in model.plan.tasks]
    x = np.random.default_rng(5).standard_normal((1, 24, 9, 11)).astype("float32")
    expected = np.asarray(Interpreter(mod).run({"x": x}))
    np.testing.assert_allclose(model.run(x=x), expected, rtol=1e-4, atol=1e-4)


def _plain_pointwise(cin: int, height: int, width: int, cout: int) -> RelayTuneTask:
    mod = blocked_module(ConvLayer(cin, height, width, cout, 1, 1, 0, 1, ("bias", "relu")), LANES)
    return next(t for t in tasks_from_module(mod, HOST) if t.family == "conv2d_nchwc")


def test_default_runs_rows_first_where_the_input_outweighs_the_weight() -> None:
    """Without a prologue the default order follows the sizes: a large map with few output channels rows first, a
    7x7 map with many output channels blocks first; either way the kernel matches the reference."""
    wide = _plain_pointwise(96, 13, 15, 4 * LANES)  # 195 pixels > 4 blocks of output channels, in 2 tiles
    assert wide.default_config()["order"] == "hc"
    deep = _plain_pointwise(64, 3, 5, 128)  # 15 pixels < 128 output channels
    assert deep.default_config()["order"] == "ch"
    rng = np.random.default_rng(4)
    for task in (wide, deep):
        inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(task.default_config()))(*inputs)
        np.testing.assert_allclose(got, task.reference(inputs)[0], rtol=1e-4, atol=1e-4)
