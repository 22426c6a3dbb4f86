"""Shape / data-movement operators: type relations and numpy references.

Where a reference is more than one numpy call, it is checked against an independent formulation
(numpy's own slicing, per-element loops, or hand-computed tables).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from relay_tune.errors import RelayTuneError, RelayTypeError, UnsupportedError
from relay_tune.ir.types import ANY, TensorType, TupleType, Type
from relay_tune.op import get_op
from relay_tune.op._shape import Layout, layout_transform_shape

HYP = settings(max_examples=60, deadline=None)


def relation(name: str, arg_types: list[Type], **attrs: Any) -> Type:
    op = get_op(name)
    return op.type_relation(arg_types, op.make_attrs(attrs))


def run(name: str, inputs: list[Any], **attrs: Any) -> Any:
    op = get_op(name)
    return op.reference(inputs, op.make_attrs(attrs))


def ttype(a: np.ndarray) -> TensorType:
    return TensorType(a.shape, a.dtype.name)


def arange(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    return np.arange(math.prod(shape), dtype=dtype).reshape(shape)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


# --------------------------------------------------------------------------------------------
# reshape
# --------------------------------------------------------------------------------------------

RESHAPE_TABLE = [
    ((2, 3, 4), [6, 4], (6, 4)),
    ((2, 3, 4), [-1], (24,)),
    ((2, 3, 4), [0, -1], (2, 12)),
    ((2, 3, 4), [-1, 0], (8, 3)),  # -1 takes input position 0, so the 0 copies input axis 1
    ((2, 3, 4), [0, 0, -1], (2, 3, 4)),
    ((2, 3, 4), [-2], (2, 3, 4)),
    ((2, 3, 4), [2, -2], (2, 3, 4)),
    ((2, 3, 4), [-3, 4], (6, 4)),
    ((2, 3, 4), [0, -3], (2, 12)),
    ((2, 3, 4), [-4, 1, 2, -2], (1, 2, 3, 4)),
    ((2, 3, 4), [-4, -1, 2, -2], (1, 2, 3, 4)),
    ((2, 6, 4), [0, -4, 2, -1, 0], (2, 2, 3, 4)),
    ((2, 6, 4), [0, -4, -1, 3, -2], (2, 2, 3, 4)),
    ((8, 3), [-4, 2, 4, 3], (2, 4, 3)),
    ((1, 2, 3, 4), [-3, -3], (2, 12)),
]


@pytest.mark.parametrize(("shape", "newshape", "expected"), RESHAPE_TABLE)
def test_reshape_special_values(shape: tuple, newshape: list, expected: tuple) -> None:
    assert relation("reshape", [TensorType(shape)], newshape=newshape) == TensorType(expected)
    x = arange(shape)
    out = run("reshape", [x], newshape=newshape)
    assert out.shape == expected
    assert np.array_equal(out.reshape(-1), x.reshape(-1))  # row-major order is untouched


def test_reshape_allowzero_and_any() -> None:
    assert relation("reshape", [TensorType((0, 3))], newshape=[0, 3], allowzero=1) == TensorType((0, 3))
    assert relation("reshape", [TensorType((5, 3))], newshape=[0, 3]) == TensorType((5, 3))
    assert run("reshape", [np.zeros((0, 3))], newshape=[3, 0], allowzero=1).shape == (3, 0)
    assert relation("reshape", [TensorType((ANY, 3, 4))], newshape=[0, -1]) == TensorType((ANY, 12))
    assert relation("reshape", [TensorType((ANY, 3, 4))], newshape=[-1, 4]) == TensorType((ANY, 4))
    assert relation("reshape", [TensorType((ANY, 3))], newshape=[-3]) == TensorType((ANY,))
    assert relation("reshape", [TensorType((ANY, 3))], newshape=[-4, 2, -1, 0]) == TensorType((2, ANY, 3))


@pytest.mark.parametrize(
    ("shape", "newshape", "message"),
    [
        ((2, 3), [4, 2], r"cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\) \(8 elements\)"),
        ((2, 3), [-1, -1], "more than one -1"),
        ((2, 3), [-1, 4], "do not divide"),
        ((2, 3), [0, 0, 0], "needs input axis 2"),
        ((2, 3), [-3, -3], "needs input axis"),
        ((6, 2), [-4, 4, -1, 0], "cannot split input dimension 6 into blocks of 4"),
        ((6, 2), [-4, 2, 2, 0], r"cannot split input dimension 6 into 2 x 2"),
        ((6, 2), [-4, -1, -1, 0], "one may be -1"),
        ((6, 2), [-5, 12], "unsupported special value -5"),
    ],
)
def test_reshape_errors(shape: tuple, newshape: list, message: str) -> None:
    with pytest.raises(RelayTypeError, match=message):
        relation("reshape", [TensorType(shape)], newshape=newshape)


@HYP
@given(shapes, st.data())
def test_reshape_random_factorisations(shape: tuple, data: st.DataObject) -> None:
    # Regroup the flat size into random factors, hide one of them as -1; numpy's reshape is the oracle.
    factors = [p for d in shape for p in _prime_factors(d)]
    order = data.draw(st.permutations(factors))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(order)), max_size=3)))
    groups = [math.prod(order[a:b]) for a, b in itertools.pairwise([0, *cuts, len(order)])]
    hidden = data.draw(st.integers(0, len(groups) - 1))
    newshape = [(-1 if i == hidden else g) for i, g in enumerate(groups)]
    x = arange(shape)
    expected = x.reshape(newshape)
    assert relation("reshape", [ttype(x)], newshape=newshape) == ttype(expected)
    assert np.array_equal(run("reshape", [x], newshape=newshape), expected)


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


# --------------------------------------------------------------------------------------------
# transpose, expand_dims, squeeze, batch_flatten
# --------------------------------------------------------------------------------------------


@HYP
@given(shapes, st.data())
def test_transpose_matches_numpy(shape: tuple, data: st.DataObject) -> None:
    x = arange(shape)
    perm = data.draw(st.permutations(range(len(shape))))
    spelled = [p - len(shape) if data.draw(st.booleans()) else p for p in perm]
    out = run("transpose", [x], axes=spelled)
    assert np.array_equal(out, np.transpose(x, perm))
    assert relation("transpose", [ttype(x)], axes=spelled) == ttype(out)
    assert np.array_equal(run("transpose", [x]), x.T)  # axes=None reverses
    assert relation("transpose", [ttype(x)]) == TensorType(shape[::-1], "float32")


def test_transpose_errors() -> None:
    with pytest.raises(RelayTypeError, match=r"axes \[0, 0\] is not a permutation"):
        relation("transpose", [TensorType((2, 3))], axes=[0, 0])
    with pytest.raises(RelayTypeError, match="not a permutation"):
        relation("transpose", [TensorType((2, 3, 4))], axes=[1, 0])
    assert relation("transpose", [TensorType((ANY, 3, 4))], axes=[0, 2, 1]) == TensorType((ANY, 4, 3))


@HYP
@given(shapes, st.data())
def test_expand_dims_and_squeeze(shape: tuple, data: st.DataObject) -> None:
    x = arange(shape)
    ndim = len(shape)
    axis = data.draw(st.integers(-ndim - 1, ndim))
    count = data.draw(st.integers(0, 3))
    out = run("expand_dims", [x], axis=axis, num_newaxis=count)
    expected = x
    pos = axis if axis >= 0 else axis + ndim + 1
    for _ in range(count):
        expected = np.expand_dims(expected, pos)
    assert np.array_equal(out, expected) and out.shape == expected.shape
    assert relation("expand_dims", [ttype(x)], axis=axis, num_newaxis=count) == ttype(expected)
    # squeeze with no axis removes all unit axes (numpy's squeeze does the same)
    assert np.array_equal(run("squeeze", [out]), np.squeeze(out))
    assert relation("squeeze", [ttype(out)]) == ttype(np.squeeze(out))
    ones = [i for i, d in enumerate(out.shape) if d == 1]
    if ones:
        some = data.draw(st.lists(st.sampled_from(ones), unique=True, min_size=1))
        assert np.array_equal(run("squeeze", [out], axis=some), np.squeeze(out, axis=tuple(some)))
        assert relation("squeeze", [ttype(out)], axis=some) == ttype(np.squeeze(out, axis=tuple(some)))


def test_expand_dims_squeeze_errors_and_any() -> None:
    with pytest.raises(RelayTypeError, match="axis 3 is out of range"):
        relation("expand_dims", [TensorType((2, 3))], axis=3)
    with pytest.raises(RelayTypeError, match=r"cannot squeeze axis 1 of shape \(1, 3\): its extent is 3"):
        relation("squeeze", [TensorType((1, 3))], axis=[1])
    assert relation("squeeze", [TensorType((1, ANY, 1))]) == TensorType((ANY,))
    assert relation("squeeze", [TensorType((1, ANY))], axis=[1]) == TensorType((1,))
    # The corpus's SiLU program: bias (32,) -> expand_dims(axis=1, num_newaxis=2) -> expand_dims(axis=0).
    t = relation("expand_dims", [TensorType((32,))], axis=1, num_newaxis=2)
    assert relation("expand_dims", [t], axis=0) == TensorType((1, 32, 1, 1))


def test_batch_flatten() -> None:
    x = arange((2, 3, 4, 5))
    assert np.array_equal(run("nn.batch_flatten", [x]), x.reshape(2, 60))
    assert relation("nn.batch_flatten", [ttype(x)]) == TensorType((2, 60))
    assert relation("nn.batch_flatten", [TensorType((ANY, 3, 4))]) == TensorType((ANY, 12))
    assert relation("nn.batch_flatten", [TensorType((2, ANY))]) == TensorType((2, ANY))
    assert relation("nn.batch_flatten", [TensorType((7,))]) == TensorType((7, 1))
    with pytest.raises(RelayTypeError, match="rank >= 1"):
        relation("nn.batch_flatten", [TensorType(())])


# --------------------------------------------------------------------------------------------
# concatenate, stack, split
# --------------------------------------------------------------------------------------------


@HYP
@given(shapes, st.data())
def test_concatenate_and_stack(shape: tuple, data: st.DataObject) -> None:
    ndim = len(shape)
    axis = data.draw(st.integers(-ndim, ndim - 1))
    count = data.draw(st.integers(1, 4))
    arrays = []
    for k in range(count):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 4))
        arrays.append(arange(tuple(s)) + 100 * k)
    tup = TupleType(tuple(ttype(a) for a in arrays))
    out = run("concatenate", [tuple(arrays)], axis=axis)
    assert np.array_equal(out, np.concatenate(arrays, axis=axis))
    assert relation("concatenate", [tup], axis=axis) == ttype(out)

    same = [arange(shape) + 100 * k for k in range(count)]
    stack_axis = data.draw(st.integers(-ndim - 1, ndim))
    stacked = run("stack", [same], axis=stack_axis)
    assert np.array_equal(stacked, np.stack(same, axis=stack_axis))
    assert relation("stack", [TupleType(tuple(ttype(a) for a in same))], axis=stack_axis) == ttype(stacked)


def test_concatenate_stack_errors_and_any() -> None:
    tup = TupleType((TensorType((2, 3)), TensorType((2, 4))))
    with pytest.raises(RelayTypeError, match=r"got shapes \(2, 3\), \(2, 4\) \(axis 1 differs\)"):
        relation("concatenate", [tup], axis=0)
    assert relation("concatenate", [tup], axis=1) == TensorType((2, 7))
    with pytest.raises(RelayTypeError, match="tuple of tensors"):
        relation("concatenate", [TensorType((2, 3))])
    with pytest.raises(RelayTypeError, match="non-empty"):
        relation("concatenate", [TupleType(())])
    with pytest.raises(RelayTypeError, match="float32 vs float16"):
        relation("concatenate", [TupleType((TensorType((2,)), TensorType((2,), "float16")))])
    with pytest.raises(RelayTypeError, match="same rank"):
        relation("concatenate", [TupleType((TensorType((2,)), TensorType((2, 1))))])
    anys = TupleType((TensorType((ANY, 3)), TensorType((2, ANY))))
    assert relation("concatenate", [anys], axis=0) == TensorType((ANY, 3))
    assert relation("concatenate", [anys], axis=1) == TensorType((2, ANY))
    with pytest.raises(RelayTypeError, match=r"same shape, got \(2, 3\), \(3, 2\)"):
        relation("stack", [TupleType((TensorType((2, 3)), TensorType((3, 2))))])
    assert relation("stack", [anys], axis=-1) == TensorType((2, 3, 2))


@HYP
@given(shapes, st.data())
def test_split_sections_and_indices(shape: tuple, data: st.DataObject) -> None:
    ndim = len(shape)
    axis = data.draw(st.integers(-ndim, ndim - 1))
    x = arange(shape)
    extent = shape[axis]
    divisors = [d for d in range(1, extent + 1) if extent % d == 0]
    sections = data.draw(st.sampled_from(divisors))
    parts = run("split", [x], indices_or_sections=sections, axis=axis)
    assert isinstance(parts, tuple) and len(parts) == sections
    for got, want in zip(parts, np.split(x, sections, axis=axis)):
        assert np.array_equal(got, want)
    assert relation("split", [ttype(x)], indices_or_sections=sections, axis=axis) == TupleType(
        tuple(ttype(p) for p in parts)
    )
    if extent > 1:
        indices = sorted(data.draw(st.lists(st.integers(1, extent - 1), unique=True, min_size=1)))
        parts = run("split", [x], indices_or_sections=indices, axis=axis)
        # Independent: slice by hand between consecutive split points.
        bounds = [0, *indices, extent]
        assert len(parts) == len(indices) + 1
        for k, got in enumerate(parts):
            want = np.take(x, range(bounds[k], bounds[k + 1]), axis=axis)
            assert np.array_equal(got, want)
        assert relation("split", [ttype(x)], indices_or_sections=indices, axis=axis) == TupleType(
            tuple(ttype(p) for p in parts)
        )
        assert np.array_equal(np.concatenate(parts, axis=axis), x)


def test_split_errors_and_any() -> None:
    with pytest.raises(RelayTypeError, match="extent 10 cannot be split into 3 equal parts"):
        relation("split", [TensorType((10,))], indices_or_sections=3)
    with pytest.raises(RelayTypeError, match="strictly increasing"):
        relation("split", [TensorType((10,))], indices_or_sections=[4, 2])
    with pytest.raises(RelayTypeError, match="inside the axis of extent 10"):
        relation("split", [TensorType((10,))], indices_or_sections=[4, 10])
    got = relation("split", [TensorType((2, ANY))], indices_or_sections=[1, 3], axis=1)
    assert got == TupleType((TensorType((2, 1)), TensorType((2, 2)), TensorType((2, ANY))))
    assert relation("split", [TensorType((ANY,))], indices_or_sections=2) == TupleType(
        (TensorType((ANY,)), TensorType((ANY,)))
    )
    # GPT-2 splits the fused QKV projection.
    qkv = relation("split", [TensorType((50, 32, 2304))], indices_or_sections=[768, 1536], axis=2)
    assert qkv == TupleType((TensorType((50, 32, 768)),) * 3)


# --------------------------------------------------------------------------------------------
# strided_slice
# --------------------------------------------------------------------------------------------


@HYP
@given(shapes, st.data())
def test_strided_slice_matches_numpy_slicing(shape: tuple, data: st.DataObject) -> None:
    x = arange(shape)
    ndim = len(shape)
    n = data.draw(st.integers(1, ndim))
    begin = [data.draw(st.integers(-2 * d - 1, 2 * d + 1)) for d in shape[:n]]
    end = [data.draw(st.integers(-2 * d - 1, 2 * d + 1)) for d in shape[:n]]
    strides = [data.draw(st.integers(-3, 3).filter(bool)) for _ in range(data.draw(st.integers(0, n)))]
    full_strides = strides + [1] * (n - len(strides))
    # numpy's basic slicing (Python slice semantics) is the independent oracle for clamping.
    expected = x[tuple(slice(b, e, s) for b, e, s in zip(begin, end, full_strides))]
    attrs = {"begin": begin, "end": end, "strides": strides or None}
    out = run("strided_slice", [x], **attrs)
    assert np.array_equal(out, expected) and out.shape == expected.shape
    assert relation("strided_slice", [ttype(x)], **attrs) == ttype(expected)


@HYP
@given(shapes, st.data())
def test_strided_slice_with_axes(shape: tuple, data: st.DataObject) -> None:
    x = arange(shape)
    ndim = len(shape)
    axes = data.draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=1))
    spelled = [a - ndim if data.draw(st.booleans()) else a for a in axes]
    begin = [data.draw(st.integers(-shape[a], shape[a])) for a in axes]
    end = [data.draw(st.integers(-shape[a] - 2, shape[a] + 2)) for a in axes]
    strides = [data.draw(st.integers(-2, 2).filter(bool)) for _ in axes]
    index = [slice(None)] * ndim
    for a, b, e, s in zip(axes, begin, end, strides):
        index[a] = slice(b, e, s)
    expected = x[tuple(index)]
    attrs = {"begin": begin, "end": end, "strides": strides, "axes": spelled}
    assert np.array_equal(run("strided_slice", [x], **attrs), expected)
    assert relation("strided_slice", [ttype(x)], **attrs) == ttype(expected)


@HYP
@given(shapes, st.data())
def test_strided_slice_size_mode(shape: tuple, data: st.DataObject) -> None:
    x = arange(shape)
    begin = [data.draw(st.integers(-d, d - 1)) for d in shape]
    sizes = [data.draw(st.integers(-1, d + 1)) for d in shape]
    index = []
    for b, size, d in zip(begin, sizes, shape):
        start = b % d  # a negative begin counts from the end
        index.append(slice(start, None if size < 0 else start + size))
    expected = x[tuple(index)]
    # Strides are ignored in size mode.
    attrs = {"begin": begin, "end": sizes, "strides": [2] * len(shape), "slice_mode": "size"}
    assert np.array_equal(run("strided_slice", [x], **attrs), expected)
    assert relation("strided_slice", [ttype(x)], **attrs) == ttype(expected)


def test_strided_slice_corpus_case_errors_and_any() -> None:
    # From the take/slice corpus program (axes=None, end=-1 counts from the end).
    t = TensorType((1, 384, 128), "float16")
    a = relation("strided_slice", [t], begin=[0, 1, 0], end=[1, 384, 128], strides=[1, 1, 1], axes=None)
    b = relation("strided_slice", [t], begin=[0, 0, 0], end=[1, -1, 128], strides=[1, 1, 1], axes=None)
    assert a == b == TensorType((1, 383, 128), "float16")
    with pytest.raises(RelayTypeError, match="stride of axis 0 is 0"):
        relation("strided_slice", [TensorType((4,))], begin=[0], end=[4], strides=[0])
    with pytest.raises(RelayTypeError, match=r"longer than the rank of the input shape \(4,\)"):
        relation("strided_slice", [TensorType((4,))], begin=[0, 0], end=[4, 4])
    with pytest.raises(RelayTypeError, match="one entry per axis"):
        relation("strided_slice", [TensorType((4, 4))], begin=[0, 0], end=[4], axes=[0])
    with pytest.raises(RelayTypeError, match="slice_mode"):
        relation("strided_slice", [TensorType((4,))], begin=[0], end=[4], slice_mode="stop")
    assert relation("strided_slice", [TensorType((ANY, 6))], begin=[1, 1], end=[2, 5]) == TensorType((ANY, 4))
    assert relation("strided_slice", [TensorType((ANY, 6))], begin=[1], end=[3], axes=[1]) == TensorType((ANY, 2))


# --------------------------------------------------------------------------------------------
# take
# --------------------------------------------------------------------------------------------


def take_by_loops(data: np.ndarray, indices: np.ndarray, axis: int | None, batch_dims: int, mode: str) -> np.ndarray:
    """Element-by-element take, written from the definition."""

    def fix(i: int, n: int) -> int:
        if mode == "clip":
            return min(max(i, 0), n - 1)
        if mode == "wrap":
            return ((i % n) + n) % n
        return i

    if axis is None:
        flat = data.reshape(-1)
        out = np.empty(indices.shape, data.dtype)
        for pos in np.ndindex(indices.shape):
            out[pos] = flat[fix(int(indices[pos]), flat.size)]
        return out
    axis = axis % data.ndim
    batch_dims = batch_dims % (indices.ndim + 1) if batch_dims < 0 else batch_dims
    k = indices.ndim - batch_dims
    out_shape = data.shape[:axis] + indices.shape[batch_dims:] + data.shape[axis + 1 :]
    out = np.empty(out_shape, data.dtype)
    for pos in np.ndindex(out_shape):
        before, idx_part, after = pos[:axis], pos[axis : axis + k], pos[axis + k :]
        i = int(indices[before[:batch_dims] + idx_part])
        out[pos] = data[(*before, fix(i, data.shape[axis]), *after)]
    return out


@HYP
@given(shapes, st.data())
def test_take_against_loops(shape: tuple, data: st.DataObject) -> None:
    x = arange(shape)
    ndim = len(shape)
    mode = data.draw(st.sampled_from(("clip", "wrap", "fast")))
    use_axis = data.draw(st.booleans())
    axis = data.draw(st.integers(-ndim, ndim - 1)) if use_axis else None
    batch_dims = 0
    if axis is not None and data.draw(st.booleans()):
        batch_dims = data.draw(st.integers(0, axis % ndim))
    idx_shape = shape[:batch_dims] + tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    extent = x.size if axis is None else shape[axis]
    low, high = (0, extent - 1) if mode == "fast" else (-2 * extent, 2 * extent)
    idx_dtype = data.draw(st.sampled_from(("int32", "int64")))
    indices = np.array(
        data.draw(st.lists(st.integers(low, high), min_size=math.prod(idx_shape), max_size=math.prod(idx_shape))),
        dtype=idx_dtype,
    ).reshape(idx_shape)
    attrs = {"axis": axis, "batch_dims": batch_dims, "mode": mode}
    out = run("take", [x, indices], **attrs)
    expected = take_by_loops(x, indices, axis, batch_dims, mode)
    assert np.array_equal(out, expected)
    assert relation("take", [ttype(x), ttype(indices)], **attrs) == ttype(expected)


def test_take_modes_on_negative_indices() -> None:
    x = np.array([10, 20, 30, 40], dtype=np.int32)
    idx = np.array([-1, -5, 4, 9], dtype=np.int64)
    assert run("take", [x, idx], axis=0, mode="clip").tolist() == [10, 10, 40, 40]  # negatives clip to 0
    assert run("take", [x, idx], axis=0, mode="wrap").tolist() == [40, 40, 10, 20]
    with pytest.raises(RelayTuneError, match="index -1 is out of range"):
        run("take", [x, idx], axis=0, mode="fast")


def test_take_relation_errors_and_corpus_case() -> None:
    emb = relation("take", [TensorType((2016, 128), "float16"), TensorType((1, 384), "int32")], axis=0)
    assert emb == TensorType((1, 384, 128), "float16")
    with pytest.raises(RelayTypeError, match="indices must be an integer tensor"):
        relation("take", [TensorType((4,)), TensorType((2,), "float32")])
    with pytest.raises(RelayTypeError, match="mode must be one of clip, wrap, fast"):
        relation("take", [TensorType((4,)), TensorType((2,), "int32")], mode="raise")
    with pytest.raises(RelayTypeError, match="batch_dims 2 must not exceed axis 1"):
        relation("take", [TensorType((2, 3, 4)), TensorType((2, 3), "int32")], axis=1, batch_dims=2)
    with pytest.raises(RelayTypeError, match="must agree on axis 0"):
        relation("take", [TensorType((2, 3, 4)), TensorType((3, 3), "int32")], axis=1, batch_dims=1)
    assert relation("take", [TensorType((ANY, 5)), TensorType((ANY,), "int64")], axis=1) == TensorType((ANY, ANY))
    assert relation("take", [TensorType((2, 5)), TensorType((2, 7), "int64")], axis=-1, batch_dims=-1) == TensorType(
        (2, 7)
    )


# --------------------------------------------------------------------------------------------
# nn.pad
# --------------------------------------------------------------------------------------------


def pad_by_loops(x: np.ndarray, widths: list[tuple[int, int]], mode: str, value: float) -> np.ndarray:
    out_shape = tuple(d + b + a for d, (b, a) in zip(x.shape, widths))
    out = np.empty(out_shape, x.dtype)
    for pos in np.ndindex(out_shape):
        src = []
        inside = True
        for p, d, (b, _) in zip(pos, x.shape, widths):
            i = p - b
            if mode == "edge":
                i = min(max(i, 0), d - 1)
            elif mode == "reflect":
                i = -i if i < 0 else (2 * (d - 1) - i if i >= d else i)
            inside = inside and 0 <= i < d
            src.append(i)
        out[pos] = x[tuple(src)] if inside else value
    return out


@HYP
@given(shapes, st.data())
def test_pad_against_loops(shape: tuple, data: st.DataObject) -> None:
    mode = data.draw(st.sampled_from(("constant", "edge", "reflect")))
    limit = {"constant": 3, "edge": 3}.get(mode)
    widths = [
        (data.draw(st.integers(0, limit if limit is not None else d - 1)),
         data.draw(st.integers(0, limit if limit is not None else d - 1)))
        for d in shape
    ]
    x = arange(shape, "float16")
    value = np.array(-7, dtype=np.int32)  # an int pad value for float16 data, as in the corpus
    out = run("nn.pad", [x, value], pad_width=widths, pad_mode=mode)
    assert out.dtype == np.float16
    assert np.array_equal(out, pad_by_loops(x, widths, mode, -7.0))
    assert relation("nn.pad", [ttype(x), ttype(value)], pad_width=widths, pad_mode=mode) == ttype(out)


def test_pad_errors_and_any() -> None:
    t = TensorType((ANY, 3), "float32")
    assert relation("nn.pad", [t, TensorType((), "float32")], pad_width=[[1, 1], [0, 2]]) == TensorType((ANY, 5))
    with pytest.raises(RelayTypeError, match=r"one \[before, after\] pair per axis of \(\?, 3\)"):
        relation("nn.pad", [t, TensorType(())], pad_width=[[1, 1]])
    with pytest.raises(RelayTypeError, match="non-negative"):
        relation("nn.pad", [t, TensorType(())], pad_width=[[1, 1], [-1, 0]])
    with pytest.raises(RelayTypeError, match="reflect padding of 3 on axis 1 of extent 3 is larger than 2"):
        relation("nn.pad", [t, TensorType(())], pad_width=[[0, 0], [3, 0]], pad_mode="reflect")
    with pytest.raises(RelayTypeError, match="pad value must be a scalar"):
        relation("nn.pad", [t, TensorType((1,))], pad_width=[[0, 0], [0, 0]])
    with pytest.raises(RelayTypeError, match="pad_mode"):
        relation("nn.pad", [t, TensorType(())], pad_width=[[0, 0], [0, 0]], pad_mode="wrap")


# --------------------------------------------------------------------------------------------
# layout_transform
# --------------------------------------------------------------------------------------------


def test_layout_parsing() -> None:
    layout = Layout.parse("OIHW8i16o")
    assert str(layout) == "OIHW8i16o"
    assert layout.primal_names == ("O", "I", "H", "W")
    assert layout.factor_of("I") == 8 and layout.factor_of("O") == 16 and layout.factor_of("H") is None
    for bad, message in [
        ("", "non-empty"),
        ("NCHWc", "needs a positive factor"),
        ("NCHW0c", "needs a positive factor"),
        ("NCHW4d", "without its primal axis"),
        ("NCCH", "appears twice"),
        ("NC-HW", "unexpected character"),
        ("N4CHW", "cannot have a factor"),
    ]:
        with pytest.raises(RelayTypeError, match=message):
            Layout.parse(bad)


def test_layout_transform_blocked_against_index_formulas() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 3, 5)).astype(np.float32)
    out = run("layout_transform", [x], src_layout="NCHW", dst_layout="NCHW8c")
    assert out.shape == (2, 2, 3, 5, 8)
    assert relation("layout_transform", [ttype(x)], src_layout="NCHW", dst_layout="NCHW8c") == ttype(out)
    for n, cb, h, w, ci in itertools.product(range(2), range(2), range(3), range(5), range(8)):
        assert out[n, cb, h, w, ci] == x[n, cb * 8 + ci, h, w]
    back = run("layout_transform", [out], src_layout="NCHW8c", dst_layout="NCHW")
    assert np.array_equal(back, x)

    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    blocked = run("layout_transform", [w], src_layout="OIHW", dst_layout="OIHW4i8o")
    assert blocked.shape == (2, 2, 3, 3, 4, 8)
    for ob, ib, kh, kw, ii, oi in itertools.product(range(2), range(2), range(3), range(3), range(4), range(8)):
        assert blocked[ob, ib, kh, kw, ii, oi] == w[ob * 8 + oi, ib * 4 + ii, kh, kw]

    nhwc = run("layout_transform", [x], src_layout="NCHW", dst_layout="NHWC")
    assert np.array_equal(nhwc, x.transpose(0, 2, 3, 1))
    # Re-blocking goes through the logical layout: NCHW8c -> NHWC4c.
    reblocked = run("layout_transform", [out], src_layout="NCHW8c", dst_layout="NHWC4c")
    assert np.array_equal(reblocked, x.reshape(2, 4, 4, 3, 5).transpose(0, 3, 4, 1, 2))


def test_layout_transform_corpus_shapes_and_errors() -> None:
    assert relation("layout_transform", [TensorType((1, 4, 4, 4))], src_layout="NCHW", dst_layout="NCHW4c") == (
        TensorType((1, 1, 4, 4, 4))
    )
    assert relation(
        "layout_transform", [TensorType((4, 4, 3, 3))], src_layout="OIHW", dst_layout="OIHW4i4o"
    ) == TensorType((1, 1, 3, 3, 4, 4))
    assert relation(
        "layout_transform", [TensorType((ANY, 32, 7, 7))], src_layout="NCHW", dst_layout="NHWC8c"
    ) == TensorType((ANY, 7, 7, 4, 8))
    with pytest.raises(RelayTypeError, match="axis C of extent 12 cannot be split into blocks of 8"):
        relation("layout_transform", [TensorType((1, 12, 2, 2))], src_layout="NCHW", dst_layout="NCHW8c")
    with pytest.raises(RelayTypeError, match="same primal axes"):
        relation("layout_transform", [TensorType((1, 12, 2, 2))], src_layout="NCHW", dst_layout="NCDHW")
    with pytest.raises(RelayTypeError, match=r"layout NCHW has 4 axes but the tensor has shape \(1, 12, 2\)"):
        relation("layout_transform", [TensorType((1, 12, 2))], src_layout="NCHW", dst_layout="NHWC")
    with pytest.raises(RelayTypeError, match="axis 8c has extent 4"):
        relation("layout_transform", [TensorType((1, 2, 2, 2, 4))], src_layout="NCHW8c", dst_layout="NCHW")


@st.composite
def layout_pair(draw: st.DrawFn) -> tuple[str, str, dict[str, int]]:
    letters = draw(st.lists(st.sampled_from("NCHWD"), unique=True, min_size=1, max_size=4))
    extents = {c: draw(st.sampled_from((1, 2, 4, 6, 8))) for c in letters}

    def one_layout() -> str:
        order = draw(st.permutations(letters))
        parts = list(order)
        for c in letters:
            divisors = [f for f in (2, 3, 4) if extents[c] % f == 0]
            if divisors and draw(st.booleans()):
                parts.insert(draw(st.integers(0, len(parts))), f"{draw(st.sampled_from(divisors))}{c.lower()}")
        return "".join(parts)

    return one_layout(), one_layout(), extents


@HYP
@given(layout_pair())
def test_layout_transform_round_trip(case: tuple[str, str, dict[str, int]]) -> None:
    src, dst, extents = case
    logical_order = "".join(extents)
    logical = arange(tuple(extents.values()))
    x = run("layout_transform", [logical], src_layout=logical_order, dst_layout=src)
    assert x.shape == layout_transform_shape(logical.shape, Layout.parse(logical_order), Layout.parse(src))
    y = run("layout_transform", [x], src_layout=src, dst_layout=dst)
    assert relation("layout_transform", [ttype(x)], src_layout=src, dst_layout=dst) == ttype(y)
    assert np.array_equal(run("layout_transform", [y], src_layout=dst, dst_layout=src), x)
    assert np.array_equal(run("layout_transform", [y], src_layout=dst, dst_layout=logical_order), logical)
    assume(x.size > 0)
    # Every element lands at the index the layout definition gives it.
    parsed = Layout.parse(dst)
    for logical_index in itertools.islice(np.ndindex(logical.shape), 50):
        coord = dict(zip(logical_order, logical_index))
        phys = []
        for ax in parsed.axes:
            factor = parsed.factor_of(ax.name)
            if ax.is_primal:
                phys.append(coord[ax.name] // factor if factor else coord[ax.name])
            else:
                phys.append(coord[ax.name] % ax.factor)
        assert y[tuple(phys)] == logical[logical_index]


# --------------------------------------------------------------------------------------------
# nn.upsampling
# --------------------------------------------------------------------------------------------


def upsample_by_loops(x: np.ndarray, out_h: int, out_w: int, method: str, align: bool) -> np.ndarray:
    """NCHW upsampling written per output pixel with exact rational coordinates."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, out_h, out_w))

    def coord(o: int, size_in: int, size_out: int) -> Fraction:
        if align:
            return Fraction(o * (size_in - 1), size_out - 1) if size_out > 1 else Fraction(0)
        return Fraction(o * size_in, size_out)

    for oy, ox in itertools.product(range(out_h), range(out_w)):
        fy, fx = coord(oy, h, out_h), coord(ox, w, out_w)
        if method == "nearest_neighbor":
            # Fraction rounding with round() is ties-to-even, exactly; floor is exact too.
            iy = round(fy) if align else math.floor(fy)
            ix = round(fx) if align else math.floor(fx)
            out[:, :, oy, ox] = x[:, :, min(iy, h - 1), min(ix, w - 1)]
        else:
            y0, x0 = math.floor(fy), math.floor(fx)
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            dy, dx = float(fy - y0), float(fx - x0)
            out[:, :, oy, ox] = (
                x[:, :, y0, x0] * (1 - dy) * (1 - dx)
                + x[:, :, y0, x1] * (1 - dy) * dx
                + x[:, :, y1, x0] * dy * (1 - dx)
                + x[:, :, y1, x1] * dy * dx
            )
    return out


