"""`nn.lstm_sequence` (an LSTM layer's steps looped inside one fixed kernel) against onnxruntime.

Default-gate LSTMs import as one `nn.lstm_sequence`; each case compiles the model (one and two cores: the
directions in parallel or in turn) and compares every output with onnxruntime's on random non-zero inputs: odd
hidden sizes (one panel, several panels with zero-filled columns), forward, reverse and bidirectional, both
layouts, batch above 1, initial states given or not, no bias, a constant `sequence_lens` that covers every step.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relay_tune import build
from relay_tune.compile.task_list import model_tasks
from relay_tune.errors import RelayTypeError
from relay_tune.frontend import from_onnx
from relay_tune.interpreter import evaluate
from relay_tune.ir import TensorType
from relay_tune.kernel import tir
from relay_tune.kernel.recurrent import PARALLEL_MIN_MACS, fixed_kernel, fixed_kernel_call
from relay_tune.op import get_op
from relay_tune.op.recurrent import LSTM_SEQUENCE, pack_recurrent_weights, unpack_recurrent_weights
from relay_tune.passes import optimize
from relay_tune.runtime.vm import load_model
from relay_tune.target import Target
from relay_tune.text import print_module

RNG = np.random.default_rng(7)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    values = RNG.uniform(-scale, scale, size=shape).astype(np.float32)
    return np.where(np.abs(values) < 1e-3, np.float32(0.5), values)


@dataclass(frozen=True)
class Case:
    id: str
    hidden: int
    direction: str = "forward"
    seq: int = 5
    batch: int = 1
    input: int = 6
    layout: int = 0
    initial: bool = False
    bias: bool = True
    full_lens: bool = False


CASES = [
    Case("h7_forward", 7),
    Case("h17_reverse_initial", 17, "reverse", initial=True),  # 68 gate columns: two panels, the last zero-filled
    Case("h33_bidirectional_batch3", 33, "bidirectional", batch=3, initial=True, seq=4),
    Case("h5_bidirectional_layout1", 5, "bidirectional", batch=2, layout=1, initial=True),
    Case("h16_bidirectional_no_bias", 16, "bidirectional", bias=False, seq=1),
    Case("h9_full_lens", 9, "bidirectional", batch=2, full_lens=True),
    Case("h65_bidirectional_parallel", 65, "bidirectional", seq=16),  # work enough for a parallel region
]


def make_model(case: Case, layout: int | None = None) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The one-node LSTM model of `case` and its feeds (`layout` overrides the case's; same weights per case)."""
    layout = case.layout if layout is None else layout
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    dirs = 2 if case.direction == "bidirectional" else 1
    g, h = 4 * case.hidden, case.hidden

    def draw(*shape: int, scale: float = 1.0) -> np.ndarray:
        values = rng.uniform(-scale, scale, size=shape).astype(np.float32)
        return np.where(np.abs(values) < 1e-3, np.float32(0.5), values)

    x = draw(case.seq, case.batch, case.input, scale=2.0)
    inits = {"W": draw(dirs, g, case.input), "R": draw(dirs, g, h)}
    names = ["X", "W", "R", "B" if case.bias else "", "lens" if case.full_lens else ""]
    if case.bias:
        inits["B"] = draw(dirs, 2 * g)
    if case.full_lens:
        inits["lens"] = np.full(case.batch, case.seq, np.int32)
    feeds = {"X": x.swapaxes(0, 1).copy() if layout else x}
    if case.initial:
        h0, c0 = draw(dirs, case.batch, h), draw(dirs, case.batch, h)
        feeds["h0"], feeds["c0"] = (v.swapaxes(0, 1).copy() if layout else v for v in (h0, c0))
        names += ["h0", "c0"]
    while not names[-1]:
        names.pop()
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=h, direction=case.direction,
                            layout=layout)
    graph = helper.make_graph(
        [node], case.id,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("Y", "Y_h", "Y_c")],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, feeds


def onnxruntime_outputs(case: Case) -> list[np.ndarray]:
    """onnxruntime's outputs in the case's layout (its CPU LSTM lacks layout 1: the layout-0 twin, transposed)."""
    model, feeds = make_model(case, layout=0)
    outputs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    if case.layout:
        y, y_h, y_c = outputs
        return [y.transpose(2, 0, 1, 3), y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)]
    return [np.asarray(o) for o in outputs]


