"""The nine public CNN graphs that the onnx package ships as "light" models (AlexNet, ZFNet-512, SqueezeNet 1.0,
ShuffleNet v1, Inception v1 and v2, DenseNet-121, ResNet-50 v1 and VGG-19 from the ONNX model zoo), with seeded
random weights.

The package keeps each graph's structure and replaces every weight by a `ConstantOfShape` node fed by a shape
initializer (`NAME__SHAPE`), so the files stay small. `light_model(name)` turns those nodes back into initializers
of random values at a trained network's scale (He initialisation for convolution and fully connected weights,
batch-norm and bias statistics near 1 and 0), so activations stay in a realistic range through the whole depth and
engines can be compared on them.

    from relay_tune.testing.onnx_light import LIGHT, light_model
    model = light_model("resnet50")      # onnx.ModelProto, batch 1, 3x224x224 input
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT = ("bvlc_alexnet", "zfnet512", "squeezenet", "shufflenet", "inception_v1", "inception_v2", "densenet121",
         "resnet50", "vgg19")


def light_folder() -> Path:
    """Where the installed onnx package keeps the light models."""
    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The light model `name` (one of LIGHT) with its weights as random initializers."""
    if name not in LIGHT:
        raise KeyError(f"unknown light model {name!r}; known: {', '.join(LIGHT)}")
    path = light_folder() / f"light_{name}.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"the installed onnx package has no {path.name} (looked in {path.parent})")
    return with_random_weights(onnx.load(str(path)), seed)


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """`model` with every `ConstantOfShape` node whose shape is an initializer replaced by an initializer of random
    values shaped and scaled for the node that consumes it."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    # Residual sums add the variances of their branches: He's gain of 2 would grow activations block after block
    # until the classifier's softmax saturates, so residual networks get a gain of 1.
    gain = 1.0 if any(node.op_type == "Sum" for node in graph.node) else 2.0
    shapes = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    consumers: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, (node.op_type, index))
    kept_nodes, weights = [], []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in shapes:
            dims = tuple(int(d) for d in shapes[node.input[0]])
            op_type, index = consumers.get(node.output[0], ("", 0))
            weights.append(numpy_helper.from_array(_weight(rng, dims, op_type, index, gain), node.output[0]))
        else:
            kept_nodes.append(node)
    used = {name for node in kept_nodes for name in node.input}
    initializers = [init for init in graph.initializer if init.name in used] + weights
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept_nodes)
    del out.graph.initializer[:]
    out.graph.initializer.extend(initializers)
    # IR version 4 lets initializers be constants that are not graph inputs (older versions list them as inputs).
    out.ir_version = max(out.ir_version, 4)
    constants = {init.name for init in initializers} | set(shapes)
    graph_inputs = [i for i in out.graph.input if i.name not in constants]
    del out.graph.input[:]
    out.graph.input.extend(graph_inputs)
    return out


def _weight(rng: np.random.Generator, dims: tuple[int, ...], op_type: str, index: int, gain: float) -> np.ndarray:
    """Values for a weight of shape `dims` that is input `index` of an `op_type` node."""
    if op_type == "BatchNormalization" or op_type == "SpatialBN":
        if index in (1, 4):  # scale, variance: near 1 and positive
            return rng.uniform(0.8, 1.2, dims).astype(np.float32)
        return (0.05 * rng.standard_normal(dims)).astype(np.float32)  # bias, mean
    if len(dims) >= 2:  # convolution and fully connected weights: He initialisation over the fan-in
        fan_in = int(np.prod(dims[1:])) if op_type != "Gemm" else dims[-1]
        if op_type == "MatMul":
            fan_in = dims[0]
        return (rng.standard_normal(dims) * np.sqrt(gain / max(1, fan_in))).astype(np.float32)
    if op_type in ("Mul", "Div"):  # per-channel scales
        return rng.uniform(0.8, 1.2, dims).astype(np.float32)
    return (0.05 * rng.standard_normal(dims)).astype(np.float32)  # biases and shifts
