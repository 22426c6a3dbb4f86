"""CumProd, BitwiseAnd/Or/Xor, Det, MeanVarianceNormalization, ReverseSequence, AffineGrid, Col2Im, MaxUnpool,
Pad's wrap mode, ConvTranspose's output_shape beyond the full result, the windows, DFT and STFT against onnx's
reference evaluator (or onnxruntime), through the interpreter and the compiled model, plus the Relay operators
behind them (`cumprod`, `bitwise_*`, `signal.window`, `signal.dft`) on their own: the text format, type errors,
and their kernels against their numpy references; and the operators whose output shape depends on input values:
folded from constants, refused otherwise.

Shapes are odd and data random and non-zero; only shape-deciding inputs (axes, sizes, lengths, steps) are
initializers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_onnx_ops_misc import C, Case, _check, _outputs, _reference, i64, rand

from relay_tune import build
from relay_tune.errors import RelayTypeError, UnsupportedError
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import OnnxModelError
from relay_tune.interpreter import evaluate
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types

F64 = "float64"

CUMPROD = [
    C("cumprod-axis1", "CumProd", {"x": rand(3, 7, 5, low=0.5, high=1.5)}, consts={"axis": i64(1).reshape(())},
      opset=26),
    C("cumprod-exclusive-reverse-neg-axis", "CumProd", {"x": rand(4, 9, low=-1.5, high=1.5)},
      consts={"axis": i64(-1).reshape(())}, attrs={"exclusive": 1, "reverse": 1}, opset=26),
    C("cumprod-int32-axis0", "CumProd", {"x": rand(5, 3, dtype="int32", low=-3, high=4)},
      consts={"axis": np.array(0, np.int32)}, opset=26),
    C("cumprod-float64-exclusive", "CumProd", {"x": rand(11, dtype=F64, low=0.5, high=1.5)},
      consts={"axis": i64(0).reshape(())}, attrs={"exclusive": 1}, opset=26),
]

BITWISE = [
    C("bitwise-and-int32-broadcast", "BitwiseAnd", {"a": rand(3, 1, 5, dtype="int32", low=-999, high=999),
                                                    "b": rand(4, 5, dtype="int32", low=-999, high=999)}),
    C("bitwise-or-uint8", "BitwiseOr", {"a": rand(7, 3, dtype="uint8", low=0, high=255),
                                        "b": rand(7, 3, dtype="uint8", low=0, high=255)}),
    C("bitwise-xor-int64", "BitwiseXor", {"a": rand(9, dtype="int64", low=-2**40, high=2**40),
                                          "b": rand(9, dtype="int64", low=-2**40, high=2**40)}),
    C("bitwise-and-uint64-large", "BitwiseAnd", {"a": np.array([2**63 + 5, 2**64 - 1, 12345], np.uint64),
                                                 "b": np.array([2**63 + 4, 2**62 + 3, 2**64 - 2], np.uint64)}),
    C("bitwise-xor-int16", "BitwiseXor", {"a": rand(2, 3, 5, dtype="int16", low=-30000, high=30000),
                                          "b": rand(5, dtype="int16", low=-30000, high=30000)}, opset=28),
]

NORMALISATION_AND_SEQUENCES = [
    C("det-3x3-batched", "Det", {"x": rand(2, 3, 3, 3)}, opset=11, rtol=1e-4, atol=1e-4),
    C("det-4x4-float64", "Det", {"x": rand(5, 4, 4, dtype=F64)}, opset=22, rtol=1e-10, atol=1e-10),
    C("det-1x1", "Det", {"x": rand(1, 1)}, opset=11),
    C("mvn-default-axes", "MeanVarianceNormalization", {"x": rand(2, 3, 5, 7)}, rtol=1e-4, atol=1e-4),
    C("mvn-axes-1", "MeanVarianceNormalization", {"x": rand(3, 6, 5)}, attrs={"axes": [1]}, opset=9,
      rtol=1e-4, atol=1e-4),
    C("reverse-sequence-time0", "ReverseSequence", {"x": rand(5, 3, 2), "lens": i64(5, 1, 3)},
      attrs={"batch_axis": 1, "time_axis": 0}, opset=10),
    C("reverse-sequence-batch0-int32", "ReverseSequence", {"x": rand(4, 7, dtype="int32", low=-50, high=50),
                                                           "lens": i64(7, 0, 2, 6)},
      attrs={"batch_axis": 0, "time_axis": 1}, opset=10),
]

IMAGE = [
    C("affine-grid-2d", "AffineGrid", {"theta": rand(2, 2, 3)}, consts={"size": i64(2, 3, 5, 7)}, opset=20,
      rtol=1e-5, atol=1e-5),
    C("affine-grid-3d-align-corners", "AffineGrid", {"theta": rand(3, 3, 4)}, consts={"size": i64(3, 1, 4, 3, 5)},
      attrs={"align_corners": 1}, opset=20, rtol=1e-5, atol=1e-5),
    C("col2im-strides-pads-dilations", "Col2Im", {"x": rand(2, 3 * 6, 15)},
      consts={"image": i64(7, 6), "block": i64(2, 3)},
      attrs={"strides": [2, 1], "pads": [1, 0, 0, 1], "dilations": [2, 1]}, opset=18),
    C("pad-wrap-axes", "Pad", {"x": rand(3, 4, 5)},
      consts={"pads": i64(2, 0, 7, 1), "value": np.array(0, np.float32), "axes": i64(0, -1)}, attrs={"mode": "wrap"},
      opset=19),
    # indices anywhere in each (batch, channel) plane of the unpooled (4, 6) shape, repeats included (the last
    # write wins)
    C("max-unpool-repeated-indices-output-shape", "MaxUnpool",
      {"x": rand(2, 3, 2, 3), "i": (np.arange(6).reshape(2, 3, 1, 1) * 24 + np.array([[0, 7, 7], [23, 12, 7]]))},
      consts={"shape": i64(2, 3, 6, 8)}, attrs={"kernel_shape": [3, 2], "strides": [2, 2], "pads": [0, 0, 1, 0]},
      opset=11),
    # output_shape beyond the full result (9, 8), within the stride: zeros at the end (and the bias over them),
    # two columns of them
    C("conv-transpose-output-shape-beyond-full", "ConvTranspose", {"x": rand(2, 3, 4, 3)},
      consts={"w": rand(3, 2, 3, 2), "b": rand(2)}, attrs={"strides": [2, 3], "output_shape": [10, 10]}, opset=11,
      rtol=1e-4, atol=1e-4, oracle="onnxruntime"),  # the reference evaluator's ConvTranspose rejects this case
    C("col2im-3d", "Col2Im", {"x": rand(1, 2 * 4, 16)}, consts={"image": i64(3, 4, 3), "block": i64(2, 1, 2)},
      opset=18),
]

SIGNAL = [
    C("hann-periodic-odd", "HannWindow", {}, consts={"size": i64(11).reshape(())}, opset=17),
    C("hamming-symmetric-float64", "HammingWindow", {}, consts={"size": np.array(9, np.int32)},
      attrs={"periodic": 0, "output_datatype": 11}, opset=17),
    C("blackman-periodic", "BlackmanWindow", {}, consts={"size": i64(16).reshape(())}, opset=17),
    C("dft-complex-axis2-length7", "DFT", {"x": rand(2, 3, 5, 2)}, consts={"len": i64(7).reshape(())},
      opset=17, attrs={"axis": 2}, rtol=1e-4, atol=1e-4),
    C("dft-real-onesided-truncated", "DFT", {"x": rand(3, 13, 1)},
      consts={"len": i64(9).reshape(()), "axis": i64(-2).reshape(())}, opset=20, attrs={"onesided": 1},
      rtol=1e-4, atol=1e-4),
    C("dft-inverse-axis0", "DFT", {"x": rand(6, 4, 2)}, consts={"len": i64(6).reshape(()), "axis": i64(0).reshape(())},
      opset=20, attrs={"inverse": 1}, rtol=1e-4, atol=1e-4),
    C("dft-irfft-odd-length", "DFT", {"x": rand(2, 5, 2, dtype=F64)},
      consts={"len": i64(9).reshape(()), "axis": i64(1).reshape(())}, opset=20, attrs={"inverse": 1, "onesided": 1},
      rtol=1e-9, atol=1e-9),
    C("stft-window-step3", "STFT", {"x": rand(2, 40, 1)},
      consts={"step": i64(3).reshape(()), "window": rand(8, low=0.1, high=1.0)}, opset=17, rtol=1e-4, atol=1e-4),
    C("stft-complex-twosided", "STFT", {"x": rand(1, 30, 2)},
      consts={"step": i64(4).reshape(()), "window": rand(6, low=0.1, high=1.0)}, attrs={"onesided": 0}, opset=17,
      rtol=1e-4, atol=1e-4),
]

CASES = CUMPROD + BITWISE + NORMALISATION_AND_SEQUENCES + IMAGE + SIGNAL


@pytest.mark.parametrize("case", CASES)
def test_interpreter_matches_onnx_reference(case: Case) -> None:
    model = case.model()
    mod, _ = from_onnx(model)
    _check(case, _outputs(evaluate(mod, case.inputs)), _reference(case, model))


@pytest.mark.parametrize("case", CASES)
def test_compiled_model_matches_onnx_reference(case: Case) -> None:
    model = case.model()
    mod, _ = from_onnx(model)
    _check(case, _outputs(build(mod, "llvm").run(**case.inputs)), _reference(case, model))


# --- the Relay operators on their own ------------------------------------------------------------------------


def _parse(text: str) -> Any:
    return parse_module('#[version = "0.0.5"]\n' + text)


RELAY_PROGRAMS = {
    "cumprod": ("fn (%x: Tensor[(4, 6), float32]) { cumprod(%x, axis=1, exclusive=True) }",
                {"x": rand(4, 6, low=0.5, high=1.5)}),
    "cumprod-flat-int64": ("fn (%x: Tensor[(3, 4), int32]) { cumprod(%x, dtype=\"int64\") }",
                           {"x": rand(3, 4, dtype="int32", low=-4, high=5)}),
    "bitwise": ("fn (%a: Tensor[(5, 3), int32], %b: Tensor[(3), int32]) "
                "{ bitwise_xor(bitwise_or(%a, %b), bitwise_and(%a, %b)) }",
                {"a": rand(5, 3, dtype="int32", low=-2**30, high=2**30),
                 "b": rand(3, dtype="int32", low=-99, high=99)}),
    "window": ("fn () { signal.window(kind=\"blackman\", size=13, periodic=False) }", {}),
    "dft": ("fn (%x: Tensor[(3, 10, 1), float32]) { signal.dft(%x, axis=1, length=10) }", {"x": rand(3, 10, 1)}),
}


@pytest.mark.parametrize("name", RELAY_PROGRAMS)
def test_relay_text_programs_compile_to_their_references(name: str) -> None:
    text, inputs = RELAY_PROGRAMS[name]
    mod = _parse(f"def @main{text[2:]}")
    want = evaluate(mod, inputs)
    got = build(mod, "llvm").run(**inputs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_bitwise_references_are_numpy_bitwise() -> None:
    a, b = rand(4, 5, dtype="int16", low=-3000, high=3000), rand(5, dtype="int16", low=-3000, high=3000)
    mod = _parse("def @main(%a: Tensor[(4, 5), int16], %b: Tensor[(5), int16]) { bitwise_and(%a, %b) }")
    np.testing.assert_array_equal(evaluate(mod, {"a": a, "b": b}), a & b)


def test_dft_reference_is_numpy_fft() -> None:
    x = rand(2, 7, 2)
    mod = _parse("def @main(%x: Tensor[(2, 7, 2), float32]) { signal.dft(%x, axis=1, length=7) }")
    spectrum = np.fft.fft(x[..., 0].astype(F64) + 1j * x[..., 1], axis=1)
    np.testing.assert_allclose(evaluate(mod, {"x": x}), np.stack([spectrum.real, spectrum.imag], -1), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize(("text", "message"), [
    ("def @main(%a: Tensor[(3), float32], %b: Tensor[(3), float32]) { bitwise_or(%a, %b) }", "integer tensors"),
    ("def @main(%x: Tensor[(4, 3), float32]) { signal.dft(%x, axis=0, length=4) }", r"\(\.\.\., n, 1 or 2\)"),
    ("def @main(%x: Tensor[(4, 2), float32]) { signal.dft(%x, axis=1, length=4) }", "axis must be a signal axis"),
    ("def @main() { signal.window(kind=\"kaiser\", size=4) }", "kind must be one of"),
    ("def @main(%x: Tensor[(4), bool]) { cumprod(%x) }", "booleans"),
])
def test_relay_type_errors_are_clear(text: str, message: str) -> None:
    with pytest.raises(RelayTypeError, match=message):
        infer_types(_parse(text))


@pytest.mark.parametrize(("op", "inputs", "consts", "attrs", "opset", "message"), [
    ("BitwiseAnd", {"a": rand(3), "b": rand(3)}, {}, {}, 18, "integer tensors"),
    ("ReverseSequence", {"x": rand(4, 3), "lens": i64(1, 2)}, {}, {}, 10, r"sequence_lens must have shape \(3,\)"),
    ("DFT", {"x": rand(2, 5, 2)}, {}, {"onesided": 1, "axis": 1}, 17, "one-sided DFT needs a real input"),
    ("STFT", {"x": rand(1, 10, 1)}, {"step": i64(2).reshape(())}, {}, 17, "needs a window or a frame_length"),
    ("MeanVarianceNormalization", {"x": rand(2, 3, 4, 5, dtype="int32")}, {}, {}, 13, "floating-point"),
    ("Det", {"x": rand(2, 3, 4)}, {}, {}, 11, "square matrices"),
    ("AffineGrid", {"theta": rand(2, 3, 4)}, {"size": i64(2, 1, 4, 4)}, {}, 20, r"theta \(N, 2, 3\)"),
    ("Col2Im", {"x": rand(1, 4, 5)}, {"image": i64(3, 3), "block": i64(2, 2)}, {}, 18, r"\(N, C \* 4, 4\)"),
])
def test_bad_nodes_get_one_clear_error(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray],
                                       attrs: dict[str, Any], opset: int, message: str) -> None:
    model = Case("bad", op, inputs, attrs=attrs, consts=consts, opset=opset).model()
    with pytest.raises(OnnxModelError, match=message):
        from_onnx(model)


# --- operators whose output shape depends on input values ----------------------------------------------------


@pytest.mark.parametrize(("op", "inputs", "attrs", "outputs", "opset"), [
    ("NonZero", {"x": np.array([[0, 3, 0], [1, 0, -2]], np.int32)}, {}, 1, 13),
    ("Unique", {"x": np.array([2.0, 1.0, 2.0, -3.0, 1.0], np.float32)}, {"sorted": 0}, 4, 11),
    ("Compress", {"x": rand(3, 4), "cond": np.array([True, False, True])}, {"axis": 0}, 1, 11),
    ("NonMaxSuppression", {"boxes": rand(1, 5, 4, low=0, high=1), "scores": rand(1, 1, 5, low=0, high=1),
                           "max": i64(3), "iou": np.array([0.5], np.float32)}, {}, 1, 11),
])
def test_data_dependent_operators_fold_when_their_inputs_are_constants(
        op: str, inputs: dict[str, np.ndarray], attrs: dict[str, Any], outputs: int, opset: int) -> None:
    case = Case("folded", op, {}, attrs=attrs, consts=inputs, outputs=outputs, opset=opset)
    model = case.model()
    mod, _ = from_onnx(model)
    want = _reference(case, model)
    got = _outputs(evaluate(mod, {}))
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_compress_with_a_constant_condition_takes_from_run_time_data() -> None:
    for attrs, cond in (({"axis": -1}, np.array([True, False, True, True, False])), ({}, np.arange(7) % 3 == 1)):
        case = Case("compress", "Compress", {"x": rand(2, 3, 5)}, attrs=attrs, consts={"cond": cond}, opset=11)
        model = case.model()
        mod, _ = from_onnx(model)
        _check(case, _outputs(evaluate(mod, case.inputs)), _reference(case, model))
        _check(case, _outputs(build(mod, "llvm").run(**case.inputs)), _reference(case, model))


@pytest.mark.parametrize(("op", "inputs", "outputs", "reason"), [
    ("NonZero", {"x": rand(3, 4)}, 1, "the number of non-zero elements"),
    ("Unique", {"x": rand(6)}, 1, "the number of distinct values"),
    ("Compress", {"x": rand(3, 4), "cond": np.array([True, False, True])}, 1,
     "the number of true conditions.*only when its condition is a constant"),
    ("NonMaxSuppression", {"boxes": rand(1, 5, 4), "scores": rand(1, 1, 5)}, 1, "the number of boxes kept"),
])
def test_data_dependent_operators_on_run_time_values_are_refused_naming_node_and_reason(
        op: str, inputs: dict[str, np.ndarray], outputs: int, reason: str) -> None:
    model = Case("dynamic", op, inputs, outputs=outputs, opset=13).model()
    with pytest.raises(UnsupportedError, match=rf"node #0 \({op}\): the output shape of {op} depends on the "
                                               rf"values of its inputs \({reason}"):
        from_onnx(model)


def test_det_of_a_large_matrix_is_refused_with_the_limit() -> None:
    model = Case("det", "Det", {"x": rand(5, 5)}, opset=11).model()
    with pytest.raises(UnsupportedError, match="Det of 5 x 5 matrices"):
        from_onnx(model)
