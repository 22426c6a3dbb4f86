"""The layer kinds of the classic CNNs (AlexNet, ZFNet, Inception v1) where relay-tune's default kernels were behind
OpenVINO's (LRN, padded pools, grouped convolutions on blocked layouts): each computed form against the numpy
reference on odd shapes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Function, IRModule, TensorType, Var, op
from relay_tune.kernel.compute import primitive_compute
from relay_tune.op.registry import get_op
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types


def check_op(name: str, shape: tuple[int, ...], attrs: dict[str, Any], seed: int = 0, rtol: float = 1e-5) -> None:
    """`name` on one random non-zero input of `shape`, its default kernel against the reference interpreter."""
    x = Var("x", TensorType(shape, "float32"))
    mod = infer_types(IRModule({"main": Function((x,), Call(op(name), (x,), get_op(name).make_attrs(attrs)))}))
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal(shape) * 3).astype(np.float32)
    want = evaluate(mod, [data])
    got = build_primitive(mod["main"].with_attrs(Primitive=1))(data)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


# beta 0.75 and 0.5 (square roots), 1 (a division), 0.6 (exp and log), bias 0 (the general power).
@pytest.mark.parametrize("beta, bias", [(0.75, 1.0), (0.75, 2.0), (0.5, 1.5), (1.0, 0.7), (0.6, 1.0), (0.75, 0.0)])
def test_lrn_powers_match_the_reference(beta: float, bias: float) -> None:
    check_op("nn.lrn", (1, 11, 5, 13), {"size": 5, "alpha": 0.3, "beta": beta, "bias": bias})


def test_lrn_even_window_and_last_axis() -> None:
    check_op("nn.lrn", (2, 3, 7, 9), {"size": 4, "axis": 3, "alpha": 0.2, "beta": 0.75, "bias": 1.0})


# Padded pools: the padding stage's row test is a branch, its column test a mask (codegen's guard split).
@pytest.mark.parametrize("name, shape, attrs", [
    ("nn.max_pool2d", (1, 13, 9, 11), {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1, 1, 1)}),
    ("nn.max_pool2d", (2, 5, 17, 19), {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}),
    ("nn.max_pool2d", (1, 7, 13, 13), {"pool_size": (3, 3), "strides": (2, 2), "padding": (0, 0, 1, 1),
                                       "ceil_mode": True}),
    ("nn.max_pool2d", (1, 3, 10, 21), {"pool_size": (2, 3), "strides": (1, 1), "padding": (1, 2, 0, 1)}),
    ("nn.avg_pool2d", (1, 9, 11, 7), {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1, 1, 1),
                                      "count_include_pad": True}),
    ("nn.avg_pool2d", (1, 9, 11, 7), {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}),
    # channel-blocked (Inception v1's pools inside its modules): a padded copy at stride 1, a guard at stride 2
    ("nn.max_pool2d", (1, 3, 13, 11, 8), {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1, 1, 1),
                                          "layout": "NCHW8c"}),
    ("nn.max_pool2d", (1, 2, 15, 9, 4), {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1),
                                         "layout": "NCHW4c"}),
    ("nn.avg_pool2d", (1, 3, 7, 5, 8), {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1, 1, 1),
                                        "layout": "NCHW8c"}),
])
def test_padded_windows_match_the_reference(name: str, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    check_op(name, shape, attrs)


def check_blocked_grouped_conv(channels: tuple[int, int], groups: int, block: int, size: tuple[int, int],
                               kernel: int, stride: int, pad: int) -> None:
    """A grouped `nn.contrib_conv2d_NCHWc` (blocks inside every group, bias and ReLU fused) against the
    reference."""
    c_in, c_out = channels
    h, w = size
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {c_in // block}, {h}, {w}, {block}), float32],
          %w: Tensor[({c_out // block}, {c_in // groups // block}, {kernel}, {kernel}, {block}, {block}), float32],
          %b: Tensor[({c_out // block}, 1, 1, {block}), float32]) {{
  %0 = nn.contrib_conv2d_NCHWc(%x, %w, strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}],
                               groups={groups}, channels={c_out}, kernel_size=[{kernel}, {kernel}],
                               data_layout="NCHW{block}c", kernel_layout="OIHW{block}i{block}o",
                               out_layout="NCHW{block}c");
  nn.relu(add(%0, %b))
}}
"""
    mod = infer_types(parse_module(source))
    assert tuple(mod["main"].checked_type.ret_type.shape) == (1, c_out // block, oh, ow, block)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(tuple(int(d) for d in p.checked_type.shape)).astype(np.float32)
              for p in mod["main"].params]
    want = evaluate(mod, inputs)
    got = build_primitive(mod["main"].with_attrs(Primitive=1))(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# AlexNet's two-group 5x5 and 3x3 convolutions in small, odd sizes; three groups; stride 2 with padding.
@pytest.mark.parametrize("channels, groups, block, size, kernel, stride, pad", [
    ((16, 24), 2, 4, (9, 7), 5, 1, 2),
    ((16, 16), 2, 8, (5, 5), 3, 1, 1),
    ((24, 12), 3, 4, (11, 6), 3, 2, 1),
])
def test_grouped_blocked_convolution_matches_the_reference(channels: tuple[int, int], groups: int, block: int,
                                                           size: tuple[int, int], kernel: int, stride: int,
                                                           pad: int) -> None:
    check_blocked_grouped_conv(channels, groups, block, size, kernel, stride, pad)


# Softmax across a middle axis: YOLOv8's box head (distribution focal loss: softmax over axis 1 of [1, 16, 4, A])
# and channel softmax on NCHW. The reductions run across that axis, one tile of the innermost axis at a time.
ACROSS = [((1, 16, 4, 37), 1), ((2, 5, 3, 19), 1), ((3, 7, 21), 0), ((2, 6, 5, 9), 2)]


@pytest.mark.parametrize("shape, axis", ACROSS)
def test_softmax_across_a_middle_axis_every_config(shape: tuple[int, ...], axis: int) -> None:
    from relay_tune.compile import resolve_target
    from relay_tune.tuning.relay_task import tasks_from_module
    from search_space.families.reduction import _reduction_mode

    x = Var("x", TensorType(shape, "float32"))
    body = Call(op("nn.softmax"), (x,), get_op("nn.softmax").make_attrs({"axis": axis}))
    mod = infer_types(IRModule({"main": Function((x,), body)}))
    (task,) = tasks_from_module(mod, resolve_target("llvm -num-cores=2"))
    assert _reduction_mode(primitive_compute(task.func), task.target_info) == ("across", shape[-1])
    rng = np.random.default_rng(1)
    data = (rng.standard_normal(shape) * 4).astype(np.float32)
    want = evaluate(mod, [data])
    for config in task.space.enumerate():
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(data)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(config))


def test_softmax_across_computes_each_exponential_once() -> None:
    from relay_tune.compile.primitive import lower_primitive
    from relay_tune.kernel.analysis import format_func

    x = Var("x", TensorType((1, 16, 4, 2100), "float32"))
    body = Call(op("nn.softmax"), (x,), get_op("nn.softmax").make_attrs({"axis": 1}))
    func = infer_types(IRModule({"main": Function((x,), body)}))["main"]
    prim, _ = lower_primitive(func.with_attrs(Primitive=1))
    # The exponentials of one tile live in a local buffer holding all 16 positions of the reduced axis: computed
    # once per tile, not once per output row.
    text = format_func(prim)
    exp_buffers = [line for line in text.splitlines() if "alloc" in line and ".exp" in line]
    assert exp_buffers and all("[1x16x1x" in line for line in exp_buffers), text[:2000]