def check(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for name, g, w in zip(("Y", "Y_h", "Y_c"), got, want):
        assert g.shape == w.shape, f"{what} {name}: {g.shape} vs {w.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{what} {name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_lstm_sequence_matches_onnxruntime(case: Case) -> None:
    model, feeds = make_model(case)
    want = onnxruntime_outputs(case)
    assert all(np.abs(w).max() > 0.05 for w in want)
    mod, _ = from_onnx(model)
    text = print_module(mod)
    assert text.count(LSTM_SEQUENCE) == 1 and text.count("nn.dense") == 1  # one projection, one loop kernel
    check([np.asarray(v) for v in evaluate(mod, feeds)], want, "interpreter")
    for cores in (1, 2):
        compiled = build(mod, target=Target.host(num_cores=cores))
        check([np.asarray(v) for v in compiled.run(**feeds)], want, f"compiled on {cores} core(s)")


def test_lstm_sequence_is_one_kernel_and_one_tuning_task(tmp_path: Path) -> None:
    model, feeds = make_model(Case("bi", 12, "bidirectional", seq=9))
    mod, _ = from_onnx(model)
    target = Target.host(num_cores=2)
    compiled = build(mod, target=target)
    compiled.save(tmp_path / "lstm.rtmod")  # the fixed kernel travels in the saved model like any other
    for got, want in zip(load_model(tmp_path / "lstm.rtmod").run(**feeds), compiled.run(**feeds)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert sum("lstm_sequence" in t.description for t in compiled.plan.tasks) == 1
    # the projection, the loop kernel and one slice per output (Y, Y_h, Y_c): not one call per step and direction
    assert compiled.num_kernel_calls <= 5
    tunable = model_tasks(optimize(mod), target).kernels
    # the loop kernel is tuned in the `lstm` family's space (`tests/test_lstm_schedules.py`)
    assert sum("lstm_sequence" in s.description for s in tunable) == 1
    assert any("dense" in s.description for s in tunable)  # the input projection is still tuned


@pytest.mark.parametrize(("hidden", "seq", "cores", "kind"), [
    (65, 16, 2, tir.ForKind.PARALLEL), (65, 16, 1, tir.ForKind.SERIAL), (8, 3, 2, tir.ForKind.SERIAL)])
def test_directions_run_in_parallel_where_worth_it(hidden: int, seq: int, cores: int, kind: tir.ForKind) -> None:
    model, _ = make_model(Case("bi", hidden, "bidirectional", seq=seq))
    mod, _ = from_onnx(model)
    target = Target.host(num_cores=cores)
    (spec,) = [s for s in model_tasks(optimize(mod), target).specs if fixed_kernel_call(s.func) is not None]
    loop = fixed_kernel(spec.func, target, "k").body
    assert isinstance(loop, tir.For) and loop.extent == 2 and loop.kind is kind
    assert (seq * 4 * hidden * hidden >= PARALLEL_MIN_MACS) == (hidden == 65)


def test_packing_round_trips() -> None:
    r = rand(2, 4 * 17, 17)
    packed = pack_recurrent_weights(r, 64)
    assert packed.shape == (2, 2, 17, 64) and not packed[:, 1, :, 4:].any()
    np.testing.assert_array_equal(unpack_recurrent_weights(packed, 4 * 17), r)


def test_lstm_sequence_types_are_checked() -> None:
    relation = get_op(LSTM_SEQUENCE).type_relation
    assert relation is not None
    attrs = get_op(LSTM_SEQUENCE).make_attrs({"hidden": 8, "reverse": [0]})
    good = [TensorType((3, 1, 1, 32), "float32"), TensorType((1, 1, 8, 32), "float32"),
            TensorType((1, 1, 8), "float32"), TensorType((1, 1, 8), "float32")]
    assert relation(good, attrs) == TensorType((3, 1, 1, 16), "float32")
    with pytest.raises(RelayTypeError, match="packed into column panels"):
        relation([good[0], TensorType((1, 1, 8, 16), "float32"), *good[2:]], attrs)
    with pytest.raises(RelayTypeError, match="h0 must have shape"):
        relation([*good[:2], TensorType((1, 2, 8), "float32"), good[3]], attrs)
    with pytest.raises(RelayTypeError, match="float32"):
        relation([TensorType((3, 1, 1, 32), "float16"), *good[1:]], attrs)
