"""Well-known network architectures as ONNX graphs built with `onnx.helper` (no download), batch 1.

    from relay_tune.testing.onnx_zoo import ZOO
    model = ZOO["resnet50"]()            # onnx.ModelProto, input "input" (1, 3, 224, 224)

ResNet-50 v1, MobileNet v2, SqueezeNet 1.1, a ShuffleNet v2 (1.0x)-style net, DenseNet-121, VGG-16, an
Inception (GoogLeNet)-style net and one BERT-base encoder layer (sequence 128, hidden 768, 12 heads); and, in
RELATIVES, ResNet-18 and MobileNet v1. Layer shapes
follow the published architectures; weights are seeded random values at a trained network's scale (He
initialisation for convolutions and fully connected layers, batch-norm statistics near 1 and 0), so activations
stay in a realistic range through the whole depth and comparisons between engines are meaningful.

SMALL holds two models of a few milliseconds or less for tests and quick checks: `small_cnn`, a VGG-style
classifier on 32x32 images, and `mlp`, a two-layer perceptron with GELU. `network(name)` builds any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Net:
    """Accumulates nodes and initializers with generated names."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, prefix: str, array: np.ndarray, dtype: type = np.float32) -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(array).astype(dtype), name))
        return name

    def node(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs: object) -> str | list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0] + "_node", **attrs))
        return names[0] if outputs == 1 else names

    def op(self, op_type: str, inputs: Sequence[str], **attrs: object) -> str:
        out = self.node(op_type, inputs, **attrs)
        assert isinstance(out, str)
        return out

    # -- layers ----------------------------------------------------------------------------------------------------
    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None, group: int = 1,
             bias: bool = False) -> str:
        pad = k // 2 if pad is None else pad
        fan_in = cin // group * k * k
        w = self.const("w", self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in))
        inputs = [x, w] + ([self.const("b", 0.01 * self.rng.standard_normal(cout))] if bias else [])
        return self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)

    def bn(self, x: str, c: int, gamma: float = 1.0) -> str:
        scale = self.const("bn_scale", gamma * (1.0 + 0.1 * self.rng.standard_normal(c)))
        shift = self.const("bn_shift", 0.1 * self.rng.standard_normal(c))
        mean = self.const("bn_mean", 0.1 * self.rng.standard_normal(c))
        var = self.const("bn_var", self.rng.uniform(0.5, 1.5, c))
        return self.op("BatchNormalization", [x, scale, shift, mean, var], epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def relu6(self, x: str) -> str:
        return self.op("Clip", [x, self.const("zero", np.array(0.0)), self.const("six", np.array(6.0))])

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: Callable[[str], str] | None = None, pad: int | None = None) -> str:
        y = self.bn(self.conv(x, cin, cout, k, stride, pad, group), cout)
        return act(y) if act is not None else y

    def maxpool(self, x: str, k: int = 3, stride: int = 2, pad: int = 1) -> str:
        return self.op("MaxPool", [x], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def classifier(self, x: str, cin: int, classes: int = 1000) -> str:
        x = self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)
        return self.fc(x, cin, classes)

    def fc(self, x: str, cin: int, cout: int) -> str:
        w = self.const("fc_w", self.rng.standard_normal((cout, cin)) * np.sqrt(1.0 / cin))
        return self.op("Gemm", [x, w, self.const("fc_b", np.zeros(cout))], transB=1)

    def model(self, inputs: dict[str, Sequence[int]], outputs: dict[str, Sequence[int]], name: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="relay-tune")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


IMAGE = {"input": (1, 3, 224, 224)}
LOGITS = (1, 1000)


def resnet50() -> onnx.ModelProto:
    """ResNet-50 v1: bottleneck blocks with the stride on the first 1x1 convolution."""
    n = Net(1)
    x = n.maxpool(n.conv_bn("input", 3, 64, 7, 2, act=n.relu))
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            y = n.conv_bn(x, cin, width, 1, stride, act=n.relu)
            y = n.conv_bn(y, width, width, 3, act=n.relu)
            # A trained residual branch's last batch norm scales its output down (else depth compounds it).
            y = n.bn(n.conv(y, width, width * 4, 1), width * 4, gamma=0.2)
            shortcut = n.conv_bn(x, cin, width * 4, 1, stride) if block == 0 else x
            x = n.relu(n.op("Add", [y, shortcut]))
            cin = width * 4
    return n.model(IMAGE, {n.classifier(x, cin): LOGITS}, "resnet50_v1")


