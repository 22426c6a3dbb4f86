"""Winograd convolution F(m x m, 3 x 3): the two data transforms of a 3x3, stride-1 convolution.

A 3x3 convolution computed in output tiles of m x m pixels reads (m + 2) x (m + 2) = alpha x alpha input pixels
per tile. Winograd's minimal filtering computes the tile as

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A        (g: the 3x3 kernel, d: the input tile, (.): element-wise)

so that, per tile and per pair of channels, alpha^2 products replace 9 m^2: with the element-wise product summed
over input channels, the convolution becomes alpha^2 independent matrix products

    M[e, p, k] = sum_c V[e, p, c] * U[e, c, k]       (e: one of the alpha^2 frequencies, p: a tile)

which `nn.batch_matmul` runs. The operators here are the two sides of that product:

- `nn.winograd_input_transform(data)`: data (`NCHW` or `NCHW{b}c`) -> V, shape `(alpha^2, N * TH * TW, C)`,
  with the convolution's zero padding (`padding`) applied and the last tiles of a map that m does not divide
  padded with zeros too (TH = ceil(OH / m) tile rows, TW likewise);
- `nn.winograd_output_transform(M)`: `(alpha^2, N * TH * TW, K)` -> the convolution's output (`out_layout`,
  `NCHW` or `NCHW{b}c`, cropped to `out_height` x `out_width`).

The kernel transform U = G g G^T of a constant weight is computed once by the graph pass that introduces these
operators (`relay_tune.passes.winograd`, with `weight_transform` below), so it costs nothing at run time.

Tile sizes: m = 2 (alpha 4: 2.25x fewer multiplications than the direct convolution) and m = 4 (alpha 6, points
0, +-1, +-2 and infinity: 4x fewer). Both computes write every output element as an explicit sum with constant
coefficients, chosen per transform position by a `Select` on that position; the `winograd` schedule template
unrolls those positions, so each coefficient is a literal and the shared partial sums of one tile (the rows of
B^T d, the columns of M A) are computed once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np

from relay_tune.errors import RelayTypeError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import ANY, TensorType, Type
from relay_tune.op.nn import Layout, _pad_axes, _padding, _tensor_arg, fmt_shape
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

TILE_SIZES = (2, 4)

# Fusion: the input transform is a kernel of its own (OPAQUE): as an injective op it would absorb the output
# transform, bias and ReLU of the convolution before it (VGG's conv -> relu -> conv), and each of its outputs would
# recompute alpha^2 of that transform's. The output transform takes element-wise epilogues only, as a convolution
# does (OUT_ELEMWISE_FUSABLE): bias, activation, a residual add; not a concatenation or a layout transform.
register_op(
    "nn.winograd_input_transform", 1, OpPattern.OPAQUE,
    {"tile_size": 2, "padding": (0, 0, 0, 0), "data_layout": "NCHW"}, "relay.attrs.WinogradInputAttrs",
    description="3x3 Winograd input transform: data -> (alpha*alpha, tiles, channels)",
)
register_op(
    "nn.winograd_output_transform", 1, OpPattern.OUT_ELEMWISE_FUSABLE,
    {"tile_size": 2, "out_height": None, "out_width": None, "out_layout": "NCHW"}, "relay.attrs.WinogradOutputAttrs",
    required=("out_height", "out_width"),
    description="3x3 Winograd output transform: (alpha*alpha, tiles, channels) -> the convolution's output",
)


@functools.cache
def winograd_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T, G, B^T) of F(m x m, 3 x 3), float64: A^T (m, alpha), G (alpha, 3), B^T (alpha, alpha)."""
    if m == 2:
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
        g = [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    elif m == 4:
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
        g = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
             [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
        bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
              [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
    else:
        raise UnsupportedError(f"Winograd tile size must be one of {TILE_SIZES}, got {m}")
    return np.array(at, np.float64), np.array(g, np.float64), np.array(bt, np.float64)


def _tile_size(attrs: Attrs, op_name: str) -> int:
    m = attrs["tile_size"]
    if isinstance(m, bool) or not isinstance(m, int) or m not in TILE_SIZES:
        raise RelayTypeError(f"tile_size must be one of {TILE_SIZES}, got {m!r}", op_name=op_name)
    return m


def _tiles(size: int, m: int) -> int:
    return -(-size // m)


def _plain_or_blocked(name: str, op_name: str) -> Layout:
    """`NCHW` or `NCHW{b}c`, the layouts the transforms read and write."""
    if not re.fullmatch(r"NCHW(\d+c)?", name):
        raise RelayTypeError(f"layout must be NCHW or NCHW<b>c, got {name!r}", op_name=op_name)
    return Layout.parse(name, op_name)


def weight_transform(weight: np.ndarray, m: int) -> np.ndarray:
    """U = G g G^T of an OIHW 3x3 kernel, as (alpha*alpha, I, O): the right operand of the per-frequency product
    (computed in float64, returned in the weight's dtype, C-contiguous).

    Computed as one matrix product, kron(G, G) (alpha^2 x 9) times the kernels as (9, I*O): row i*alpha+j of
    kron(G, G) holds G[i, a] * G[j, b] at column a*3+b, so each output is sum_ab G[i,a] g[a,b] G[j,b]: one BLAS
    call over all kernels (a graph build transforms every 3x3 convolution's weights)."""
    _, g, _ = winograd_matrices(m)
    alpha = m + 2
    out_channels, in_channels = weight.shape[0], weight.shape[1]
    g64 = np.asarray(g, dtype=np.float64)
    columns = weight.reshape(out_channels, in_channels, 9).transpose(2, 1, 0).reshape(9, in_channels * out_channels)
    u = np.kron(g64, g64) @ columns.astype(np.float64)
    return u.astype(weight.dtype).reshape(alpha * alpha, in_channels, out_channels)


# ================================================================================================
# Type relations
# ================================================================================================


@type_relation("nn.winograd_input_transform")
def winograd_input_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    op_name = "nn.winograd_input_transform"
    data = _tensor_arg(arg_types[0], op_name, "data")
    m = _tile_size(attrs, op_name)
    layout = _plain_or_blocked(str(attrs["data_layout"]), op_name)
    n, c, h, w = layout.to_primal_shape(data.shape, "NCHW", op_name, "data")
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, op_name)
    if ANY in (n, h, w):
        return TensorType(((m + 2) ** 2, ANY, c), data.dtype)
    oh, ow = int(h) + pt + pb - 2, int(w) + pl + pr - 2  # type: ignore[call-overload]
    if oh < 1 or ow < 1:
        raise RelayTypeError(f"a 3x3 window does not fit the padded {fmt_shape(data.shape)} data", op_name=op_name)
    return TensorType(((m + 2) ** 2, int(n) * _tiles(oh, m) * _tiles(ow, m), c), data.dtype)  # type: ignore[call-overload]


@type_relation("nn.winograd_output_transform")
def winograd_output_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    op_name = "nn.winograd_output_transform"
    data = _tensor_arg(arg_types[0], op_name, "data")
    m = _tile_size(attrs, op_name)
    layout = _plain_or_blocked(str(attrs["out_layout"]), op_name)
    oh, ow = int(attrs["out_height"]), int(attrs["out_width"])  # type: ignore[call-overload]
    if data.ndim != 3 or data.shape[0] != (m + 2) ** 2:
        raise RelayTypeError(f"data must be ({(m + 2) ** 2}, tiles, channels), got {fmt_shape(data.shape)}",
                             op_name=op_name)
    tiles, k = data.shape[1], data.shape[2]
    per_image = _tiles(oh, m) * _tiles(ow, m)
    if tiles is ANY:
        n = ANY
    elif int(tiles) % per_image:  # type: ignore[call-overload]
        raise RelayTypeError(f"{tiles} tiles are not whole images of {per_image} tiles ({oh}x{ow} outputs)",
                             op_name=op_name)
    else:
        n = int(tiles) // per_image  # type: ignore[call-overload]
    return TensorType(layout.from_primal_shape((n, k, oh, ow), "NCHW", op_name, "output"), data.dtype)


# ================================================================================================
# References (numpy, float64 inside)
# ================================================================================================


@reference("nn.winograd_input_transform")
def winograd_input_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    op_name = "nn.winograd_input_transform"
    (data,) = inputs
    m = int(attrs["tile_size"])  # type: ignore[call-overload]
    alpha = m + 2
    _, _, bt = winograd_matrices(m)
    x = _plain_or_blocked(str(attrs["data_layout"]), op_name).to_primal_array(data, "NCHW").astype(np.float64)
    n, c, h, w = x.shape
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, op_name)
    th, tw = _tiles(h + pt + pb - 2, m), _tiles(w + pl + pr - 2, m)
    padded = np.zeros((n, c, th * m + 2, tw * m + 2))
    rows, cols = min(h, th * m + 2 - pt), min(w, tw * m + 2 - pl)
    padded[:, :, pt:pt + rows, pl:pl + cols] = x[:, :, :rows, :cols]
    # tiles[n, c, ty, tx, a, b] = padded[n, c, ty*m + a, tx*m + b]
    tiles = np.empty((n, c, th, tw, alpha, alpha))
    for a in range(alpha):
        for b in range(alpha):
            tiles[..., a, b] = padded[:, :, a:a + th * m:m, b:b + tw * m:m]
    v = np.einsum("ia,nctxab,jb->ijntxc", bt, tiles, bt)
    return v.reshape(alpha * alpha, n * th * tw, c).astype(data.dtype)


@reference("nn.winograd_output_transform")
def winograd_output_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    op_name = "nn.winograd_output_transform"
    (data,) = inputs
    m = int(attrs["tile_size"])  # type: ignore[call-overload]
    alpha = m + 2
    at, _, _ = winograd_matrices(m)
    oh, ow = int(attrs["out_height"]), int(attrs["out_width"])  # type: ignore[call-overload]
    th, tw = _tiles(oh, m), _tiles(ow, m)
    k = data.shape[2]
    n = data.shape[1] // (th * tw)
    mm = data.astype(np.float64).reshape(alpha, alpha, n, th, tw, k)
    y = np.einsum("ia,abntxk,jb->nktixj", at, mm, at).reshape(n, k, th * m, tw * m)[:, :, :oh, :ow]
    layout = _plain_or_blocked(str(attrs["out_layout"]), op_name)
    return np.ascontiguousarray(layout.from_primal_array(y, "NCHW")).astype(data.dtype)


# ================================================================================================
# Tensor-expression computes
# ================================================================================================
# Imported here, not at the top, as in `relay_tune.op.nn`: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import LayoutMap, named, static_shape  # noqa: E402
from relay_tune.op.registry import compute  # noqa: E402

INPUT_TAG = "winograd_input"
OUTPUT_TAG = "winograd_output"
"""Tags of the two transform stages: the `winograd` schedule family recognises its kernels by them."""


def _combine(terms: Sequence[tuple[float, tir.PrimExpr]]) -> tir.PrimExpr:
    """sum(coefficient * value) with the zero coefficients left out and +-1 as additions and subtractions."""
    total: tir.PrimExpr | None = None
    for coef, value in terms:
        if coef == 0:
            continue
        if coef in (1, -1):
            term = value
        else:
            term = value * te.const(float(coef), value.dtype)
        if total is None:
            total = -term if coef == -1 else term
        else:
            total = total - term if coef == -1 else total + term
    assert total is not None, "a Winograd matrix row of zeros"
    return total


def _by_position(position: tir.PrimExpr, cases: Sequence[tir.PrimExpr]) -> tir.PrimExpr:
    """cases[position] as a chain of selects (the template unrolls `position`, so one case remains per copy)."""
    result = cases[-1]
    for i in range(len(cases) - 2, -1, -1):
        result = te.if_then_else(te.equal(position, i), cases[i], result)
    return result


@compute("nn.winograd_input_transform")
def _winograd_input_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (data,) = inputs
    m = int(attrs["tile_size"])  # type: ignore[call-overload]
    alpha = m + 2
    _, _, bt = winograd_matrices(m)
    layout = LayoutMap.parse(str(attrs["data_layout"]), "data layout")
    block = layout.factor("C")
    assert isinstance(out_type, TensorType)
    h, w = (data.shape[2], data.shape[3])
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, "nn.winograd_input_transform")
    th, tw = _tiles(h + pt + pb - 2, m), _tiles(w + pl + pr - 2, m)
    # The padded input, covering whole tiles (the last tiles of a map m does not divide read zeros): a separate
    # stage the template inlines, so that a padded read is a select and no padded copy is written.
    pad_h, pad_w = th * m + 2, tw * m + 2
    pads = {2: (pt, pad_h - pt - h), 3: (pl, pad_w - pl - w)}
    padded = _pad_axes(data, pads, te.const(0, data.dtype), layout)

    def body(e: tir.PrimExpr, p: tir.PrimExpr, c: tir.PrimExpr) -> tir.PrimExpr:
        n = p // (th * tw)
        ty = (p // tw) % th
        tx = p % tw
        if block:
            cb, ci = c // block, c % block

            def read(a: int, b: int) -> tir.PrimExpr:
                return padded[n, cb, ty * m + a, tx * m + b, ci]
        else:
            def read(a: int, b: int) -> tir.PrimExpr:
                return padded[n, c, ty * m + a, tx * m + b]
        # rows[i][b] = sum_a BT[i, a] d[a, b]: shared by every position (i, j) of row i once unrolled
        rows = [[_combine([(bt[i, a], read(a, b)) for a in range(alpha)]) for b in range(alpha)]
                for i in range(alpha)]
        cases = [_combine([(bt[j, b], rows[i][b]) for b in range(alpha)]) for i in range(alpha) for j in range(alpha)]
        return _by_position(e, cases)

    return te.compute(static_shape(out_type), named(["e", "p", "c"], body), "winograd_input", INPUT_TAG)


@compute("nn.winograd_output_transform")
def _winograd_output_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (data,) = inputs
    m = int(attrs["tile_size"])  # type: ignore[call-overload]
    alpha = m + 2
    at, _, _ = winograd_matrices(m)
    layout = LayoutMap.parse(str(attrs["out_layout"]), "output layout")
    block = layout.factor("C")
    oh, ow = int(attrs["out_height"]), int(attrs["out_width"])  # type: ignore[call-overload]
    th, tw = _tiles(oh, m), _tiles(ow, m)

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        pos = layout.logical(idx)
        y, x = pos["H"], pos["W"]
        p = pos["N"] * (th * tw) + (y // m) * tw + x // m
        k = pos["C"]

        def read(a: int, b: int) -> tir.PrimExpr:
            return data[a * alpha + b, p, k]
        # cols[a][j] = sum_b M[a, b] AT[j, b]: shared by the m rows of one output column once unrolled
        cols = [[_combine([(at[j, b], read(a, b)) for b in range(alpha)]) for j in range(m)] for a in range(alpha)]
        cases = [_by_position(x % m, [_combine([(at[i, a], cols[a][j]) for a in range(alpha)]) for j in range(m)])
                 for i in range(m)]
        return _by_position(y % m, cases)

    del block
    names = layout.axis_names({"N": "n", "C": "k", "H": "h", "W": "w"})
    return te.compute(static_shape(out_type), named(names, body), "winograd_output", OUTPUT_TAG)


__all__ = ["INPUT_TAG", "OUTPUT_TAG", "TILE_SIZES", "weight_transform", "winograd_matrices"]
