"""Winograd convolution: the transforms' references against the direct convolution, the WinogradConv pass (which
convolutions it rewrites), fusion of the three ops, and planned models compiled with it against the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import Call, Expr, Function, IRModule, TensorType, Var, const, op, post_order
from relay_tune.op.nn import conv2d_ref
from relay_tune.op.registry import get_op
from relay_tune.op.winograd import weight_transform, winograd_matrices
from relay_tune.passes import PassConfig, optimize
from relay_tune.passes.winograd import auto_tile_size
from relay_tune.runtime import load
from relay_tune.type_infer import infer_types

BLOCK = 16  # the NCHW16c planning of an AVX-512 target, fixed so that the golden checks do not depend on the host


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def he_weight(rng: np.random.Generator, out: int, cin: int, k: int = 3) -> np.ndarray:
    return (rng.standard_normal((out, cin, k, k)) * np.sqrt(2.0 / (k * k * cin))).astype(np.float32)


def winograd_conv(x: np.ndarray, w: np.ndarray, m: int, pad: int) -> np.ndarray:
    """The convolution through the three references: input transform, batched product, output transform."""
    attrs = get_op("nn.winograd_input_transform").make_attrs({"tile_size": m, "padding": (pad,) * 4})
    v = get_op("nn.winograd_input_transform").reference([x], attrs)
    product = np.matmul(v, weight_transform(w, m))
    out_h, out_w = x.shape[2] + 2 * pad - 2, x.shape[3] + 2 * pad - 2
    attrs = get_op("nn.winograd_output_transform").make_attrs({"tile_size": m, "out_height": out_h,
                                                              "out_width": out_w})
    return get_op("nn.winograd_output_transform").reference([product], attrs)


@pytest.mark.parametrize(("cin", "cout", "h", "w", "pad", "m"), [
    (5, 3, 13, 13, 0, 2), (5, 3, 13, 13, 1, 4), (3, 4, 7, 7, 0, 4), (7, 5, 7, 9, 1, 2), (16, 16, 14, 14, 1, 4),
    (64, 64, 14, 14, 1, 4),
])
def test_references_compute_the_direct_convolution(cin: int, cout: int, h: int, w: int, pad: int, m: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cin, h, w)).astype(np.float32)
    wt = he_weight(rng, cout, cin)
    direct = conv2d_ref([x, wt], get_op("nn.conv2d").make_attrs({"padding": (pad, pad)}))
    got = winograd_conv(x, wt, m, pad)
    assert got.shape == direct.shape
    # the tuner's tolerance: rtol 1e-4, atol 1e-5 of the output's scale (fp32 products, trained-scale weights)
    np.testing.assert_allclose(got, direct, rtol=1e-4, atol=1e-5 * np.abs(direct).max())


def test_a_wrong_transform_matrix_would_be_caught() -> None:
    # the check above can fail: a kernel transform of the other tile size gives another convolution
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    wt = he_weight(rng, 4, 4)
    direct = conv2d_ref([x, wt], get_op("nn.conv2d").make_attrs({"padding": (1, 1)}))
    attrs = get_op("nn.winograd_input_transform").make_attrs({"tile_size": 2, "padding": (1,) * 4})
    v = get_op("nn.winograd_input_transform").reference([x], attrs)
    u = weight_transform(wt, 2)[::-1].copy()  # frequencies out of order
    out = get_op("nn.winograd_output_transform").reference(
        [np.matmul(v, u)], get_op("nn.winograd_output_transform").make_attrs(
            {"tile_size": 2, "out_height": 8, "out_width": 8}))
    assert not np.allclose(out, direct, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("m", [2, 4])
def test_weight_transform_is_g_g_gt_per_kernel(m: int) -> None:
    # the one-product form against the definition, kernel by kernel, with unequal odd channel counts
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    _, g, _ = winograd_matrices(m)
    got = weight_transform(weight, m)
    assert got.shape == ((m + 2) ** 2, 3, 5) and got.dtype == np.float32 and got.flags.c_contiguous
    for o in range(5):
        for i in range(3):
            want = (g @ weight[o, i].astype(np.float64) @ g.T).reshape(-1)
            np.testing.assert_allclose(got[:, i, o], want, rtol=1e-6, atol=1e-6)


def test_type_relations_give_tiles_and_output_shapes() -> None:
    x = Var("x", TensorType((2, 3, 13, 11, 16), "float32"))
    v = call("nn.winograd_input_transform", x, tile_size=4, padding=(1, 1, 1, 1), data_layout="NCHW16c")
    out = call("nn.winograd_output_transform", v, tile_size=4, out_height=13, out_width=11, out_layout="NCHW16c")
    mod = infer_types(IRModule({"main": Function((x,), out)}))
    assert mod["main"].body.args[0].checked_type.shape == (36, 2 * 4 * 3, 48)
    assert mod["main"].body.checked_type.shape == (2, 3, 13, 11, 16)


def _model(rng: np.random.Generator, weight_input: bool = False) -> IRModule:
    """A small planned CNN: conv 3x3 s1 (64 -> 64, 16x16, eligible), conv 3x3 s2, conv 1x1, grouped conv 3x3 s1,
    and (with `weight_input`) a 3x3 s1 conv whose kernel is a model input, each with bias and ReLU."""
    x = Var("x", TensorType((1, 64, 16, 16), "float32"))
    params = [x]

    def conv(value: Expr, cout: int, cin: int, k: int = 3, stride: int = 1, groups: int = 1,
             weight: Expr | None = None) -> Expr:
        w = weight if weight is not None else const(he_weight(rng, cout, cin // groups, k))
        y = call("nn.conv2d", value, w, strides=(stride, stride), padding=(k // 2, k // 2), groups=groups,
                 kernel_size=(k, k), channels=cout)
        bias = const((rng.standard_normal(cout) * 0.1).astype(np.float32))
        return call("nn.relu", call("nn.bias_add", y, bias))

    y = conv(x, 64, 64)                    # eligible
    y = conv(y, 64, 64, groups=2)          # grouped: stays direct
    y = conv(y, 64, 64, k=1)               # 1x1: stays direct
    y = conv(y, 64, 64, stride=2)          # stride 2: stays direct
    if weight_input:
        w = Var("w", TensorType((64, 64, 3, 3), "float32"))
        params.append(w)
        y = conv(y, 64, 64, weight=w)      # kernel is a model input: stays direct
    return infer_types(IRModule({"main": Function(tuple(params), y)}))


def _calls(mod: IRModule, name: str) -> list[Call]:
    found = []
    for node in post_order(mod["main"]):
        if isinstance(node, Function) and node is not mod["main"]:
            found += [c for c in post_order(node.body) if isinstance(c, Call) and c.op_name == name]
    return found


def _fused_groups(mod: IRModule) -> list[list[str]]:
    groups = []
    for node in post_order(mod["main"].body):
        if isinstance(node, Function):
            groups.append([c.op_name for c in post_order(node.body) if isinstance(c, Call) and c.op_name])
    return groups


def test_the_pass_rewrites_only_eligible_convolutions_and_the_fuser_keeps_three_kernels() -> None:
    mod = _model(np.random.default_rng(0), weight_input=True)
    fused = optimize(mod, opt_level=3, layout_block=BLOCK, winograd="on")
    assert len(_calls(fused, "nn.winograd_input_transform")) == 1
    assert len(_calls(fused, "nn.winograd_output_transform")) == 1
    convs = _calls(fused, "nn.contrib_conv2d_NCHWc") + _calls(fused, "nn.conv2d")
    described = sorted((tuple(c.attrs["kernel_size"]), tuple(c.attrs["strides"]), int(c.attrs["groups"]))
                       for c in convs)
    # grouped (planned or not), 1x1, stride 2 and the input-weight one stay direct convolutions
    assert described == sorted([((3, 3), (1, 1), 2), ((1, 1), (1, 1), 1), ((3, 3), (2, 2), 1),
                                ((3, 3), (1, 1), 1)])
    groups = _fused_groups(fused)
    assert ["nn.winograd_input_transform"] in groups  # a kernel of its own
    assert any(g[0] == "nn.batch_matmul" and len(g) == 1 for g in groups)  # the product alone
    epilogue = next(g for g in groups if "nn.winograd_output_transform" in g)
    assert sorted(epilogue) == ["add", "nn.relu", "nn.winograd_output_transform"]  # bias and ReLU fused into it
    # off leaves every convolution direct; auto follows its rule (16x16 maps, 64 channels: F(4x4))
    assert not _calls(optimize(mod, opt_level=3, layout_block=BLOCK, winograd="off"), "nn.winograd_input_transform")
    auto = optimize(mod, opt_level=3, layout_block=BLOCK, winograd="auto")
    assert [int(c.attrs["tile_size"]) for c in _calls(auto, "nn.winograd_input_transform")] == [4]
    # without layout planning there are no blocked convolutions to rewrite
    assert not _calls(optimize(mod, opt_level=3, layout_block=0, winograd="on"), "nn.winograd_input_transform")


def test_auto_rule_and_config_validation() -> None:
    assert auto_tile_size(56, 56, 64, 64) == 4
    assert auto_tile_size(14, 14, 256, 256) == 4
    assert auto_tile_size(7, 7, 512, 512) == 0  # 2x2 tiles of 4 cover an 8x8 map: slower than direct
    assert auto_tile_size(55, 55, 16, 64) == 0  # few input channels: the transforms cost what the product saves
    with pytest.raises(ValueError, match="winograd"):
        PassConfig(winograd="fast")


@pytest.mark.parametrize("mode", ["f2", "f4"])
def test_planned_model_with_winograd_matches_the_interpreter_and_survives_save_and_load(
        mode: str, tmp_path: Path) -> None:
    mod = _model(np.random.default_rng(2))
    model = relay_tune.build(mod, target="llvm", winograd=mode)
    assert any("winograd" in t.description for t in model.plan.tasks)
    inputs = model.random_inputs(seed=0)
    expected = np.asarray(Interpreter(mod).run(inputs))
    got = model.run(**inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    path = model.save(tmp_path / "model.rtmod")
    np.testing.assert_array_equal(load(path).run(**inputs), got)


def test_command_line_flag_selects_the_rewrite_and_rejects_unknown_settings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from relay_tune.cli import main
    from relay_tune.testing import zoo

    path = zoo.write(_model(np.random.default_rng(3)), tmp_path / "cnn.relay")
    assert main(["check", str(path), "--fused", "--winograd", "on"]) == 0
    assert "nn.winograd_input_transform" in capsys.readouterr().out
    assert main(["check", str(path), "--fused", "--winograd", "off"]) == 0
    assert "winograd" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["check", str(path), "--winograd", "fast"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