def resnet18() -> onnx.ModelProto:
    """ResNet-18 v1: basic blocks (two 3x3 convolutions), the stride on the first of a stage's first block."""
    n = Net(11)
    x = n.maxpool(n.conv_bn("input", 3, 64, 7, 2, act=n.relu))
    cin = 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if block == 0 and stage > 0 else 1
            y = n.conv_bn(x, cin, width, 3, stride, act=n.relu)
            y = n.bn(n.conv(y, width, width, 3), width, gamma=0.2)  # a trained residual branch's scale
            shortcut = n.conv_bn(x, cin, width, 1, stride) if stride != 1 or cin != width else x
            x = n.relu(n.op("Add", [y, shortcut]))
            cin = width
    return n.model(IMAGE, {n.classifier(x, cin): LOGITS}, "resnet18_v1")


def mobilenet_v1() -> onnx.ModelProto:
    """MobileNet v1 (1.0x): a 3x3 convolution, then 13 depthwise 3x3 + pointwise 1x1 pairs, batch norm and ReLU."""
    n = Net(12)
    x = n.conv_bn("input", 3, 32, 3, 2, act=n.relu)
    cin = 32
    for cout, stride in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
                         (512, 1), (512, 1), (1024, 2), (1024, 1)):
        x = n.conv_bn(x, cin, cin, 3, stride, group=cin, act=n.relu)
        x = n.conv_bn(x, cin, cout, 1, act=n.relu)
        cin = cout
    return n.model(IMAGE, {n.classifier(x, cin): LOGITS}, "mobilenet_v1")


