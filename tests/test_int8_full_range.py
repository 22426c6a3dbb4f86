"""Full-range int8 weights (pairs with |w0| + |w1| > 128, which saturate vpmaddubsw) on the integers.

- the two-term uint8 x int16 dot product (`tir.DOT2_INTRINSIC`) is exact on every lane count and operand layout, with
  int16 or int8 weight values (the int8 pairs widened as loaded), including the extremes, and lowers to vpmaddwd (no
  vpmaddubsw) on x86, its accumulator added by an inline-assembly vpaddd where the target has VEX forms (so LLVM
  cannot regroup the accumulation);
- `full_range_int8_mode` derives the path from the target: pairs and vpmaddwd on x86 without VNNI, four-byte products
  (vpdpbusd) with VNNI, float elsewhere;
- the packed int8 convolution with its weight in int8 pairs (what PlanLayouts makes of a full-range weight on such a
  target; widened by vpmovsxbw as loaded) is exact at its default config and at sampled configs, on odd channel
  counts, stride 2, zero-point padding and the extreme pairs (-128, -128), (127, -128); on VNNI targets the weight
  stays int8 and the kernel uses vpdpbusd;
- a QDQ model with full-range weights (onnxruntime's default quantization) built at the default opt_level runs every
  product on the integers and stays within one quantization step of onnxruntime's unoptimised QDQ graph.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from onnx import numpy_helper

from relay_tune import build
from relay_tune.codegen.llvm import build_llvm, emit_assembly, emit_llvm_ir
from relay_tune.compile import resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.errors import RelayTypeError
from relay_tune.frontend import from_onnx
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, TensorType
from relay_tune.ir.traversal import post_order
from relay_tune.kernel import te, tir, tir_eval
from relay_tune.op.quantized import OP_NAME as INT8_CONV
from relay_tune.op.quantized import (
    pack_int8_pairs,
    pack_int8_weight,
    pack_int16_weight,
    unpack_int8_weight,
)
from relay_tune.op.registry import get_op
from relay_tune.passes import PassConfig, full_range_int8_mode
from relay_tune.passes.pipeline import optimize
from relay_tune.passes.quantized_products import pairs_fit_int16
from relay_tune.tuning.relay_task import tasks_from_module
from tests.test_int8_kernels import (
    X86,
    _float_model,
    _inputs,
    _integer_products,
    _output_step,
    _padded_conv_module,
    _quantized,
    _session,
    _zero_point_conv,
)

RNG = np.random.default_rng(20261208)


def _dot2_kernel(rows: int, pairs: int, lanes: int, weight_rows: bool, data: str = "uint8",
                 weight: str = "int16") -> tir.PrimFunc:
    """`O[r, l] = sum_c dot2(X[r, 2c:2c+2], W[c, l, 0:2])` over a vectorized `l`; with `weight_rows=False` the
    weight is `V[c, k, l]` (the two values of a lane `lanes` apart: the generic interleaving path); `data`: uint8,
    or int16 holding uint8 values (the widened copy the pair-weight convolution reads); `weight`: int16, or int8
    (the pairs a full-range weight is stored in, widened as loaded)."""
    x = tir.Buffer("X", (rows, 2 * pairs), data)
    w = tir.Buffer("W", (pairs, lanes, 2) if weight_rows else (pairs, 2, lanes), weight)
    o = tir.Buffer("O", (rows, lanes), "int32")
    r, lane, c = tir.LoopVar("r"), tir.LoopVar("l"), tir.LoopVar("c")
    row = [w[c, lane, k] if weight_rows else w[c, k, lane] for k in range(2)]
    dot = te.dot2_u8s16_i32([x[r, c * 2 + k] for k in range(2)], row)
    body = tir.seq(tir.Store(o, (r, lane), tir.IntImm(0, "int32")),
                   tir.For(c, pairs, tir.Store(o, (r, lane), o[r, lane] + dot)))
    return tir.PrimFunc("dot2", (x, w, o), tir.For(r, rows, tir.For(lane, lanes, body, tir.ForKind.VECTORIZED)))


# x86-64: no vpmaddwd path (generic IR); core2: vpmaddwd with plain adds (no VEX); sandybridge: 128-bit VEX, the
# accumulator added by inline-assembly vpaddd on xmm; the host (AVX2 or AVX-512): ymm or zmm
@pytest.mark.parametrize("target", ["llvm", *(["llvm -mcpu=x86-64", "llvm -mcpu=core2", "llvm -mcpu=sandybridge"]
                                              if X86 else [])])
@pytest.mark.parametrize("lanes", [1, 3, 8, 13, 16, 32])
@pytest.mark.parametrize("weight_rows", [True, False])
@pytest.mark.parametrize(("data", "weight_dtype"), [("uint8", "int16"), ("int16", "int16"), ("uint8", "int8"),
                                                   ("int16", "int8")])
def test_dot2_intrinsic_is_exact(target: str, lanes: int, weight_rows: bool, data: str, weight_dtype: str) -> None:
    rows, pairs = 3, 5
    func = _dot2_kernel(rows, pairs, lanes, weight_rows, data, weight_dtype)
    x = RNG.integers(0, 256, (rows, 2 * pairs)).astype(data)
    w = RNG.integers(-128, 128, (pairs, lanes, 2)).astype(weight_dtype)
    w[0, 0], w[1, -1] = (-128, -128), (127, -128)  # int8's extremes
    if weight_dtype == "int16":
        w[2, 0] = (-32768, 32767)  # int16's too
    x[0], x[1, :4] = 255, (255, 0, 255, 255)
    o = np.zeros((rows, lanes), np.int32)
    weight = w if weight_rows else w.transpose(0, 2, 1).copy()
    build_llvm([func], resolve_target(target)).get("dot2")(x, weight, o)
    want = np.einsum("rck,clk->rl", x.reshape(rows, pairs, 2).astype(np.int64), w.astype(np.int64))
    np.testing.assert_array_equal(o, want)
    interpreted = np.zeros((rows, lanes), np.int32)
    tir_eval.evaluate(func, x, weight, interpreted)
    np.testing.assert_array_equal(interpreted, want)


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "register"), [("llvm -mcpu=haswell", "ymm"), ("llvm -mcpu=skylake-avx512", "zmm")])
def test_dot2_intrinsic_is_vpmaddwd(target: str, register: str) -> None:
    lanes = 16 if register == "zmm" else 8
    asm = emit_assembly([_dot2_kernel(2, 8, lanes, True)], resolve_target(target))
    assert "vpmaddwd" in asm
    assert register in asm
    assert "vpmaddubsw" not in asm


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "register", "opaque"), [
    ("llvm -mcpu=core2", "xmm", False), ("llvm -mcpu=sandybridge", "xmm", True), ("llvm -mcpu=haswell", "ymm", True),
    ("llvm -mcpu=skylake-avx512", "zmm", True)])
def test_dot2_accumulator_add_is_opaque_where_vex(target: str, register: str, opaque: bool) -> None:
    # the accumulator adds are inline assembly on VEX targets, so the machine combiner cannot regroup them
    lanes = {"xmm": 4, "ymm": 8, "zmm": 16}[register]
    func = _dot2_kernel(2, 8, lanes, True)
    ir_text = emit_llvm_ir([func], resolve_target(target))
    assert ("asm" in ir_text and "vpaddd $2, $1, $0" in ir_text) == opaque
    asm = emit_assembly([func], resolve_target(target))
    assert re.search(rf"vpaddd\s+%{register}", asm) if opaque else "vpaddd" not in asm and "paddd" in asm


@pytest.mark.parametrize(("target", "mode"), [
    ("llvm -mcpu=haswell", "int16"),
    ("llvm -mcpu=znver3", "int16"),
    ("llvm -mcpu=skylake-avx512", "int16"),   # AVX512BW without VNNI
    ("llvm -mcpu=icelake-server", "dot4"),
    ("llvm -mcpu=alderlake", "dot4"),         # AVX-VNNI
    ("llvm -mcpu=x86-64", "float"),           # SSE2 only: no vpmaddubsw, generic code
])
def test_full_range_mode_follows_the_target(target: str, mode: str) -> None:
    assert full_range_int8_mode(resolve_target(target)) == mode


def test_pass_config_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="full_range_int8"):
        PassConfig(full_range_int8="int4")


def test_pack_int16_weight_round_trips() -> None:
    weight = RNG.integers(-128, 128, (13, 7, 3, 3)).astype(np.int8)
    packed = pack_int16_weight(weight, 8, 8)
    assert packed.dtype == np.int16 and packed.shape == (2, 1, 3, 3, 4, 8, 2)
    np.testing.assert_array_equal(unpack_int8_weight(packed)[:13, :7], weight)
    assert not unpack_int8_weight(packed)[13:].any() and not unpack_int8_weight(packed)[:, 7:].any()
    int8_packed, _ = pack_int8_weight(weight, 8, 8)
    np.testing.assert_array_equal(unpack_int8_weight(int8_packed), unpack_int8_weight(packed))
    pairs = pack_int8_pairs(weight, 8, 8)  # the same layout, one byte a value
    assert pairs.dtype == np.int8 and pairs.shape == packed.shape
    np.testing.assert_array_equal(pairs, packed)
    with pytest.raises(ValueError, match="int8 pairs need an int8 weight"):
        pack_int8_pairs(weight.astype(np.int16), 8, 8)


@pytest.mark.parametrize(("weight", "message"), [
    (TensorType((2, 1, 3, 3, 3, 8, 3), "int8"), "bi/4, bo, 4"),      # neither quads nor pairs
    (TensorType((2, 1, 3, 3, 2, 8, 4), "int16"), "bi/2, bo, 2"),     # int16 comes in pairs only
])
def test_packed_weight_form_is_checked(weight: TensorType, message: str) -> None:
    data = TensorType((1, 1, 9, 9, 8), "uint8")
    with pytest.raises(RelayTypeError, match=re.escape(message)):
        get_op(INT8_CONV).type_relation([data, weight], get_op(INT8_CONV).make_attrs({}))


INT16_HOST = resolve_target("llvm -num-cores=2")
FULL_RANGE_CONVS = [  # cin, cout, kernel, stride, height, width, zero point
    (13, 19, 3, 2, 9, 11, 7),      # odd channels (padded to blocks), zero-point padding, stride 2
    (16, 24, 1, 1, 7, 5, 0),
    (8, 8, 3, 1, 5, 7, 200),
    (3, 16, 7, 2, 23, 21, 5),      # an image stem: blocks of 4 channels
    (24, 40, 3, 1, 6, 13, 255),
]


@pytest.mark.skipif(not X86 or full_range_int8_mode(INT16_HOST) != "int16", reason="an x86 host without VNNI")
@pytest.mark.parametrize(("cin", "cout", "k", "stride", "h", "w", "zero"), FULL_RANGE_CONVS)
def test_pair_packed_conv_is_exact(cin: int, cout: int, k: int, stride: int, h: int, w: int, zero: int) -> None:
    """A full-range weight is packed as int8 pairs (widened to int16 as each row is loaded) and the kernel is exact at
    its default config and at sampled configs, on the extreme pairs."""
    weight = RNG.integers(-128, 128, (cout, cin, k, k)).astype(np.int8)
    weight[0, :2], weight[-1, :2] = -128, 127  # the extreme pairs of channels 0 and 1
    weight[1, 0], weight[1, 1] = 127, -128
    pad = k // 2
    mod = _padded_conv_module((1, cin, h, w), weight, stride, pad, zero)
    tasks = [t for t in tasks_from_module(mod, INT16_HOST) if t.family != "injective"]
    assert [t.family for t in tasks] == ["conv2d_nchwc_int8"]
    task = tasks[0]
    (anchor,) = [n for n in post_order(task.func) if isinstance(n, Call) and n.op_name == INT8_CONV]
    packed_type = anchor.args[1].checked_type
    assert str(packed_type.dtype) == "int8" and packed_type.shape[-1] == 2
    rng = np.random.default_rng(cin * 100 + cout)
    inputs = []
    for spec in task.input_specs():
        if spec.dtype == "uint8":
            inputs.append(rng.integers(0, 256, spec.shape).astype(np.uint8))
        else:
            values = rng.integers(-128, 128, spec.shape).astype(spec.dtype)
            values.reshape(-1)[:4] = (-128, -128, 127, -128)
            inputs.append(values)
    inputs[0].reshape(-1)[:16] = 255
    expected = task.reference(inputs)[0]
    for config in [task.default_config()] + [task.space.sample(rng) for _ in range(4)]:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
        np.testing.assert_array_equal(got, expected, err_msg=str(config))
    x = RNG.integers(0, 256, (1, cin, h, w)).astype(np.uint8)
    want = _zero_point_conv(x, weight, stride, pad, zero)
    np.testing.assert_array_equal(build(mod, "llvm").run(x=x), want)
    np.testing.assert_array_equal(evaluate(mod, {"x": x}), want)


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "terms", "present", "absent"), [
    ("llvm -mcpu=haswell -num-cores=2", 2, ("vpmovsxbw", "vpmaddwd"), ("vpmaddubsw", "vpdpbusd")),
    ("llvm -mcpu=icelake-server -num-cores=2", 4, ("vpdpbusd",), ("vpmaddubsw",)),
])
def test_full_range_conv_kernel_instructions(target: str, terms: int, present: tuple[str, ...],
                                             absent: tuple[str, ...]) -> None:
    """The weight form and the kernel's instructions follow the target: int8 pairs widened as loaded (vpmovsxbw) and
    vpmaddwd without VNNI, the int8 quads and vpdpbusd (exact on full-range weights) with it."""
    weight = RNG.integers(-128, 128, (32, 32, 3, 3)).astype(np.int8)
    mod = _padded_conv_module((1, 32, 8, 8), weight, 1, 1, 3)
    resolved = resolve_target(target)
    (task,) = [t for t in tasks_from_module(mod, resolved) if t.family != "injective"]
    (anchor,) = [n for n in post_order(task.func) if isinstance(n, Call) and n.op_name == INT8_CONV]
    packed_type = anchor.args[1].checked_type
    assert str(packed_type.dtype) == "int8" and packed_type.shape[-1] == terms
    asm = emit_assembly([task.lower(task.default_config())], resolved)
    for instruction in present:
        assert instruction in asm, instruction
    for instruction in absent:
        assert instruction not in asm, instruction


@pytest.mark.parametrize("per_channel", [False, True])
def test_default_build_runs_full_range_products_on_the_integers(tmp_path: Any, per_channel: bool) -> None:
    """onnxruntime's default quantization (full-range weights): at opt_level 3 with an exact full-range path every
    product is an integer one (without one, only those whose pairs fit), and the host's build stays within one step
    of the unoptimised QDQ graph."""
    qmodel = _quantized(tmp_path, "conv", per_channel=per_channel, reduce_range=False)
    mod, _ = from_onnx(qmodel)
    weights = [numpy_helper.to_array(t) for t in qmodel.graph.initializer if numpy_helper.to_array(t).ndim == 4]
    fits = [pairs_fit_int16(w) for w in weights]
    assert not all(fits)  # full-range weights: some pair saturates vpmaddubsw
    for mode in ("int16", "dot4", "float"):
        products = _integer_products(optimize(mod, opt_level=3, layout_block=8, full_range_int8=mode))
        integer = [str(p.checked_type.dtype) == "int32" for p in products]
        assert len(products) == len(weights) == 2
        assert sorted(integer) == (sorted(fits) if mode == "float" else [True, True]), mode
        in_pairs = [p for p in products if p.op_name == INT8_CONV and p.args[1].checked_type.shape[-1] == 2]
        assert len(in_pairs) == (fits.count(False) if mode == "int16" else 0), mode  # only the weights that need it
        assert all(str(p.args[1].checked_type.dtype) == "int8" for p in in_pairs)  # widened as loaded, not stored
    compiled = build(mod, "llvm")
    x = _inputs(_float_model("conv"))
    np.testing.assert_allclose(compiled.run(x=x), _session(qmodel, False).run(None, {"x": x})[0], rtol=0,
                               atol=_output_step(qmodel) * 1.01)
