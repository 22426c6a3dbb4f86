"""Small ONNX models built with `onnx.helper`, so the ONNX benchmarks run without downloading anything.

    python experiments/onnx_models.py --out-dir experiments/models        # writes small_cnn.onnx, mlp.onnx

`small_cnn` is a VGG-style image classifier (conv/batch-norm/relu/max-pool stages, global average
pooling, a fully connected layer, softmax); `mlp` is a two-layer perceptron with GELU. Weights are
seeded random values with the scale of a trained network (He initialisation), so activations stay in
a realistic range and numerical comparisons are meaningful.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _GraphBuilder:
    """Accumulates nodes and initializers; names are generated so blocks can be stacked."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def weight(self, prefix: str, array: np.ndarray) -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv_bn_relu(self, x: str, cin: int, cout: int) -> str:
        fan_in = cin * 9
        w = self.weight("conv_w", self.rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / fan_in))
        b = self.weight("conv_b", self.rng.standard_normal(cout) * 0.01)
        y = self.node("Conv", [x, w, b], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        scale = self.weight("bn_scale", 1.0 + 0.1 * self.rng.standard_normal(cout))
        shift = self.weight("bn_shift", 0.1 * self.rng.standard_normal(cout))
        mean = self.weight("bn_mean", 0.1 * self.rng.standard_normal(cout))
        var = self.weight("bn_var", self.rng.uniform(0.5, 1.5, cout))
        y = self.node("BatchNormalization", [y, scale, shift, mean, var], epsilon=1e-5)
        return self.node("Relu", [y])

    def model(
        self, inputs: list[onnx.ValueInfoProto], outputs: dict[str, Sequence[int]], name: str
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name, inputs,
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(shape)) for o, shape in outputs.items()],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="relay-tune")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def small_cnn(
    batch: int = 1, image: int = 32, widths: Sequence[int] = (16, 32, 64), classes: int = 10, seed: int = 0
) -> onnx.ModelProto:
    """Input `input: (batch, 3, image, image)` float32 -> class probabilities `(batch, classes)`."""
    g = _GraphBuilder(seed)
    x = "input"
    cin = 3
    for stage, cout in enumerate(widths):
        x = g.conv_bn_relu(x, cin, cout)
        if stage < len(widths) - 1:
            x = g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        cin = cout
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    fc_w = g.weight("fc_w", g.rng.standard_normal((classes, cin)) * np.sqrt(1.0 / cin))
    fc_b = g.weight("fc_b", np.zeros(classes))
    x = g.node("Gemm", [x, fc_w, fc_b], transB=1)
    x = g.node("Softmax", [x], axis=1)
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, image, image])]
    return g.model(inputs, {x: (batch, classes)}, "small_cnn")


def mlp(batch: int = 8, features: int = 256, hidden: int = 512, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """Input `input: (batch, features)` -> logits `(batch, classes)`: MatMul/Add/Gelu/MatMul/Add."""
    g = _GraphBuilder(seed)
    w1 = g.weight("w1", g.rng.standard_normal((features, hidden)) * np.sqrt(2.0 / features))
    b1 = g.weight("b1", np.zeros(hidden))
    w2 = g.weight("w2", g.rng.standard_normal((hidden, classes)) * np.sqrt(1.0 / hidden))
    b2 = g.weight("b2", np.zeros(classes))
    x = g.node("Add", [g.node("MatMul", ["input", w1]), b1])
    # Gelu only exists from opset 20; spell it out as exporters for older opsets do.
    half = g.weight("half", np.array(0.5))
    one = g.weight("one", np.array(1.0))
    inv_sqrt2 = g.weight("inv_sqrt2", np.array(1.0 / np.sqrt(2.0)))
    gate = g.node("Add", [g.node("Erf", [g.node("Mul", [x, inv_sqrt2])]), one])
    x = g.node("Mul", [g.node("Mul", [x, gate]), half])
    x = g.node("Add", [g.node("MatMul", [x, w2]), b2])
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, features])]
    return g.model(inputs, {x: (batch, classes)}, "mlp")


MODELS = {"small_cnn": small_cnn, "mlp": mlp}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the example ONNX models.")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "models")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, build in MODELS.items():
        path = args.out_dir / f"{name}.onnx"
        onnx.save(build(batch=args.batch), str(path))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