def mobilenet_v2() -> onnx.ModelProto:
    n = Net(2)
    x = n.conv_bn("input", 3, 32, 3, 2, act=n.relu6)
    cin = 32
    for t, c, repeats, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                             (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(repeats):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = n.conv_bn(x, cin, hidden, 1, act=n.relu6) if t != 1 else x
            y = n.conv_bn(y, hidden, hidden, 3, stride, group=hidden, act=n.relu6)
            y = n.conv_bn(y, hidden, c, 1)
            x = n.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = n.conv_bn(x, cin, 1280, 1, act=n.relu6)
    return n.model(IMAGE, {n.classifier(x, 1280): LOGITS}, "mobilenet_v2")


def squeezenet11() -> onnx.ModelProto:
    n = Net(3)
    x = n.maxpool(n.relu(n.conv("input", 3, 64, 3, 2, pad=0, bias=True)), pad=0)
    cin = 64

    def fire(x: str, cin: int, squeeze: int, expand: int) -> str:
        s = n.relu(n.conv(x, cin, squeeze, 1, bias=True))
        e1 = n.relu(n.conv(s, squeeze, expand, 1, bias=True))
        e3 = n.relu(n.conv(s, squeeze, expand, 3, bias=True))
        return n.op("Concat", [e1, e3], axis=1)

    for stage, settings in enumerate((((16, 64), (16, 64)), ((32, 128), (32, 128)),
                                      ((48, 192), (48, 192), (64, 256), (64, 256)))):
        for squeeze, expand in settings:
            x = fire(x, cin, squeeze, expand)
            cin = 2 * expand
        if stage < 2:
            x = n.maxpool(x, pad=0)
    x = n.relu(n.conv(x, cin, 1000, 1, bias=True))
    x = n.op("Flatten", [n.op("GlobalAveragePool", [x])], axis=1)
    return n.model(IMAGE, {x: LOGITS}, "squeezenet1_1")


def shufflenet_v2() -> onnx.ModelProto:
    """ShuffleNet v2 1.0x: channel split, two branches, concatenation and channel shuffle
    (reshape-transpose-reshape)."""
    n = Net(4)
    x = n.maxpool(n.conv_bn("input", 3, 24, 3, 2, act=n.relu))
    cin, size = 24, 56

    def shuffle(x: str, c: int, size: int) -> str:
        y = n.op("Reshape", [x, n.const("shape", [1, 2, c // 2, size, size], np.int64)])
        y = n.op("Transpose", [y], perm=[0, 2, 1, 3, 4])
        return n.op("Reshape", [y, n.const("shape", [1, c, size, size], np.int64)])

    for cout, repeats in ((116, 4), (232, 8), (464, 4)):
        half = cout // 2
        for i in range(repeats):
            if i == 0:
                size //= 2
                left = n.conv_bn(n.conv_bn(x, cin, cin, 3, 2, group=cin), cin, half, 1, act=n.relu)
                right = n.conv_bn(x, cin, half, 1, act=n.relu)
            else:
                left, right = n.node("Split", [x, n.const("split", [half, half], np.int64)], outputs=2, axis=1)
                right = n.conv_bn(right, half, half, 1, act=n.relu)
            right = n.conv_bn(right, half, half, 3, 2 if i == 0 else 1, group=half)
            right = n.conv_bn(right, half, half, 1, act=n.relu)
            x = shuffle(n.op("Concat", [left, right], axis=1), cout, size)
            cin = cout
    x = n.conv_bn(x, cin, 1024, 1, act=n.relu)
    return n.model(IMAGE, {n.classifier(x, 1024): LOGITS}, "shufflenet_v2")


def densenet121() -> onnx.ModelProto:
    n = Net(5)
    x = n.maxpool(n.conv_bn("input", 3, 64, 7, 2, act=n.relu))
    cin = 64
    for stage, layers in enumerate((6, 12, 24, 16)):
        features = [x]
        for _ in range(layers):
            y = n.conv(n.relu(n.bn(x, cin)), cin, 128, 1)
            y = n.conv(n.relu(n.bn(y, 128)), 128, 32, 3)
            features.append(y)
            x = n.op("Concat", features, axis=1)
            cin += 32
        if stage < 3:
            x = n.conv(n.relu(n.bn(x, cin)), cin, cin // 2, 1)
            x = n.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
            cin //= 2
    x = n.relu(n.bn(x, cin))
    return n.model(IMAGE, {n.classifier(x, cin): LOGITS}, "densenet121")


def vgg16() -> onnx.ModelProto:
    n = Net(6)
    x, cin = "input", 3
    for width, convs in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(convs):
            x = n.relu(n.conv(x, cin, width, 3, bias=True))
            cin = width
        x = n.maxpool(x, 2, 2, 0)
    x = n.op("Flatten", [x], axis=1)
    x = n.relu(n.fc(x, 512 * 7 * 7, 4096))
    x = n.relu(n.fc(x, 4096, 4096))
    return n.model(IMAGE, {n.fc(x, 4096, 1000): LOGITS}, "vgg16")


def inception() -> onnx.ModelProto:
    """GoogLeNet (Inception v1) with batch norm: four-branch modules joined by concatenation."""
    n = Net(7)
    x = n.maxpool(n.conv_bn("input", 3, 64, 7, 2, act=n.relu))
    x = n.conv_bn(x, 64, 64, 1, act=n.relu)
    x = n.maxpool(n.conv_bn(x, 64, 192, 3, act=n.relu))
    cin = 192

    def module(x: str, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, pool: int) -> str:
        b1 = n.conv_bn(x, cin, c1, 1, act=n.relu)
        b3 = n.conv_bn(n.conv_bn(x, cin, r3, 1, act=n.relu), r3, c3, 3, act=n.relu)
        b5 = n.conv_bn(n.conv_bn(x, cin, r5, 1, act=n.relu), r5, c5, 5, act=n.relu)
        bp = n.conv_bn(n.maxpool(x, 3, 1, 1), cin, pool, 1, act=n.relu)
        return n.op("Concat", [b1, b3, b5, bp], axis=1)

    for number, group in enumerate((((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)),
                  ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
                   (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)),
                  ((256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)))):
        for c1, r3, c3, r5, c5, pool in group:
            x = module(x, cin, c1, r3, c3, r5, c5, pool)
            cin = c1 + c3 + c5 + pool
        if number < 2:
            x = n.maxpool(x)
    return n.model(IMAGE, {n.classifier(x, cin): LOGITS}, "inception_v1")


def bert_layer(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> onnx.ModelProto:
    """One BERT-base encoder layer: self-attention (batch_matmul, softmax), residual + layer norm, GELU FFN."""
    n = Net(8)
    head = hidden // heads
    x = "input"

    def linear(x: str, cin: int, cout: int) -> str:
        w = n.const("w", n.rng.standard_normal((cin, cout)) * 0.02)  # BERT's initializer range
        return n.op("Add", [n.op("MatMul", [x, w]), n.const("b", np.zeros(cout))])

    def heads_first(x: str) -> str:
        y = n.op("Reshape", [x, n.const("shape", [1, seq, heads, head], np.int64)])
        return n.op("Transpose", [y], perm=[0, 2, 1, 3])

    def layer_norm(x: str) -> str:
        gamma = n.const("ln_g", 1.0 + 0.05 * n.rng.standard_normal(hidden))
        return n.op("LayerNormalization", [x, gamma, n.const("ln_b", 0.05 * n.rng.standard_normal(hidden))],
                    axis=-1, epsilon=1e-12)

    q, k, v = (heads_first(linear(x, hidden, hidden)) for _ in range(3))
    scores = n.op("MatMul", [q, n.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = n.op("Mul", [scores, n.const("scale", np.array(1.0 / np.sqrt(head)))])
    context = n.op("MatMul", [n.op("Softmax", [scores], axis=-1), v])
    context = n.op("Reshape", [n.op("Transpose", [context], perm=[0, 2, 1, 3]),
                               n.const("shape", [1, seq, hidden], np.int64)])
    x = layer_norm(n.op("Add", [linear(context, hidden, hidden), x]))
    h = linear(x, hidden, ffn)
    gate = n.op("Add", [n.op("Erf", [n.op("Mul", [h, n.const("c", np.array(1 / np.sqrt(2.0)))])]),
                        n.const("one", np.array(1.0))])
    h = n.op("Mul", [n.op("Mul", [h, gate]), n.const("half", np.array(0.5))])
    out = layer_norm(n.op("Add", [linear(h, ffn, hidden), x]))
    return n.model({"input": (1, seq, hidden)}, {out: (1, seq, hidden)}, "bert_base_layer")


ZOO: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "squeezenet1_1": squeezenet11,
    "shufflenet_v2": shufflenet_v2,
    "densenet121": densenet121,
    "vgg16": vgg16,
    "inception": inception,
    "bert_layer": bert_layer,
}

# Not in ZOO (whose eight networks the end-to-end benchmarks run): the smaller relatives that tuning logs are
# transferred from (`python -m experiments curve`: ResNet-18 -> ResNet-50, MobileNet v1 -> v2).
RELATIVES: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": resnet18,
    "mobilenet_v1": mobilenet_v1,
}


def small_cnn(
    batch: int = 1, image: int = 32, widths: Sequence[int] = (16, 32, 64), classes: int = 10, seed: int = 0
) -> onnx.ModelProto:
    """Input `input: (batch, 3, image, image)` float32 -> class probabilities `(batch, classes)`: stages of
    conv (with bias) / batch norm / relu with 2x2 max pooling between them, global pooling, a fully connected
    layer, softmax."""
    n = Net(seed)
    x, cin = "input", 3
    for stage, cout in enumerate(widths):
        x = n.relu(n.bn(n.conv(x, cin, cout, 3, bias=True), cout))
        if stage < len(widths) - 1:
            x = n.maxpool(x, k=2, stride=2, pad=0)
        cin = cout
    x = n.op("Softmax", [n.classifier(x, cin, classes)], axis=1)
    return n.model({"input": (batch, 3, image, image)}, {x: (batch, classes)}, "small_cnn")


def mlp(batch: int = 8, features: int = 256, hidden: int = 512, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """Input `input: (batch, features)` -> logits `(batch, classes)`: MatMul/Add/GELU/MatMul/Add."""
    n = Net(seed)
    w1 = n.const("w1", n.rng.standard_normal((features, hidden)) * np.sqrt(2.0 / features))
    w2 = n.const("w2", n.rng.standard_normal((hidden, classes)) * np.sqrt(1.0 / hidden))
    x = n.op("Add", [n.op("MatMul", ["input", w1]), n.const("b1", np.zeros(hidden))])
    # Gelu is an operator only from opset 20; spelled out as exporters for older opsets do.
    gate = n.op("Add", [n.op("Erf", [n.op("Mul", [x, n.const("inv_sqrt2", np.array(1.0 / np.sqrt(2.0)))])]),
                        n.const("one", np.array(1.0))])
    x = n.op("Mul", [n.op("Mul", [x, gate]), n.const("half", np.array(0.5))])
    x = n.op("Add", [n.op("MatMul", [x, w2]), n.const("b2", np.zeros(classes))])
    return n.model({"input": (batch, features)}, {x: (batch, classes)}, "mlp")


SMALL: dict[str, Callable[[], onnx.ModelProto]] = {"small_cnn": small_cnn, "mlp": mlp}


def network(name: str) -> onnx.ModelProto:
    """The network `name` of ZOO, RELATIVES or SMALL; a KeyError that lists the names for any other."""
    builders = {**ZOO, **RELATIVES, **SMALL}
    if name not in builders:
        raise KeyError(f"unknown network {name!r}; known: {', '.join(builders)}")
    return builders[name]()
