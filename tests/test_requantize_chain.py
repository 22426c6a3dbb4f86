"""QuantizedProducts folds the float chain between two requantizations (dequantize, a float batch norm's scale and
shift, the next quantize's divide) into one multiply-add before the `round`.

- on a QDQ model with a batch norm between its quantized convolutions (onnxruntime's quantizer leaves it float), no
  divide is left before a `round` and the build stays within one quantization step of onnxruntime's unoptimised
  QDQ graph;
- the fold stops at an intermediate value with other users (it is computed for them anyway), and stays within one
  step of the float graph; float models keep their chains.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relay_tune import build
from relay_tune.frontend import from_onnx
from relay_tune.ir import Call, Constant
from relay_tune.ir.traversal import post_order
from relay_tune.passes.pipeline import optimize
from relay_tune.text import parse_module

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(20261209)


def _bn_model() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> Conv, float."""
    w = RNG.normal(0, 0.3, (12, 5, 3, 3)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (7, 12, 1, 1)).astype(np.float32)
    scale, bias = RNG.uniform(0.5, 2.0, 12).astype(np.float32), RNG.normal(0, 0.2, 12).astype(np.float32)
    mean, var = RNG.normal(0, 0.1, 12).astype(np.float32), RNG.uniform(0.5, 1.5, 12).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (w2, "w2"), (scale, "s"), (bias, "b"),
                                                          (mean, "m"), (var, "v"))]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 9, 11])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 9, 11])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _quantized(tmp_path: Any, model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": RNG.uniform(-1.5, 1.0, (1, 5, 9, 11)).astype(np.float32)} for _ in range(6)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, str(src))
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, reduce_range=True)
    return onnx.load(str(dst))


def _calls(mod: Any) -> list[Call]:
    return [n for _, f in mod.items() for n in post_order(f) if isinstance(n, Call)]


def test_batch_norm_between_requantizations_folds(tmp_path: Any) -> None:
    qmodel = _quantized(tmp_path, _bn_model())
    mod, _ = from_onnx(qmodel)
    before = _calls(optimize(mod, opt_level=0))
    assert any(c.op_name == "divide" for c in before)
    fused = optimize(mod, opt_level=3, layout_block=8)
    calls = _calls(fused)
    assert any(c.op_name == "nn.contrib_conv2d_NCHWc_int8" for c in calls)
    divided = [c.args[0] for c in calls if c.op_name == "round" and isinstance(c.args[0], Call)
               and c.args[0].op_name == "divide"]
    # the one divide left quantizes the float model input (a parameter of its function): nothing to fold it with
    assert len(divided) == 1 and not isinstance(divided[0].args[0], Call)
    x = RNG.uniform(-1.5, 1.0, (1, 5, 9, 11)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = ort.InferenceSession(qmodel.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    inits = {t.name: numpy_helper.to_array(t) for t in qmodel.graph.initializer}
    last = next(n for n in qmodel.graph.node if "y" in n.output)
    step = float(inits[last.input[1]])
    np.testing.assert_allclose(build(mod, "llvm").run(x=x), exact, rtol=0, atol=step * 1.01)


_CHAIN = '''#[version = "0.0.5"]
def @main(%q: Tensor[(1, 4, 3, 3), uint8]) {{
  %0 = multiply(subtract(cast(%q, dtype="float32"), 3f), 0.1f);
  %1 = nn.conv2d(%0, meta[relay.Constant][0], channels=4, kernel_size=[1, 1]);
  %2 = round(divide(%1, 0.05f));
  %3 = cast(clip(add(%2, 3f), a_min=0f, a_max=255f), dtype="uint8");
  %4 = multiply(subtract(cast(%3, dtype="float32"), 3f), 0.5f);
  %5 = add(%4, meta[relay.Constant][1]);
  %6 = round(divide(%5, 0.25f));
  {tail}
}}'''


@pytest.mark.parametrize(("tail", "shared"), [
    ("cast(clip(%6, a_min=0f, a_max=255f), dtype=\"uint8\")", False),
    ("(%6, %4)", True),   # the dequantized %4 has another user: computed anyway, the fold starts above it
])
def test_chain_fold_is_within_a_step(tail: str, shared: bool) -> None:
    """An integer product (a dequantized input times an int8-grid weight) and the chain after its requantization;
    opt_level 2 (no QuantizedProducts) is the float graph the fold must stay within one step of."""
    weight = (RNG.integers(-64, 65, (4, 4, 1, 1)) * 0.01).astype(np.float32)  # pairs that fit: on every target
    weight[0, 0, 0, 0] = 0.64
    shift = RNG.normal(0, 1, (4, 1, 1)).astype(np.float32)
    mod = parse_module(_CHAIN.format(tail=tail), constants=[weight, shift])
    calls = _calls(optimize(mod, opt_level=3))
    assert any(c.op_name == "nn.conv2d" and str(c.checked_type.dtype) == "int32" for c in calls)
    assert not [c for c in calls if c.op_name == "divide"]
    halves = [c for c in calls if c.op_name == "multiply" and isinstance(c.args[1], Constant)
              and c.args[1].data.size == 1 and float(c.args[1].data) == 0.5]
    assert bool(halves) == shared  # %4 itself is left for its other user, not folded into a copy
    q = RNG.integers(0, 256, (1, 4, 3, 3)).astype(np.uint8)
    got, want = build(mod, "llvm").run(q=q), build(mod, "llvm", opt_level=2).run(q=q)
    got0 = got[0] if isinstance(got, (list, tuple)) else got
    want0 = want[0] if isinstance(want, (list, tuple)) else want
    assert np.abs(got0.astype(np.int64) - want0.astype(np.int64)).max() <= 1


def test_float_models_keep_their_chains() -> None:
    mod = parse_module('''#[version = "0.0.5"]
def @main(%x: Tensor[(1, 4, 3, 3), float32]) {
  round(divide(add(multiply(%x, 0.5f), 1f), 0.25f))
}''')
    assert any(c.op_name == "divide" for c in _calls(optimize(mod, opt_level=3)))
