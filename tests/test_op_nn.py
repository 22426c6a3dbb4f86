"""nn operators: numpy references against independent loop formulations, and type relations.

The loop implementations below compute every output element straight from the definition (bounds
checks instead of padded arrays, explicit window enumeration), so they share no code or tricks with
the im2col/sliding-window references under test.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_tune.errors import RelayTypeError, UnsupportedError
from relay_tune.ir.types import ANY, TensorType, TupleType
from relay_tune.op.registry import get_op

RNG = np.random.default_rng(1234)


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-5 if np.dtype(dtype).kind == "i" else 0, 6, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def run(op_name: str, inputs: Sequence[np.ndarray], **attrs: object) -> tuple[object, object]:
    """(reference output, relation output type) for one call; also checks they agree."""
    opdef = get_op(op_name)
    full = opdef.make_attrs(attrs)
    out_type = opdef.type_relation([TensorType(x.shape, str(x.dtype)) for x in inputs], full)
    out = opdef.reference(list(inputs), full)
    check_matches_type(out, out_type)
    return out, out_type


def check_matches_type(value: object, ty: object) -> None:
    if isinstance(ty, TupleType):
        assert isinstance(value, tuple) and len(value) == len(ty.fields)
        for v, t in zip(value, ty.fields):
            check_matches_type(v, t)
        return
    assert isinstance(ty, TensorType)
    assert isinstance(value, np.ndarray)
    assert value.shape == ty.shape, (value.shape, ty)
    assert str(value.dtype) == ty.dtype, (value.dtype, ty)


# ------------------------------------------------------------------------------------------------
# Loop formulations
# ------------------------------------------------------------------------------------------------


def conv2d_loops(
    x: np.ndarray, w: np.ndarray, strides: tuple[int, int], dilation: tuple[int, int],
    pads: tuple[int, int, int, int], groups: int,
) -> np.ndarray:
    """NCHW x OIHW, pads = (top, left, bottom, right); float64 or int64 accumulation."""
    n_, _, h_, w_ = x.shape
    o_, cg, kh_, kw_ = w.shape
    top, left, bottom, right = pads
    oh_ = (h_ + top + bottom - (kh_ - 1) * dilation[0] - 1) // strides[0] + 1
    ow_ = (w_ + left + right - (kw_ - 1) * dilation[1] - 1) // strides[1] + 1
    acc = np.int64 if x.dtype.kind in "iu" else np.float64
    out = np.zeros((n_, o_, oh_, ow_), dtype=acc)
    per_group = o_ // groups
    for n, o, oh, ow in itertools.product(range(n_), range(o_), range(oh_), range(ow_)):
        g = o // per_group
        total = acc(0)
        for ci, kh, kw in itertools.product(range(cg), range(kh_), range(kw_)):
            ih = oh * strides[0] - top + kh * dilation[0]
            iw = ow * strides[1] - left + kw * dilation[1]
            if 0 <= ih < h_ and 0 <= iw < w_:
                total += acc(x[n, g * cg + ci, ih, iw]) * acc(w[o, ci, kh, kw])
        out[n, o, oh, ow] = total
    return out


def pool2d_loops(
    x: np.ndarray, kind: str, pool: tuple[int, int], strides: tuple[int, int], dilation: tuple[int, int],
    pads: tuple[int, int, int, int], ceil_mode: bool, count_include_pad: bool = False,
) -> np.ndarray:
    """NCHW pooling from the definition: enumerate each window's taps and classify them."""
    n_, c_, h_, w_ = x.shape
    top, left, bottom, right = pads
    sizes = []
    for size, before, after, k, s, d in zip((h_, w_), (top, left), (bottom, right), pool, strides, dilation):
        span = size + before + after - (k - 1) * d - 1
        sizes.append((span + (s - 1 if ceil_mode else 0)) // s + 1)
    out = np.zeros((n_, c_, *sizes))
    for n, c, oh, ow in itertools.product(range(n_), range(c_), range(sizes[0]), range(sizes[1])):
        values, counted = [], 0
        for kh, kw in itertools.product(range(pool[0]), range(pool[1])):
            ih = oh * strides[0] - top + kh * dilation[0]
            iw = ow * strides[1] - left + kw * dilation[1]
            inside = 0 <= ih < h_ and 0 <= iw < w_
            in_padded = -top <= ih < h_ + bottom and -left <= iw < w_ + right
            if inside:
                values.append(float(x[n, c, ih, iw]))
            if inside or (count_include_pad and in_padded):
                counted += 1
        if kind == "max":
            out[n, c, oh, ow] = max(values) if values else -math.inf
        else:
            out[n, c, oh, ow] = sum(values) / max(counted, 1)
    return out


# ------------------------------------------------------------------------------------------------
# conv2d / conv1d / NCHWc
# ------------------------------------------------------------------------------------------------

CONV_CASES = [
    # (N, C, H, W), (O, KH, KW), strides, dilation, padding attr, groups
    ((1, 3, 7, 9), (4, 3, 3), (1, 1), (1, 1), (0, 0), 1),
    ((2, 4, 9, 7), (6, 3, 2), (2, 2), (1, 1), (1, 2, 0, 1), 2),
    ((1, 6, 11, 10), (6, 3, 3), (2, 1), (2, 2), (2, 1), 6),  # depthwise, dilation 2
    ((1, 4, 8, 8), (8, 3, 3), (1, 2), (1, 1), (1,), 4),  # depthwise with channel multiplier 2
    ((1, 5, 9, 9), (3, 5, 3), (3, 2), (1, 2), (2, 0, 1, 3), 1),
    ((2, 2, 5, 6), (2, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1),
]


def _pads4(padding: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(padding) == 1:
        return (padding[0],) * 4  # type: ignore[return-value]
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return padding  # type: ignore[return-value]


@pytest.mark.parametrize(("dshape", "wspec", "strides", "dilation", "padding", "groups"), CONV_CASES)
def test_conv2d_nchw_matches_loops(dshape, wspec, strides, dilation, padding, groups) -> None:
    o, kh, kw = wspec
    x = rand(*dshape)
    w = rand(o, dshape[1] // groups, kh, kw)
    out, _ = run(
        "nn.conv2d", [x, w], strides=strides, dilation=dilation, padding=padding, groups=groups,
        channels=o, kernel_size=(kh, kw),
    )
    expected = conv2d_loops(x, w, strides, dilation, _pads4(padding), groups)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("dshape", "wspec", "strides", "dilation", "padding", "groups"), CONV_CASES[:4])
@pytest.mark.parametrize(("data_layout", "kernel_layout"), [("NHWC", "HWIO"), ("NHWC", "OHWI"), ("NCHW", "HWIO")])
def test_conv2d_other_layouts(dshape, wspec, strides, dilation, padding, groups, data_layout, kernel_layout) -> None:
    o, kh, kw = wspec
    x = rand(*dshape)
    w = rand(o, dshape[1] // groups, kh, kw)
    x_in = x.transpose(["NCHW".index(a) for a in data_layout])
    w_in = w.transpose(["OIHW".index(a) for a in kernel_layout])
    out, _ = run(
        "nn.conv2d", [x_in, w_in], strides=strides, dilation=dilation, padding=padding, groups=groups,
        data_layout=data_layout, kernel_layout=kernel_layout,
    )
    expected = conv2d_loops(x, w, strides, dilation, _pads4(padding), groups)
    np.testing.assert_allclose(out, expected.transpose(["NCHW".index(a) for a in data_layout]), rtol=1e-4, atol=1e-4)


def test_conv2d_out_layout_differs_from_data_layout() -> None:
    x, w = rand(1, 3, 6, 6), rand(4, 3, 3, 3)
    out, out_type = run("nn.conv2d", [x, w], padding=(1, 1), out_layout="NHWC")
    assert out_type.shape == (1, 6, 6, 4)
    np.testing.assert_allclose(out, conv2d_loops(x, w, (1, 1), (1, 1), (1, 1, 1, 1), 1).transpose(0, 2, 3, 1),
                               rtol=1e-4, atol=1e-4)


def test_conv2d_int8_with_out_dtype_is_exact() -> None:
    x = rand(1, 3, 8, 8, dtype="uint8")
    w = rand(3, 3, 5, 5, dtype="int8")
    out, out_type = run("nn.conv2d", [x, w], padding=(2, 2), channels=3, kernel_size=(5, 5), out_dtype="int32")
    assert out_type == TensorType((1, 3, 8, 8), "int32")
    np.testing.assert_array_equal(out, conv2d_loops(x, w, (1, 1), (1, 1), (2, 2, 2, 2), 1))


def test_conv2d_float16_keeps_float16_and_out_dtype_float32() -> None:
    x, w = rand(1, 4, 6, 6, dtype="float16"), rand(2, 4, 3, 3, dtype="float16")
    out16, ty16 = run("nn.conv2d", [x, w])
    assert ty16.dtype == "float16" and out16.dtype == np.float16
    out32, ty32 = run("nn.conv2d", [x, w], out_dtype="float32")
    assert ty32.dtype == "float32"
    expected = conv2d_loops(x, w, (1, 1), (1, 1), (0, 0, 0, 0), 1)
    np.testing.assert_allclose(out32, expected, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(out16.astype(np.float64), expected, rtol=1e-2, atol=1e-2)


def test_conv1d_matches_2d_loops_with_unit_height() -> None:
    x, w = rand(2, 4, 13), rand(6, 2, 3)
    out, out_type = run("nn.conv1d", [x, w], strides=(2,), dilation=(2,), padding=(1, 2), groups=2)
    expected = conv2d_loops(x[:, :, None, :], w[:, :, None, :], (1, 2), (1, 2), (0, 1, 0, 2), 2)[:, :, 0, :]
    assert out_type == TensorType((2, 6, 6), "float32")
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_conv1d_nwc_layout() -> None:
    x, w = rand(1, 3, 9), rand(5, 3, 2)
    out, _ = run("nn.conv1d", [x.transpose(0, 2, 1), w.transpose(2, 1, 0)], data_layout="NWC", kernel_layout="WIO")
    expected = conv2d_loops(x[:, :, None, :], w[:, :, None, :], (1, 1), (1, 1), (0, 0, 0, 0), 1)[:, :, 0, :]
    np.testing.assert_allclose(out, expected.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)


def test_contrib_conv2d_nchwc_matches_unpacked_conv() -> None:
    n, c, h, w_, o = 1, 8, 6, 5, 8
    x, w = rand(n, c, h, w_), rand(o, c, 3, 3)
    # Pack by hand: NCHW -> NCHW4c and OIHW -> OIHW4i4o (axes O/4, I/4, H, W, 4i, 4o).
    x_packed = x.reshape(n, c // 4, 4, h, w_).transpose(0, 1, 3, 4, 2)
    w_packed = w.reshape(o // 4, 4, c // 4, 4, 3, 3).transpose(0, 2, 4, 5, 3, 1)
    out, out_type = run(
        "nn.contrib_conv2d_NCHWc", [x_packed, w_packed], padding=(1, 1, 1, 1), channels=o, kernel_size=(3, 3),
        data_layout="NCHW4c", kernel_layout="OIHW4i4o", out_layout="NCHW4c",
    )
    assert out_type == TensorType((1, 2, 6, 5, 4), "float32")
    expected = conv2d_loops(x, w, (1, 1), (1, 1), (1, 1, 1, 1), 1)
    np.testing.assert_allclose(out, expected.reshape(n, o // 4, 4, h, w_).transpose(0, 1, 3, 4, 2), rtol=1e-4,
                               atol=1e-4)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 2), groups=st.sampled_from([1, 2, 3]), cpg=st.integers(1, 3), opg=st.integers(1, 2),
    h=st.integers(1, 9), w=st.integers(1, 9), k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    s=st.tuples(st.integers(1, 3), st.integers(1, 3)), d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pad=st.tuples(*[st.integers(0, 2)] * 4), layout=st.sampled_from(["NCHW", "NHWC"]),
)
def test_conv2d_relation_agrees_with_reference_on_many_shapes(n, groups, cpg, opg, h, w, k, s, d, pad, layout) -> None:
    c, o = groups * cpg, groups * opg
    x = rand(n, c, h, w)
    if layout == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    wt = rand(o, cpg, *k)
    opdef = get_op("nn.conv2d")
    attrs = opdef.make_attrs(
        {"strides": s, "dilation": d, "padding": pad, "groups": groups, "data_layout": layout}
    )
    effective = [(kk - 1) * dd + 1 for kk, dd in zip(k, d)]
    if h + pad[0] + pad[2] < effective[0] or w + pad[1] + pad[3] < effective[1]:
        with pytest.raises(RelayTypeError, match="larger than the padded input"):
            opdef.type_relation([TensorType(x.shape), TensorType(wt.shape)], attrs)
        return
    out_type = opdef.type_relation([TensorType(x.shape), TensorType(wt.shape)], attrs)
    check_matches_type(opdef.reference([x, wt], attrs), out_type)


# ------------------------------------------------------------------------------------------------
# Pooling
# ------------------------------------------------------------------------------------------------

POOL_CASES = [
    # pool, strides, dilation, padding, ceil_mode
    ((2, 2), (2, 2), (1, 1), (0, 0), False),
    ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False),
    ((3, 2), (2, 3), (1, 1), (1, 0, 2, 1), True),
    ((2, 3), (3, 2), (2, 1), (0, 1), True),
    ((3, 3), (1, 1), (2, 2), (2,), False),
]


@pytest.mark.parametrize(("pool", "strides", "dilation", "padding", "ceil_mode"), POOL_CASES)
def test_max_pool2d_matches_loops(pool, strides, dilation, padding, ceil_mode) -> None:
    x = rand(2, 3, 9, 8)
    out, _ = run("nn.max_pool2d", [x], pool_size=pool, strides=strides, dilation=dilation, padding=padding,
                 ceil_mode=ceil_mode)
    expected = pool2d_loops(x, "max", pool, strides, dilation, _pads4(padding), ceil_mode)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize(("pool", "strides", "dilation", "padding", "ceil_mode"), POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_matches_loops(pool, strides, dilation, padding, ceil_mode, count_include_pad) -> None:
    x = rand(1, 2, 9, 8)
    out, _ = run("nn.avg_pool2d", [x], pool_size=pool, strides=strides, dilation=dilation, padding=padding,
                 ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    expected = pool2d_loops(x, "avg", pool, strides, dilation, _pads4(padding), ceil_mode, count_include_pad)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_pools_in_nhwc_layout() -> None:
    x = rand(1, 3, 7, 7)
    for op_name, kind in (("nn.max_pool2d", "max"), ("nn.avg_pool2d", "avg")):
        out, out_type = run(op_name, [x.transpose(0, 2, 3, 1)], pool_size=(3, 3), strides=(2, 2), padding=(1, 1),
                            layout="NHWC")
        assert out_type.shape == (1, 4, 4, 3)
        expected = pool2d_loops(x, kind, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False)
        np.testing.assert_allclose(out, expected.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)


def test_ceil_mode_follows_tvm_plain_ceil() -> None:
    # 5 wide, pool 2, stride 2: floor gives 2, ceil gives 3 (TVM keeps the last, half-outside window).
    _, floor_type = run("nn.max_pool2d", [rand(1, 1, 5, 5)], pool_size=(2, 2), strides=(2, 2))
    _, ceil_type = run("nn.max_pool2d", [rand(1, 1, 5, 5)], pool_size=(2, 2), strides=(2, 2), ceil_mode=True)
    assert floor_type.shape == (1, 1, 2, 2) and ceil_type.shape == (1, 1, 3, 3)


def test_max_pool_padding_never_wins_even_for_negative_inputs() -> None:
    x = -np.abs(rand(1, 1, 4, 4)) - 1.0
    out, _ = run("nn.max_pool2d", [x], pool_size=(3, 3), padding=(1, 1))
    assert (out < 0).all()
    np.testing.assert_allclose(out, pool2d_loops(x, "max", (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False))


def test_pool_float16_and_integer_dtypes() -> None:
    out, _ = run("nn.avg_pool2d", [rand(1, 2, 6, 6, dtype="float16")], pool_size=(2, 2), strides=(2, 2))
    assert out.dtype == np.float16
    xi = rand(1, 2, 6, 6, dtype="int32")
    out_i, _ = run("nn.max_pool2d", [xi], pool_size=(3, 3), padding=(1, 1))
    np.testing.assert_array_equal(out_i, pool2d_loops(xi, "max", (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_pools(layout: str) -> None:
    x = rand(2, 3, 5, 4)
    x_in = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    avg, avg_type = run("nn.global_avg_pool2d", [x_in], layout=layout)
    mx, _ = run("nn.global_max_pool2d", [x_in], layout=layout)
    for n, c in itertools.product(range(2), range(3)):
        window = [float(v) for v in x[n, c].ravel()]
        idx = (n, c, 0, 0) if layout == "NCHW" else (n, 0, 0, c)
        # absolute slack too: a mean near zero (sum of signed values) loses relative precision in float32 sums
        assert avg[idx] == pytest.approx(sum(window) / len(window), rel=1e-5, abs=1e-6)
        assert mx[idx] == max(window)
    assert avg_type.shape == ((2, 3, 1, 1) if layout == "NCHW" else (2, 1, 1, 3))


# ------------------------------------------------------------------------------------------------
# dense / batch_matmul
# ------------------------------------------------------------------------------------------------


def test_dense_matches_loops_and_keeps_leading_dims() -> None:
    x, w = rand(2, 3, 5), rand(4, 5)
    out, out_type = run("nn.dense", [x, w], units=4)
    assert out_type == TensorType((2, 3, 4), "float32")
    for i, j, u in itertools.product(range(2), range(3), range(4)):
        assert out[i, j, u] == pytest.approx(sum(float(x[i, j, k]) * float(w[u, k]) for k in range(5)), abs=1e-5)
    _, no_units = run("nn.dense", [x, w])
    assert no_units == out_type


def test_dense_int8_out_dtype_int32_and_float16() -> None:
    x, w = rand(3, 7, dtype="int8"), rand(2, 7, dtype="int8")
    out, out_type = run("nn.dense", [x, w], out_dtype="int32")
    assert out_type.dtype == "int32"
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64).T)
    out16, _ = run("nn.dense", [rand(3, 7, dtype="float16"), rand(2, 7, dtype="float16")])
    assert out16.dtype == np.float16


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize(("bx", "by"), [(3, 3), (1, 3), (3, 1)])
def test_batch_matmul_flags_and_broadcast(transpose_a: bool, transpose_b: bool, bx: int, by: int) -> None:
    m, k, n = 2, 5, 4
    x = rand(bx, *((k, m) if transpose_a else (m, k)))
    y = rand(by, *((n, k) if transpose_b else (k, n)))
    out, out_type = run("nn.batch_matmul", [x, y], transpose_a=transpose_a, transpose_b=transpose_b)
    batch = max(bx, by)
    assert out_type == TensorType((batch, m, n), "float32")
    for b, i, j in itertools.product(range(batch), range(m), range(n)):
        xb, yb = x[b if bx > 1 else 0], y[b if by > 1 else 0]
        total = sum(
            float(xb[kk, i] if transpose_a else xb[i, kk]) * float(yb[j, kk] if transpose_b else yb[kk, j])
            for kk in range(k)
        )
        assert out[b, i, j] == pytest.approx(total, abs=1e-5)


def test_batch_matmul_default_is_not_transposed() -> None:
    # The attrs default is transpose_b=False: (B, M, K) x (B, K, N).
    _, out_type = run("nn.batch_matmul", [rand(2, 3, 4), rand(2, 4, 6)])
    assert out_type.shape == (2, 3, 6)
    with pytest.raises(RelayTypeError, match="reduction dims differ"):
        get_op("nn.batch_matmul").type_relation(
            [TensorType((2, 3, 4)), TensorType((2, 6, 4))], get_op("nn.batch_matmul").make_attrs({})
        )


# ------------------------------------------------------------------------------------------------
# batch_norm, bias_add, dropout, softmax
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [1, -1, 3])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, True), (True, False)])
def test_batch_norm_formula(axis: int, center: bool, scale: bool) -> None:
    x = rand(2, 3, 4, 3)
    c = x.shape[axis]
    gamma, beta, mean = rand(c), rand(c), rand(c)
    var = np.abs(rand(c)) + 0.5
    (out, m_out, v_out), out_type = run(
        "nn.batch_norm", [x, gamma, beta, mean, var], axis=axis, epsilon=1e-3, center=center, scale=scale
    )
    assert out_type == TupleType((TensorType(x.shape), TensorType((c,)), TensorType((c,))))
    moved = np.moveaxis(x, axis, -1)
    result = np.moveaxis(out, axis, -1)
    for index in itertools.product(*(range(s) for s in moved.shape)):
        ch = index[-1]
        value = (float(moved[index]) - float(mean[ch])) / math.sqrt(float(var[ch]) + 1e-3)
        value = value * float(gamma[ch]) if scale else value
        value = value + float(beta[ch]) if center else value
        assert result[index] == pytest.approx(value, abs=1e-5)
    np.testing.assert_array_equal(m_out, mean)
    np.testing.assert_array_equal(v_out, var)


def test_bias_add_axis() -> None:
    x, b = rand(2, 3, 4), rand(4)
    out, _ = run("nn.bias_add", [x, b], axis=-1)
    np.testing.assert_allclose(out, x + b[None, None, :])
    out1, _ = run("nn.bias_add", [x, rand(3)], axis=1)
    assert out1.shape == x.shape


def test_dropout_is_identity_with_mask_tuple() -> None:
    x = rand(3, 4)
    (out, mask), out_type = run("nn.dropout", [x], rate=0.3)
    assert out_type == TupleType((TensorType((3, 4)), TensorType((3, 4))))
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(mask, np.ones_like(x))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis: int) -> None:
    x = rand(3, 5) * 10
    out, _ = run("nn.softmax", [x], axis=axis)
    log_out, _ = run("nn.log_softmax", [x], axis=axis)
    moved = np.moveaxis(x, axis, -1)
    for row_index in itertools.product(*(range(s) for s in moved.shape[:-1])):
        row = [float(v) for v in moved[row_index]]
        total = sum(math.exp(v) for v in row)
        for j, v in enumerate(row):
            full = (*row_index, j)
            got = np.moveaxis(out, axis, -1)[full]
            got_log = np.moveaxis(log_out, axis, -1)[full]
            assert got == pytest.approx(math.exp(v) / total, rel=1e-5)
            assert got_log == pytest.approx(v - math.log(total), abs=1e-4)


def test_softmax_float16_is_stable_and_stays_float16() -> None:
    x = np.array([[60000.0, 0.0, -60000.0]], dtype=np.float16)
    out, _ = run("nn.softmax", [x])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), [[1.0, 0.0, 0.0]])


# ------------------------------------------------------------------------------------------------
# Relation errors and dynamic dims
# ------------------------------------------------------------------------------------------------


def rel(op_name: str, *types: object, **attrs: object) -> object:
    opdef = get_op(op_name)
    return opdef.type_relation(list(types), opdef.make_attrs(attrs))


def test_conv2d_channel_mismatch_names_both_shapes() -> None:
    with pytest.raises(RelayTypeError) as err:
        rel("nn.conv2d", TensorType((1, 64, 56, 56)), TensorType((1, 32, 3, 3)), padding=(1, 1))
    text = str(err.value)
    assert "nn.conv2d" in text and "1x64x56x56" in text and "1x32x3x3" in text and "expected 64" in text


@pytest.mark.parametrize(
    ("types", "attrs", "pattern"),
    [
        ((TensorType((1, 4, 8, 8)), TensorType((8, 4, 3, 3))), {"channels": 16}, "channels=16"),
        ((TensorType((1, 4, 8, 8)), TensorType((8, 4, 3, 3))), {"kernel_size": (5, 5)}, "kernel_size"),
        ((TensorType((1, 4, 8, 8)), TensorType((8, 4, 3, 3))), {"padding": (1, 1, 1)}, "padding must have"),
        ((TensorType((1, 6, 8, 8)), TensorType((8, 3, 3, 3))), {"groups": 4}, "not divisible by groups"),
        ((TensorType((1, 4, 8)), TensorType((8, 4, 3, 3))), {}, "rank 3"),
        ((TensorType((1, 4, 2, 2)), TensorType((8, 4, 3, 3))), {}, "larger than the padded input"),
        ((TupleType(()), TensorType((8, 4, 3, 3))), {}, "must be a tensor"),
    ],
)
def test_conv2d_errors(types, attrs, pattern) -> None:
    with pytest.raises(RelayTypeError, match=pattern):
        rel("nn.conv2d", *types, **attrs)


def test_unsupported_layout_is_reported() -> None:
    with pytest.raises(UnsupportedError, match="NCDHW"):
        rel("nn.conv2d", TensorType((1, 4, 8, 8, 8)), TensorType((8, 4, 3, 3)), data_layout="NCDHW")


@pytest.mark.parametrize(
    ("op_name", "types", "attrs", "pattern"),
    [
        ("nn.dense", (TensorType((2, 5)), TensorType((3, 4))), {}, "K=5.*K=4"),
        ("nn.dense", (TensorType((2, 4)), TensorType((3, 4))), {"units": 5}, "units=5"),
        ("nn.batch_matmul", (TensorType((2, 3, 4)), TensorType((3, 4, 5))), {}, "neither is 1"),
        ("nn.batch_matmul", (TensorType((3, 4)), TensorType((3, 4, 5))), {}, "3-D"),
        ("nn.batch_norm", (TensorType((1, 3, 4, 4)), *[TensorType((4,))] * 4), {}, r"shape \(3,\)"),
        ("nn.batch_norm", (TensorType((1, 3)), *[TensorType((3,), "float16")] * 4), {}, "dtype"),
        ("nn.bias_add", (TensorType((1, 3, 4)), TensorType((4,))), {}, r"shape \(3,\)"),
        ("nn.softmax", (TensorType((1, 3)),), {"axis": 2}, "out of range"),
        ("nn.max_pool2d", (TensorType((1, 3, 2, 2)),), {"pool_size": (3, 3)}, "larger than the padded"),
        ("nn.avg_pool2d", (TensorType((1, 3, 4)),), {"pool_size": (2, 2)}, "does not fit layout"),
        ("nn.dropout", (TensorType((1, 3)),), {"rate": 1.5}, "rate"),
    ],
)
def test_relation_errors(op_name, types, attrs, pattern) -> None:
    with pytest.raises(RelayTypeError, match=pattern):
        rel(op_name, *types, **attrs)


def test_dynamic_dims_propagate() -> None:
    conv = rel("nn.conv2d", TensorType((ANY, 3, ANY, 8)), TensorType((4, 3, 3, 3)), padding=(1, 1))
    assert conv == TensorType((ANY, 4, ANY, 8))
    assert rel("nn.dense", TensorType((ANY, 5)), TensorType((7, 5))) == TensorType((ANY, 7))
    assert rel("nn.dense", TensorType((2, 5)), TensorType((ANY, ANY)), units=9) == TensorType((2, 9))
    assert rel("nn.batch_matmul", TensorType((ANY, 2, 3)), TensorType((4, 3, 5))).shape == (4, 2, 5)
    assert rel("nn.max_pool2d", TensorType((1, 3, ANY, 9)), pool_size=(3, 3)).shape == (1, 3, ANY, 7)
    bn = rel("nn.batch_norm", TensorType((ANY, ANY, 4)), *[TensorType((ANY,))] * 4, axis=1)
    assert bn == TupleType((TensorType((ANY, ANY, 4)), TensorType((ANY,)), TensorType((ANY,))))