@HYP
@given(
    st.integers(1, 5), st.integers(1, 5),
    st.sampled_from((1.0, 1.5, 2.0, 2.5, 3.0)), st.sampled_from((1.0, 2.0, 0.5, 1.75)),
    st.sampled_from(("nearest_neighbor", "bilinear")), st.booleans(), st.sampled_from(("NCHW", "NHWC")),
)
def test_upsampling_against_loops(
    h: int, w: int, scale_h: float, scale_w: float, method: str, align: bool, layout: str
) -> None:
    x = np.random.default_rng(4).standard_normal((2, 3, h, w))
    out_h, out_w = round(h * scale_h), round(w * scale_w)
    assume(out_h > 0 and out_w > 0)
    expected = upsample_by_loops(x, out_h, out_w, method, align)
    data = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    attrs = {"scale_h": scale_h, "scale_w": scale_w, "method": method, "align_corners": align, "layout": layout}
    out = run("nn.upsampling", [data], **attrs)
    assert relation("nn.upsampling", [ttype(data)], **attrs) == ttype(out)
    got = out if layout == "NCHW" else out.transpose(0, 3, 1, 2)
    assert got.shape == expected.shape
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_upsampling_shapes_and_errors() -> None:
    t = TensorType((1, 3, 5, 7), "float16")
    # 7 * 1.5 = 10.5 rounds to even.
    assert relation("nn.upsampling", [t], scale_h=2.0, scale_w=1.5) == TensorType((1, 3, 10, 10), "float16")
    assert relation("nn.upsampling", [TensorType((ANY, 4, 4, 3))], scale_h=2, scale_w=2, layout="NHWC") == TensorType(
        (ANY, 8, 8, 3)
    )
    assert relation(
        "nn.upsampling", [TensorType((1, 2, 4, 4, 8))], scale_h=2.0, scale_w=2.0, layout="NCHW8c"
    ) == TensorType((1, 2, 8, 8, 8))
    with pytest.raises(RelayTypeError, match="not convertible to NCHW"):
        relation("nn.upsampling", [TensorType((1, 2, 3))], layout="NCW")
    with pytest.raises(RelayTypeError, match="method must be one of"):
        relation("nn.upsampling", [t], method="area")
    x16 = np.ones((1, 1, 2, 2), dtype=np.float16)
    assert run("nn.upsampling", [x16], scale_h=2.0, scale_w=2.0, method="bilinear").dtype == np.float16
    with pytest.raises(UnsupportedError, match="bicubic"):
        run("nn.upsampling", [x16], method="bicubic")
