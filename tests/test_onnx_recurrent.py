"""ONNX RNN, GRU and LSTM against onnxruntime (and onnx's reference evaluator where it implements the attributes).

Odd sizes (hidden 7, input 5, seq 3, batch 2), random non-zero weights and inputs; every direction, layout,
activation, clip, input_forget, peepholes, linear_before_reset, initial states and ragged `sequence_lens`
(constant and given at run time). Each case runs through the reference interpreter; a share of them also
through the compiled model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relay_tune import build
from relay_tune.errors import UnsupportedError
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import OnnxModelError
from relay_tune.interpreter import evaluate
from relay_tune.text import print_module

RNG = np.random.default_rng(20261207)
SEQ, BATCH, INPUT, HIDDEN = 3, 2, 5, 7
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    values = RNG.uniform(-scale, scale, size=shape).astype(np.float32)
    return np.where(np.abs(values) < 1e-3, np.float32(0.5), values)


@dataclass
class Case:
    """A one-node recurrent model: its weights are initializers (as exporters write them)."""

    id: str
    op: str
    direction: str = "forward"
    layout: int = 0
    opset: int = 14
    attrs: dict[str, Any] = field(default_factory=dict)
    bias: bool = True
    initial: bool = False
    peepholes: bool = False
    lens: list[int] | None = None
    lens_at_run_time: bool = False
    outputs: tuple[str, ...] = ("Y", "Y_h")
    compiled: bool = False
    reference: bool = False  # also compare with onnx.reference (which ignores clip, activations, lens, ...)


def make_model(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    dirs = 2 if case.direction == "bidirectional" else 1
    gates = GATES[case.op]
    x_shape = (BATCH, SEQ, INPUT) if case.layout else (SEQ, BATCH, INPUT)
    state_shape = (BATCH, dirs, HIDDEN) if case.layout else (dirs, BATCH, HIDDEN)
    feeds = {"X": rand(*x_shape, scale=2.0)}
    inits = {"W": rand(dirs, gates * HIDDEN, INPUT), "R": rand(dirs, gates * HIDDEN, HIDDEN)}
    names = ["X", "W", "R"]
    names.append("B" if case.bias else "")
    if case.bias:
        inits["B"] = rand(dirs, 2 * gates * HIDDEN)
    if case.lens is not None:
        lens = np.array(case.lens, dtype=np.int32)
        (feeds if case.lens_at_run_time else inits)["lens"] = lens
        names.append("lens")
    else:
        names.append("")
    if case.initial:
        feeds["h0"] = rand(*state_shape)
        names.append("h0")
        if case.op == "LSTM":
            feeds["c0"] = rand(*state_shape)
            names.append("c0")
    if case.peepholes:
        names += [""] * (7 - len(names))
        inits["P"] = rand(dirs, 3 * HIDDEN)
        names.append("P")
    while names and not names[-1]:
        names.pop()
    attrs = {"hidden_size": HIDDEN, "direction": case.direction, **case.attrs}
    if case.opset >= 14:
        attrs["layout"] = case.layout
    all_outputs = ["Y", "Y_h", "Y_c"][: 3 if case.op == "LSTM" else 2]
    node_outputs = [o if o in case.outputs else "" for o in all_outputs]
    while not node_outputs[-1]:
        node_outputs.pop()
    node = helper.make_node(case.op, names, node_outputs, **attrs)
    graph = helper.make_graph(
        [node], case.id,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in case.outputs],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 8
    return model, feeds


ALL_ACTIVATIONS = ["Sigmoid", "Tanh", "Relu", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
                   "Elu", "Softsign", "Softplus"]

CASES = [
    Case("lstm_forward", "LSTM", reference=True, compiled=True, outputs=("Y", "Y_h", "Y_c")),
    Case("lstm_opset7", "LSTM", opset=7, initial=True, outputs=("Y", "Y_h", "Y_c"), reference=True),
    Case("lstm_opset22_reverse", "LSTM", opset=22, direction="reverse", initial=True, outputs=("Y", "Y_h", "Y_c")),
    Case("lstm_bidirectional_layout1", "LSTM", direction="bidirectional", layout=1, initial=True, peepholes=True,
         outputs=("Y", "Y_h", "Y_c"), compiled=True),
    Case("lstm_peepholes_clip", "LSTM", peepholes=True, attrs={"clip": 0.7}, initial=True, outputs=("Y", "Y_h", "Y_c"),
         compiled=True),
    Case("lstm_input_forget", "LSTM", attrs={"input_forget": 1}, initial=True, outputs=("Y", "Y_c")),
    Case("lstm_activations", "LSTM", direction="bidirectional", outputs=("Y_h", "Y_c"), attrs={
        "activations": ["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "ScaledTanh", "Elu"],
        "activation_alpha": [0.3, 0.05, 0.8, 1.2], "activation_beta": [0.4, 0.9]}),
    Case("lstm_ragged_lens", "LSTM", direction="bidirectional", lens=[3, 1], initial=True, outputs=("Y", "Y_h", "Y_c"),
         compiled=True),
    Case("lstm_ragged_lens_layout1", "LSTM", direction="reverse", layout=1, lens=[2, 3], outputs=("Y", "Y_h", "Y_c")),
    Case("lstm_lens_at_run_time", "LSTM", direction="bidirectional", lens=[1, 2], lens_at_run_time=True,
         outputs=("Y", "Y_h", "Y_c"), compiled=True),
    Case("lstm_full_lens", "LSTM", lens=[3, 3], outputs=("Y", "Y_h", "Y_c")),
    Case("lstm_no_bias", "LSTM", bias=False, outputs=("Y",), reference=True),
    Case("gru_forward", "GRU", reference=True, compiled=True),
    Case("gru_linear_before_reset", "GRU", attrs={"linear_before_reset": 1}, initial=True, reference=True,
         compiled=True),
    Case("gru_bidirectional_layout1", "GRU", direction="bidirectional", layout=1, initial=True,
         attrs={"linear_before_reset": 1}),
    Case("gru_opset7_reverse", "GRU", opset=7, direction="reverse", initial=True),
    Case("gru_clip_activations", "GRU", direction="bidirectional", attrs={
        "clip": 0.9, "activations": ["Affine", "ThresholdedRelu", "Softplus", "Relu"],
        "activation_alpha": [0.6, 0.2], "activation_beta": [0.1]}),
    Case("gru_ragged_lens", "GRU", direction="bidirectional", lens=[2, 1], initial=True, compiled=True),
    Case("rnn_forward", "RNN", reference=True, compiled=True),
    Case("rnn_bidirectional_layout1", "RNN", direction="bidirectional", layout=1, initial=True, compiled=True),
    Case("rnn_reverse_opset22", "RNN", opset=22, direction="reverse", initial=True, outputs=("Y_h",)),
    Case("rnn_ragged_lens_clip", "RNN", direction="bidirectional", lens=[1, 3], attrs={"clip": 0.5}),
    *[Case(f"rnn_activation_{name.lower()}", "RNN", direction="bidirectional", attrs={
        "activations": [name, name], "activation_alpha": [0.7, 1.3], "activation_beta": [0.2, -0.4]})
      for name in ALL_ACTIVATIONS],
]


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs by onnxruntime, whose CPU kernels lack layout 1: such a model runs as its layout-0
    twin on transposed inputs, its outputs transposed back."""
    layout = next((a.i for a in model.graph.node[0].attribute if a.name == "layout"), 0)
    if layout:
        twin = onnx.ModelProto()
        twin.CopyFrom(model)
        next(a for a in twin.graph.node[0].attribute if a.name == "layout").i = 0
        for vi in twin.graph.input:
            dims = vi.type.tensor_type.shape.dim
            dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
        swapped = {n: (v if v.ndim == 1 else np.ascontiguousarray(v.swapaxes(0, 1))) for n, v in feeds.items()}
        outputs = _onnxruntime_run(twin, swapped)
        return [o.transpose(2, 0, 1, 3) if o.ndim == 4 else o.swapaxes(0, 1) for o in outputs]
    return _onnxruntime_run(model, feeds)


