"""Converting a list of ONNX nodes into Relay expressions: the walk shared by the main graph
(`relay_tune.frontend.onnx.convert_graph`) and by the subgraphs of control-flow operators (If, Loop, Scan in
`relay_tune.frontend.onnx_control_flow`).

A subgraph sees the values of its enclosing scopes by name (ONNX outer-scope references), so the walk takes the
enclosing names and adds the subgraph's own on top of them, in a fresh dictionary that leaves the outer scope
untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import onnx
from numpy import asarray
from onnx import helper, numpy_helper

from relay_tune.errors import RelayTuneError, UnsupportedError
from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, relay_dtype
from relay_tune.frontend.onnx_registry import CONVERTERS, converter_key
from relay_tune.ir.expr import Constant, Expr


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """The attributes of `node` as Python values; a subgraph attribute is its `onnx.GraphProto`."""
    return {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}


def describe(node: onnx.NodeProto, index: int) -> str:
    name = f" {node.name!r}" if node.name else ""
    return f"ONNX node #{index}{name} ({node.op_type})"


def all_nodes(graph: onnx.GraphProto, within: str = "") -> Iterable[tuple[str, onnx.NodeProto]]:
    """The nodes of `graph` and of every subgraph nested in them (If branches, Loop and Scan bodies), each with
    where it is (`node #3 'name'`, `node #0 in else_branch of node #3`)."""
    for index, node in enumerate(graph.node):
        place = f"node #{index}" + (f" {node.name!r}" if node.name else "") + within
        yield place, node
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else (
                list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else [])
            for sub in subgraphs:
                yield from all_nodes(sub, f" in {attr.name} of {place}")


def initializer_values(graph: onnx.GraphProto) -> dict[str, Expr]:
    """`graph`'s initializers as constants, by name."""
    if graph.sparse_initializer:
        raise UnsupportedError("sparse initializers")
    values: dict[str, Expr] = {}
    for tensor in graph.initializer:
        relay_dtype(tensor.data_type, f"initializer {tensor.name!r}")
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise UnsupportedError(f"initializer {tensor.name!r} keeps its data in an external file; load the model "
                                   "with onnx.load(path) and pass the ModelProto")
        try:
            values[tensor.name] = Constant(asarray(numpy_helper.to_array(tensor)))
        except (ValueError, TypeError, AttributeError, KeyError) as err:  # data that does not fit its dims
            raise OnnxModelError(f"initializer {tensor.name!r} is damaged ({type(err).__name__}: {err})") from None
    return values


def convert_nodes(imp: Importer, nodes: Sequence[onnx.NodeProto], values: dict[str, Expr]) -> None:
    """Converts `nodes` in order, adding every output they name to `values` (which holds their inputs).
    Errors name the node at fault."""
    for index, proto in enumerate(nodes):
        where = describe(proto, index)
        try:
            missing = [n for n in proto.input if n and n not in values]
            if missing:
                raise OnnxModelError(f"input(s) {', '.join(map(repr, missing))} are not produced before this node")
            node = OnnxNode(
                op_type=proto.op_type, name=proto.name,
                inputs=[values[n] if n else None for n in proto.input], input_names=list(proto.input),
                outputs=list(proto.output), attrs=node_attrs(proto), scope=values,
            )
            result = CONVERTERS[converter_key(proto.domain, proto.op_type)](imp, node)
        except UnsupportedError as err:
            raise UnsupportedError(f"{where}: {err}") from None
        except RelayTuneError as err:
            raise OnnxModelError(f"{where}: {err}") from None
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise OnnxModelError(f"{where}: malformed node ({type(err).__name__}: {err})") from None
        outputs = [result] if isinstance(result, Expr) else list(result)
        for name, value in zip(proto.output, outputs):
            if name:
                values[name] = value


def convert_subgraph(imp: Importer, graph: onnx.GraphProto, outer: Mapping[str, Expr],
                     inputs: Sequence[Expr]) -> list[Expr]:
    """The outputs of `graph` (an If branch, a Loop or Scan body) with its formal inputs bound to `inputs`,
    names of the enclosing scopes `outer` visible inside it."""
    if len(inputs) != len(graph.input):
        raise OnnxModelError(f"subgraph {graph.name!r} takes {len(graph.input)} inputs, given {len(inputs)}")
    values = dict(outer)
    values.update(initializer_values(graph))
    values.update((vi.name, value) for vi, value in zip(graph.input, inputs))
    try:
        convert_nodes(imp, graph.node, values)
    except UnsupportedError as err:
        raise UnsupportedError(f"in subgraph {graph.name!r}: {err}") from None
    except RelayTuneError as err:
        raise OnnxModelError(f"in subgraph {graph.name!r}: {err}") from None
    missing = [o.name for o in graph.output if o.name not in values]
    if missing:
        raise OnnxModelError(f"subgraph {graph.name!r} never computes its output(s) {', '.join(map(repr, missing))}")
    return [values[o.name] for o in graph.output]
