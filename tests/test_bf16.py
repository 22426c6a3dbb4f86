"""bf16 builds (`--precision bf16`): bfloat16 weights and activations, float32 sums.

- the two-term bfloat16 dot product (`tir.DOT2_BF16_INTRINSIC`) sums exact float32 products on every lane count and
  operand layout; on an AVX512_BF16 target (checked by assembly, not run) it is vdpbf16ps, elsewhere widened FMAs;
- the pair-packed blocked convolution (`nn.contrib_conv2d_NCHWc_bf16`) matches its reference at the default and at
  sampled configs, on odd maps, stride 2 and padding;
- a bf16 build of a convolution and a dense product, run here through the widening path ("bf16-emulated"), is within
  bfloat16's rounding bound of the fp32 reference interpreter, every element;
- "bf16" on a CPU without AVX512_BF16 is a clear error (API and command line), the fp32 and bf16 workloads have
  different keys, and the build reports the relative error against the fp32 build.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from relay_tune import build
from relay_tune.codegen.llvm import build_llvm, emit_assembly
from relay_tune.compile import resolve_target
from relay_tune.compile.precision import relative_error_vs_fp32
from relay_tune.compile.primitive import build_primitive
from relay_tune.errors import UnsupportedError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call
from relay_tune.ir.traversal import post_order
from relay_tune.kernel import te, tir
from relay_tune.op.bf16 import OP_NAME as BF16_CONV
from relay_tune.op.bf16 import pack_bf16_weight, unpack_bf16_weight
from relay_tune.passes import precision_mode
from relay_tune.target import DotFeatures
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import tasks_from_module

RNG = np.random.default_rng(20261207)
X86 = platform.machine().lower() in ("x86_64", "amd64")
BF16 = ml_dtypes.bfloat16
HOST_HAS_BF16 = DotFeatures.for_target(resolve_target("llvm")).bf16
REPO = Path(__file__).resolve().parents[1]
# bfloat16 keeps 8 significant bits: rounding one operand is a relative error of at most 2^-8 / 2 = 2^-9, a product
# of two rounded operands at most 2^-8 + 2^-18 of the exact product.
PRODUCT_ERROR = 2.0**-8 + 2.0**-18


def _bf16(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32).astype(BF16)


def _dot_kernel(rows: int, pairs: int, lanes: int, weight_rows: bool) -> tir.PrimFunc:
    """`O[r, l] = sum_c dot2_bf16(X[r, 2c:2c+2], W[c, l, 0:2])` over a vectorized `l`; with `weight_rows=False` the
    weight is `V[c, k, l]` (a lane's two values `lanes` apart: the generic interleaving path)."""
    x = tir.Buffer("X", (rows, 2 * pairs), "bfloat16")
    w = tir.Buffer("W", (pairs, lanes, 2) if weight_rows else (pairs, 2, lanes), "bfloat16")
    o = tir.Buffer("O", (rows, lanes), "float32")
    r, lane, c = tir.LoopVar("r"), tir.LoopVar("l"), tir.LoopVar("c")
    row = [w[c, lane, k] if weight_rows else w[c, k, lane] for k in range(2)]
    dot = te.dot2_bf16_f32([x[r, c * 2 + k] for k in range(2)], row)
    body = tir.seq(tir.Store(o, (r, lane), tir.FloatImm(0.0, "float32")),
                   tir.For(c, pairs, tir.Store(o, (r, lane), o[r, lane] + dot)))
    return tir.PrimFunc("dot2bf", (x, w, o), tir.For(r, rows, tir.For(lane, lanes, body, tir.ForKind.VECTORIZED)))


@pytest.mark.parametrize("lanes", [1, 3, 8, 13, 16, 32])
@pytest.mark.parametrize("weight_rows", [True, False])
def test_dot2_bf16_intrinsic_sums_exact_products(lanes: int, weight_rows: bool) -> None:
    rows, pairs = 3, 7
    x, w = _bf16((rows, 2 * pairs)), _bf16((pairs, lanes, 2))
    o = np.zeros((rows, lanes), np.float32)
    weight = w if weight_rows else np.ascontiguousarray(w.transpose(0, 2, 1))
    build_llvm([_dot_kernel(rows, pairs, lanes, weight_rows)], resolve_target("llvm")).get("dot2bf")(x, weight, o)
    xs, ws = x.astype(np.float64).reshape(rows, pairs, 2), w.astype(np.float64)
    want = np.einsum("rck,clk->rl", xs, ws)
    magnitude = np.einsum("rck,clk->rl", np.abs(xs), np.abs(ws))
    # the products are exact in float32; only the 2 * pairs float32 additions round
    assert np.all(np.abs(o - want) <= 2 * pairs * 2.0**-24 * magnitude + 1e-30)


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "lanes", "present", "absent"), [
    ("llvm -mcpu=sapphirerapids", 16, ("vdpbf16ps", "zmm"), ()),
    ("llvm -mcpu=cooperlake", 16, ("vdpbf16ps",), ()),
    ("llvm -mcpu=sapphirerapids -mattr=-avx512f", 8, (), ("vdpbf16ps",)),  # no 512-bit parts: nothing of AVX-512
    ("llvm -mcpu=znver3", 8, ("vfmadd",), ("vdpbf16ps",)),
    ("llvm -mcpu=skylake-avx512", 16, ("vfmadd",), ("vdpbf16ps",)),
])
def test_dot2_bf16_instructions(target: str, lanes: int, present: tuple[str, ...], absent: tuple[str, ...]) -> None:
    asm = emit_assembly([_dot_kernel(2, 8, lanes, True)], resolve_target(target))
    for instruction in present:
        assert instruction in asm, instruction
    for instruction in absent:
        assert instruction not in asm, instruction