def _onnxruntime_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def as_list(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]


def check(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_recurrent_matches_onnxruntime(case: Case) -> None:
    model, feeds = make_model(case)
    want = onnxruntime_outputs(model, feeds)
    assert any(np.abs(w).max() > 0.05 for w in want)  # the case computes something
    if case.reference:
        check([np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)], want, "onnx.reference vs ORT")
    mod, _ = from_onnx(model)
    check(as_list(evaluate(mod, feeds)), want, "interpreter")
    if case.compiled:
        check(as_list(build(mod, "llvm").run(**feeds)), want, "compiled")


def test_unrolled_graph_has_one_input_projection_per_direction() -> None:
    # peepholes keep an LSTM unrolled (the default LSTM runs as nn.lstm_sequence: tests/test_lstm_sequence.py)
    model, _ = make_model(Case("lstm_bi", "LSTM", direction="bidirectional", initial=True, peepholes=True))
    mod, _ = from_onnx(model)
    text = print_module(mod)
    # 2 input projections over all steps, then one recurrent dense per step and direction
    assert text.count("nn.dense") == 2 + 2 * SEQ
    assert "nn.lstm_sequence" not in text
    assert f"newshape=[{SEQ * BATCH}, {INPUT}]" in text  # the steps' inputs as one matrix


def test_unknown_activation_is_a_clear_error() -> None:
    model, _ = make_model(Case("rnn_bad", "RNN", attrs={"activations": ["Gelu"]}))
    with pytest.raises(UnsupportedError, match="activation 'Gelu'"):
        from_onnx(model)


def test_activation_count_is_checked() -> None:
    model, _ = make_model(Case("gru_bad", "GRU", attrs={"activations": ["Sigmoid"]}))
    with pytest.raises(OnnxModelError, match="GRU needs 2 per direction"):
        from_onnx(model)


def test_weights_that_do_not_fit_are_a_clear_error() -> None:
    model, _ = make_model(Case("lstm_bad", "LSTM"))
    next(a for a in model.graph.node[0].attribute if a.name == "hidden_size").i = HIDDEN + 1
    with pytest.raises(OnnxModelError, match="do not fit"):
        from_onnx(model)
