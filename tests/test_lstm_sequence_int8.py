"""`nn.lstm_sequence_int8`: onnxruntime's DynamicQuantizeLSTM on its integers, against onnxruntime.

Each case quantizes a random one-node LSTM with onnxruntime's `quantize_dynamic` and compares the compiled model
(one and two cores) and the reference interpreter with onnxruntime on random non-zero inputs: odd hidden sizes
(not multiples of the vector width nor of 4; one panel, several panels with zero-filled columns), forward,
reverse and bidirectional, batch above 1, initial states given or not, per-tensor and per-column weight scales.
With 7-bit weights (`reduce_range`) onnxruntime's u8 x s8 products are exact on every CPU, and, run on one
thread, it quantizes the state of the whole batch at once, as this kernel does: the outputs then agree to float
rounding. With full-range weights onnxruntime's AVX2 products saturate, so those are checked against the
reference interpreter, which computes the exact integer sums.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relay_tune import build
from relay_tune.errors import RelayTuneError, RelayTypeError
from relay_tune.frontend import from_onnx
from relay_tune.interpreter import evaluate
from relay_tune.ir import TensorType
from relay_tune.op import get_op
from relay_tune.op.recurrent import (
    LSTM_SEQUENCE,
    LSTM_SEQUENCE_INT8,
    pack_int8_recurrent_weights,
    quantize_state,
    unpack_int8_recurrent_weights,
)
from relay_tune.target import Target
from relay_tune.text import print_module

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


@dataclass(frozen=True)
class Case:
    id: str
    hidden: int
    direction: str = "bidirectional"
    seq: int = 5
    batch: int = 1
    input: int = 6
    initial: bool = False
    per_channel: bool = False
    reduce_range: bool = True


CASES = [
    Case("h7_forward_batch2", 7, "forward", batch=2),
    Case("h17_reverse_initial", 17, "reverse", initial=True),  # 68 gate columns: two panels, the last zero-filled
    Case("h33_bidirectional_batch3", 33, batch=3, initial=True, seq=4),
    Case("h5_bidirectional_per_channel", 5, per_channel=True, input=3),
    Case("h65_bidirectional_parallel", 65, seq=16, input=21),  # work enough for a parallel region
]


def quantized_model(case: Case, folder: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's LSTM quantized by onnxruntime's `quantize_dynamic` (a DynamicQuantizeLSTM node), and its feeds."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    dirs = 2 if case.direction == "bidirectional" else 1
    g, h = 4 * case.hidden, case.hidden

    def draw(*shape: int, scale: float = 1.0) -> np.ndarray:
        values = rng.uniform(-scale, scale, size=shape).astype(np.float32)
        return np.where(np.abs(values) < 1e-3, np.float32(0.5), values)

    inits = {"W": draw(dirs, g, case.input, scale=0.5), "R": draw(dirs, g, h, scale=0.5), "B": draw(dirs, 2 * g)}
    feeds = {"X": draw(case.seq, case.batch, case.input, scale=2.0)}
    names = ["X", "W", "R", "B"]
    if case.initial:
        feeds["h0"], feeds["c0"] = draw(dirs, case.batch, h), draw(dirs, case.batch, h)
        names += ["", "h0", "c0"]
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=h, direction=case.direction)
    graph = helper.make_graph(
        [node], case.id,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("Y", "Y_h", "Y_c")],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    src, dst = folder / "lstm.onnx", folder / "lstm.int8.onnx"
    onnx.save(model, str(src))
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8,
                                  op_types_to_quantize=["LSTM"], per_channel=case.per_channel,
                                  reduce_range=case.reduce_range)
    quantized = onnx.load(str(dst))
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    return quantized, feeds


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime on one thread: with more, it splits the batch's rows among them and quantizes each share of
    the state on its own."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feeds)]


def check(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for name, g, w in zip(("Y", "Y_h", "Y_c"), got, want):
        assert g.shape == w.shape, f"{what} {name}: {g.shape} vs {w.shape}"
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * max(1.0, float(np.abs(w).max())),
                                   err_msg=f"{what} {name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_int8_lstm_matches_onnxruntime(case: Case, tmp_path: Path) -> None:
    model, feeds = quantized_model(case, tmp_path)
    want = onnxruntime_outputs(model, feeds)
    assert all(np.abs(w).max() > 0.05 for w in want)
    mod, _ = from_onnx(model)
    text = print_module(mod)
    assert text.count(LSTM_SEQUENCE_INT8) == 1 and f"{LSTM_SEQUENCE}(" not in text
    check([np.asarray(v) for v in evaluate(mod, feeds)], want, "interpreter")
    for cores in (1, 2):
        compiled = build(mod, target=Target.host(num_cores=cores))
        check([np.asarray(v) for v in compiled.run(**feeds)], want, f"compiled on {cores} core(s)")


def test_full_range_weights_match_the_reference(tmp_path: Path) -> None:
    """Full-range int8 weights (pairs beyond vpmaddubsw's int16 range): the kernel's sums are exact. On one core
    and on two (the directions in parallel), and on a target without vpmaddwd (generic integer code)."""
    case = Case("h19_full_range", 19, batch=2, initial=True, seq=7, input=11, reduce_range=False)
    model, feeds = quantized_model(case, tmp_path)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    recurrent = weights[model.graph.node[0].input[2]].astype(np.int32)
    assert (np.abs(recurrent[:, 0:18:2]) + np.abs(recurrent[:, 1:18:2])).max() > 128
    mod, _ = from_onnx(model)
    want = [np.asarray(v) for v in evaluate(mod, feeds)]
    for target in (Target.host(num_cores=1), Target.host(num_cores=2), Target.parse("llvm -mcpu=x86-64")):
        got = [np.asarray(v) for v in build(mod, target=target).run(**feeds)]
        check(got, want, f"compiled for {target}")


def test_sequence_lens_keeps_the_float_layer(tmp_path: Path) -> None:
    """A layer the looped kernel does not take (here: sequences shorter than the input) stays the float LSTM of
    the dequantized weights, within onnxruntime's activation quantisation."""
    model, feeds = quantized_model(Case("h9_lens", 9, batch=2), tmp_path)
    node = model.graph.node[0]
    node.input[4] = "lens"
    model.graph.initializer.append(numpy_helper.from_array(np.array([5, 3], np.int32), "lens"))
    want = onnxruntime_outputs(model, feeds)
    mod, _ = from_onnx(model)
    assert LSTM_SEQUENCE_INT8 not in print_module(mod)
    got = [np.asarray(v) for v in build(mod, target=Target.host(num_cores=2)).run(**feeds)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=0.03 * float(np.abs(w).max()))
    assert np.all(got[0][3:, :, 1] == 0)  # the second sequence's steps past its length


def test_int8_packing_round_trips_and_state_quantization() -> None:
    rng = np.random.default_rng(3)
    r = rng.integers(-127, 128, size=(2, 17, 68)).astype(np.int8)
    packed = pack_int8_recurrent_weights(r, 64)
    assert packed.shape == (2, 2, 9, 64, 2) and not packed[:, 1, :, 4:].any() and not packed[:, :, 8, :, 1].any()
    np.testing.assert_array_equal(unpack_int8_recurrent_weights(packed, 17, 68), r)
    h = np.array([[-0.5, 0.25, 1.0]], np.float32)
    q, scale, zero = quantize_state(h)
    assert scale == np.float32(1.5) / np.float32(255) and zero == 85
    np.testing.assert_array_equal(q, [[0, 127, 255]])  # 0.25 / scale = 42.5: halves round to even
    q, scale, zero = quantize_state(np.zeros((1, 3), np.float32))  # an empty range: scale 1, everything at 0
    assert scale == 1 and zero == 0 and not q.any()


def test_int8_lstm_types_are_checked() -> None:
    relation = get_op(LSTM_SEQUENCE_INT8).type_relation
    assert relation is not None
    attrs = get_op(LSTM_SEQUENCE_INT8).make_attrs({"hidden": 7, "reverse": [0]})
    good = [TensorType((3, 1, 1, 28), "float32"), TensorType((1, 1, 4, 28, 2), "int8"),
            TensorType((1, 28), "float32"), TensorType((1, 28), "int32"),
            TensorType((1, 1, 7), "float32"), TensorType((1, 1, 7), "float32")]
    assert relation(good, attrs) == TensorType((3, 1, 1, 14), "float32")
    with pytest.raises(RelayTypeError, match="packed into column panels"):
        relation([good[0], TensorType((1, 1, 3, 28, 2), "int8"), *good[2:]], attrs)
    with pytest.raises(RelayTypeError, match="int8"):
        relation([good[0], TensorType((1, 1, 4, 28, 2), "float32"), *good[2:]], attrs)
    with pytest.raises(RelayTypeError, match="rsum must be int32"):
        relation([*good[:3], TensorType((1, 28), "float32"), *good[4:]], attrs)
    with pytest.raises(RelayTypeError, match="c0 must have shape"):
        relation([*good[:5], TensorType((1, 2, 7), "float32")], attrs)


def test_bad_weight_scales_are_a_clear_error(tmp_path: Path) -> None:
    """A scale that is neither per direction nor per direction and column is reported, not a numpy traceback."""
    model, _ = quantized_model(Case("h6_bad_scale", 6), tmp_path)
    scale_name = model.graph.node[0].input[10]
    (scale,) = [i for i in model.graph.initializer if i.name == scale_name]
    scale.CopyFrom(numpy_helper.from_array(np.full(5, 0.01, np.float32), scale_name))
    with pytest.raises(RelayTuneError):
        from_onnx(model)