def test_pack_bf16_weight_round_trips() -> None:
    weight = RNG.standard_normal((20, 12, 3, 1)).astype(np.float32)
    packed = pack_bf16_weight(weight, 4, 8)
    assert packed.shape == (3, 3, 3, 1, 2, 8, 2) and packed.dtype == BF16
    unpacked = unpack_bf16_weight(packed).astype(np.float32)
    np.testing.assert_array_equal(unpacked[:20, :12], weight.astype(BF16).astype(np.float32))
    assert not unpacked[20:].any()


HEADER = '#[version = "0.0.5"]\n'
# A blocked convolution chain (stride 2, padding, odd map) and a dense product, bias-free so that every output
# element has the bound below; channel counts are whole blocks of 16 (AVX-512) and 8 (AVX2).
MODEL = HEADER + """def @main(%x: Tensor[(1, 32, 13, 11), float32], %d: Tensor[(3, 72), float32],
          %w1: Tensor[(48, 32, 3, 3), float32], %w2: Tensor[(32, 48, 1, 1), float32],
          %dw: Tensor[(24, 72), float32]) {
  %0 = nn.conv2d(%x, %w1, strides=[2, 2], padding=[1, 1], channels=48, kernel_size=[3, 3]);
  %1 = nn.conv2d(%0, %w2, channels=32, kernel_size=[1, 1]);
  %2 = nn.dense(%d, %dw, units=24);
  (%1, %2)
}
"""


def _model_params() -> dict[str, np.ndarray]:
    return {"w1": RNG.standard_normal((48, 32, 3, 3)).astype(np.float32) / 10,
            "w2": RNG.standard_normal((32, 48, 1, 1)).astype(np.float32) / 10,
            "dw": RNG.standard_normal((24, 72)).astype(np.float32) / 10}


def test_bf16_model_within_rounding_bound_of_fp32_reference() -> None:
    """Each output element is off the exact result by at most the rounding of its operands, layer by layer: with
    `m` the same network on |x| and |w| (what every product and sum is bounded by), the first convolution is within
    e1 = PRODUCT_ERROR + fp32 sums of `m`, the second (its input rounded once more, its weight once) within
    (1 + e1)(1 + PRODUCT_ERROR) - 1 + fp32 sums."""
    mod = parse_module(MODEL)
    params = _model_params()
    x = RNG.standard_normal((1, 32, 13, 11)).astype(np.float32)
    d = RNG.standard_normal((3, 72)).astype(np.float32)
    model = build(mod, "llvm", params=params, precision="bf16-emulated", build_cache=False)
    conv, dense = model.run(x=x, d=d)
    want_conv, want_dense = evaluate(mod, {"x": x, "d": d, **params})
    magnitudes = {"x": np.abs(x), "d": np.abs(d), **{k: np.abs(v) for k, v in params.items()}}
    bound_conv, bound_dense = evaluate(mod, magnitudes)
    fp32_sums = 300 * 2.0**-24  # float32 additions of the longest sum (288 and 48 terms), any order
    first = PRODUCT_ERROR + fp32_sums
    second = (1 + first) * (1 + PRODUCT_ERROR) - 1 + fp32_sums
    assert np.all(np.abs(np.asarray(conv) - np.asarray(want_conv)) <= second * np.asarray(bound_conv))
    assert np.all(np.abs(np.asarray(dense) - np.asarray(want_dense)) <= first * np.asarray(bound_dense))
    # bf16 did run: the outputs differ from fp32, by about bfloat16's precision
    error = relative_error_vs_fp32(model, mod, "llvm", params=params)
    assert 2.0**-16 < error < 2.0**-6, error


