"""The ONNX control-flow operators If, Loop and Scan, resolved at import time into plain Relay dataflow.

Subgraphs are converted by the same walk as the main graph (`relay_tune.frontend.onnx_graph.convert_subgraph`),
seeing the names of their enclosing scopes.

- **If**: a condition that is a constant once shapes are known (folded from initializers and shape arithmetic)
  imports only the branch taken. A condition computed at run time imports both branches (ONNX subgraphs have no
  side effects) and selects each output with `where`; that needs the two branches to give outputs of the same
  types, else the node is rejected with the reason.
- **Loop**: unrolled. The trip count must be a constant, or the condition must become a constant false (both
  evaluated as the body is unrolled: the iteration number is a constant in each copy). A condition computed at
  run time with a constant trip count keeps the loop-carried values of the iterations after it turned false
  unchanged (`where`), which a loop with scan outputs cannot do (their length would be known only at run time).
- **Scan** (opset 8 with its batch axis, and opset 9 on): unrolled over the static length of the scan inputs,
  honouring `scan_input_axes`, `scan_input_directions`, `scan_output_axes` and `scan_output_directions`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from relay_tune.errors import UnsupportedError
from relay_tune.frontend.onnx_graph import convert_subgraph
from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, normalize_axis
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Constant, Expr, Tuple
from relay_tune.ir.types import TensorType

# The most iterations a Loop is unrolled to: a loop that runs longer is not meant to be unrolled.
MAX_UNROLLED_ITERATIONS = 4096


def _subgraph(node: OnnxNode, name: str) -> onnx.GraphProto:
    graph = node.attrs.get(name)
    if not isinstance(graph, onnx.GraphProto):
        raise OnnxModelError(f"attribute {name!r} must hold a graph")
    return graph


def _scalar_bool(imp: Importer, value: Expr, what: str) -> Expr:
    """`value` (a one-element tensor) as a boolean scalar."""
    shape = imp.static_shape(value, what)
    if int(np.prod(shape)) != 1:
        raise OnnxModelError(f"{what} must hold one element, got shape {shape}")
    return imp.cast(imp.reshape(value, []), "bool")


def _constant_truth(value: Expr) -> bool | None:
    """The truth of a one-element constant; None for a value computed at run time."""
    return bool(value.data.reshape(-1)[0]) if isinstance(value, Constant) else None


def _stack(imp: Importer, values: Sequence[Expr], axis: int) -> Expr:
    return imp.call("stack", [Tuple(tuple(values))], axis=axis)


def _pick(imp: Importer, tensor: Expr, index: int, axis: int) -> Expr:
    """`tensor[index]` along `axis`, that axis dropped."""
    shape = imp.static_shape(tensor)
    part = imp.call("strided_slice", [tensor], begin=[index], end=[index + 1], axes=[axis])
    return imp.reshape(part, [*shape[:axis], *shape[axis + 1:]])


# --- If -------------------------------------------------------------------------------------------


@converts("If", newest=REVIEWED_OPSET)
def _if(imp: Importer, node: OnnxNode) -> list[Expr]:
    then_graph, else_graph = _subgraph(node, "then_branch"), _subgraph(node, "else_branch")
    cond = _scalar_bool(imp, node.required(0), "the condition")
    taken = _constant_truth(cond)
    if taken is not None:
        return convert_subgraph(imp, then_graph if taken else else_graph, node.scope, [])
    then_out = convert_subgraph(imp, then_graph, node.scope, [])
    else_out = convert_subgraph(imp, else_graph, node.scope, [])
    if len(then_out) != len(else_out):
        raise OnnxModelError(f"the branches give {len(then_out)} and {len(else_out)} outputs")
    selected = []
    for index, (a, b) in enumerate(zip(then_out, else_out)):
        a_type, b_type = imp.type_of(a), imp.type_of(b)
        if not isinstance(a_type, TensorType) or a_type != b_type:
            raise UnsupportedError(
                f"the condition is computed at run time and output {index} of the branches differs in type "
                f"({a_type} and {b_type}); relay-tune selects between branches only when their outputs have the "
                "same types (give the inputs deciding the condition as constants, or fix the input shapes)")
        selected.append(imp.call("where", [cond, a, b]))
    return selected


# --- Loop -----------------------------------------------------------------------------------------


@converts("Loop", newest=REVIEWED_OPSET)
def _loop(imp: Importer, node: OnnxNode) -> list[Expr]:
    body = _subgraph(node, "body")
    carried = [node.required(i) for i in range(2, len(node.inputs))]
    scan_count = len(body.output) - 1 - len(carried)
    if scan_count < 0 or len(body.input) != 2 + len(carried):
        raise OnnxModelError(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs for "
                             f"{len(carried)} loop-carried values")
    trip_input = node.input(0)
    trip: int | None = None
    if trip_input is not None:
        if not isinstance(trip_input, Constant):
            raise UnsupportedError("the trip count is computed at run time; relay-tune unrolls loops and needs it as "
                                   "a constant known at import time")
        trip = int(trip_input.data.reshape(-1)[0])
    cond = (_scalar_bool(imp, node.required(1), "the condition") if node.input(1) is not None
            else imp.const(True, "bool"))
    state = list(carried)
    scans: list[list[Expr]] = [[] for _ in range(scan_count)]
    iteration = 0
    while trip is None or iteration < trip:
        running = _constant_truth(cond)
        if running is False:
            break
        if running is None and (trip is None or scan_count):
            why = ("there is no constant trip count" if trip is None
                   else f"its {scan_count} scan output(s) would have a length known only at run time")
            raise UnsupportedError(f"the loop condition is computed at run time and {why}; relay-tune unrolls "
                                   "loops (give the inputs deciding the condition as constants)")
        if iteration >= MAX_UNROLLED_ITERATIONS:
            raise UnsupportedError(f"the loop runs more than {MAX_UNROLLED_ITERATIONS} iterations; relay-tune "
                                   "unrolls loops and stops there")
        outputs = convert_subgraph(imp, body, node.scope, [imp.const(iteration, "int64"), cond, *state])
        new_cond = _scalar_bool(imp, outputs[0], "the body's condition output")
        new_state = outputs[1:1 + len(carried)]
        if running is None:
            # the iterations after the condition turned false leave the loop-carried values as they were
            state = [imp.call("where", [cond, new, old]) for new, old in zip(new_state, state)]
            new_cond = imp.call("where", [cond, new_cond, imp.const(False, "bool")])
        else:
            state = list(new_state)
        for values, value in zip(scans, outputs[1 + len(carried):]):
            values.append(value)
        cond = new_cond
        iteration += 1
    if scan_count and iteration == 0:
        raise UnsupportedError("the loop runs no iteration, so the shapes of its scan outputs are unknown")
    return [*state, *(_stack(imp, values, 0) for values in scans)]


# --- Scan -----------------------------------------------------------------------------------------


def _axes(node: OnnxNode, name: str, count: int) -> list[int]:
    values = [int(a) for a in node.attrs.get(name, [0] * count)]
    if len(values) != count:
        raise OnnxModelError(f"{name} has {len(values)} entries for {count} values")
    return values


def _scan_steps(imp: Importer, node: OnnxNode, body: onnx.GraphProto, states: list[Expr], inputs: list[Expr],
                legacy: bool) -> tuple[list[Expr], list[list[Expr]]]:
    """Runs the Scan body over `inputs` along their scan axes: the final states and, per scan output, its values
    in output order. `legacy`: Scan-8 on one batch item (axis 0, the `directions` attribute)."""
    count = len(inputs)
    input_axes = [0] * count if legacy else _axes(node, "scan_input_axes", count)
    directions = _axes(node, "directions" if legacy else "scan_input_directions", count)
    axes = [normalize_axis(a, imp.rank(x), "scan input axis") for a, x in zip(input_axes, inputs)]
    lengths = {imp.static_shape(x, "the scan input")[a] for x, a in zip(inputs, axes)}
    if len(lengths) != 1:
        raise OnnxModelError(f"the scan inputs have different lengths {sorted(lengths)}")
    length = lengths.pop()
    output_count = len(body.output) - len(states)
    if length == 0 and output_count:
        raise UnsupportedError("the scan inputs are empty, so the shapes of the scan outputs are unknown")
    out_directions = [0] * output_count if legacy else _axes(node, "scan_output_directions", output_count)
    collected: list[list[Expr]] = [[] for _ in range(output_count)]
    for step in range(length):
        elements = [_pick(imp, x, length - 1 - step if reverse else step, axis)
                    for x, axis, reverse in zip(inputs, axes, directions)]
        outputs = convert_subgraph(imp, body, node.scope, [*states, *elements])
        states = outputs[:len(states)]
        for values, value in zip(collected, outputs[len(states):]):
            values.append(value)
    return states, [values[::-1] if reverse else values for values, reverse in zip(collected, out_directions)]


@converts("Scan", newest=REVIEWED_OPSET)
def _scan(imp: Importer, node: OnnxNode) -> list[Expr]:
    body = _subgraph(node, "body")
    scan_count = int(node.attrs["num_scan_inputs"])
    if imp.opset >= 9:
        given = [node.required(i) for i in range(len(node.inputs))]
        states, inputs = given[:len(given) - scan_count], given[len(given) - scan_count:]
        states, collected = _scan_steps(imp, node, body, states, inputs, False)
        output_axes = _axes(node, "scan_output_axes", len(collected))
        scanned = []
        for values, axis in zip(collected, output_axes):
            scanned.append(_stack(imp, values, normalize_axis(axis, imp.rank(values[0]) + 1, "scan output axis")))
        return [*states, *scanned]
    return _scan8(imp, node, body, scan_count)


def _scan8(imp: Importer, node: OnnxNode, body: onnx.GraphProto, scan_count: int) -> list[Expr]:
    """Scan-8: every input has a leading batch axis, the body runs on each batch item alone, the sequence axis is 1."""
    given = [node.required(i) for i in range(1, len(node.inputs))]
    states, inputs = given[:len(given) - scan_count], given[len(given) - scan_count:]
    batch = imp.static_shape(inputs[0], "the scan input")[0]
    lens = node.input(0)
    if lens is not None:
        length = imp.static_shape(inputs[0], "the scan input")[1]
        values = imp.static(lens, "sequence_lens")
        if not np.all(values == length):
            raise UnsupportedError("sequence_lens shorter than the scan inputs (ragged sequences)")
    per_item: list[tuple[list[Expr], list[list[Expr]]]] = []
    for b in range(batch):
        item_states = [_pick(imp, s, b, 0) for s in states]
        item_inputs = [_pick(imp, x, b, 0) for x in inputs]
        per_item.append(_scan_steps(imp, node, body, item_states, item_inputs, True))
    final = [_stack(imp, [item[0][k] for item in per_item], 0) for k in range(len(states))]
    outputs_count = len(per_item[0][1]) if per_item else 0
    scanned = [_stack(imp, [_stack(imp, item[1][k], 0) for item in per_item], 0) for k in range(outputs_count)]
    return [*final, *scanned]