def test_bf16_tasks_are_bf16_products_with_their_own_keys() -> None:
    mod = parse_module(MODEL)
    target = resolve_target("llvm")
    from relay_tune.compile import bind_params  # the weights as constants, as builds see them

    bound = bind_params(mod, _model_params())
    fp32 = tasks_from_module(bound, target)
    bf16 = tasks_from_module(bound, target, precision="bf16-emulated")
    products = [t for t in bf16 if any(isinstance(n, Call) and n.op_name == BF16_CONV for n in post_order(t.func))]
    assert len(products) == 3  # both convolutions and the dense product
    assert {t.family for t in products} == {"conv2d_nchwc_bf16"}
    assert not {t.key for t in products} & {t.key for t in fp32}


def test_bf16_conv_kernel_matches_reference_at_sampled_configs() -> None:
    mod = parse_module(MODEL)
    from relay_tune.compile import bind_params

    bound = bind_params(mod, _model_params())
    tasks = [t for t in tasks_from_module(bound, resolve_target("llvm"), precision="bf16-emulated")
             if t.family == "conv2d_nchwc_bf16"]
    for task in tasks:
        inputs = [RNG.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
        expected = task.reference(inputs)[0]
        scale = np.abs(expected).max()
        for config in [task.default_config()] + [task.space.sample(RNG) for _ in range(3)]:
            got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
            np.testing.assert_allclose(got, expected, rtol=0, atol=600 * 2.0**-24 * scale, err_msg=str(config))


def test_bf16_needs_avx512_bf16() -> None:
    assert precision_mode("bf16", resolve_target("llvm -mcpu=sapphirerapids")) == "bf16"
    assert precision_mode("bf16-emulated", resolve_target("llvm -mcpu=znver3")) == "bf16"
    assert precision_mode(None, resolve_target("llvm -mcpu=znver3")) == "fp32"
    with pytest.raises(UnsupportedError, match="avx512bf16"):
        precision_mode("bf16", resolve_target("llvm -mcpu=znver3"))
    with pytest.raises(UnsupportedError, match="avx512bf16"):
        build(parse_module(MODEL), "llvm -mcpu=skylake-avx512", params=_model_params(), precision="bf16")


@pytest.mark.skipif(HOST_HAS_BF16, reason="this CPU has AVX512_BF16")
def test_cli_bf16_without_the_feature_is_one_clear_message(tmp_path: Path) -> None:
    model = tmp_path / "m.relay"
    model.write_text(HEADER + "def @main(%x: Tensor[(8, 16), float32], %w: Tensor[(4, 16), float32]) {\n"
                     "  nn.dense(%x, %w)\n}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "relay_tune", "build", str(model), "-o", str(tmp_path / "m.rtmod"),
                             "--precision", "bf16"], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relay-tune: ") and "avx512bf16" in lines[0], result.stderr
    assert "bf16-emulated" in lines[0] and "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "m.rtmod").exists()


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "present", "absent"), [
    ("llvm -mcpu=sapphirerapids -num-cores=2", ("vdpbf16ps",), ()),
    ("llvm -mcpu=haswell -num-cores=2", ("vfmadd",), ("vdpbf16ps",)),
])
def test_bf16_product_kernels_instructions(target: str, present: tuple[str, ...], absent: tuple[str, ...]) -> None:
    """The whole template's kernels (pair broadcast, weight rows, fused epilogue) as the build lowers them: vdpbf16ps
    where the target has it (assembly only: this host may not run it), widened FMAs elsewhere."""
    from relay_tune.compile import bind_params

    resolved = resolve_target(target)
    precision = "bf16" if DotFeatures.for_target(resolved).bf16 else "bf16-emulated"
    tasks = [t for t in tasks_from_module(bind_params(parse_module(MODEL), _model_params()), resolved,
                                          precision=precision) if t.family == "conv2d_nchwc_bf16"]
    assert len(tasks) == 3
    for task in tasks:
        asm = emit_assembly([task.lower(task.default_config())], resolved)
        for instruction in present:
            assert instruction in asm, (task.description, instruction)
        for instruction in absent:
            assert instruction not in asm, (task.description, instruction)
