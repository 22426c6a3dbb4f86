"""ONNX If, Loop and Scan against onnxruntime and onnx's reference evaluator, through the interpreter and the
compiled model: constant and run-time conditions, outer-scope names, unrolled loops with scan outputs, masked
loops, Scan's axes and directions (opsets 8 and 9 on), and the clear errors for what cannot be unrolled."""

from __future__ import annotations

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

RNG = np.random.default_rng(20261208)
F = TensorProto.FLOAT


def rand(*shape: int) -> np.ndarray:
    values = RNG.uniform(-2, 2, size=shape).astype(np.float32)
    return np.where(np.abs(values) < 1e-3, np.float32(0.5), values)


def vi(name: str, elem: int = F, shape: list[Any] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def model_of(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[str],
             opset: int = 16, initializers: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [vi(o) for o in outputs], initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def check_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray], compiled: bool = True,
              reference: bool = True) -> None:
    """The model's outputs through the interpreter (and the compiled model) equal onnxruntime's (and onnx's
    reference evaluator's)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [np.asarray(w) for w in session.run(None, feeds)]
    if reference:
        for got, w in zip(ReferenceEvaluator(model).run(None, feeds), want):
            np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-6)
    mod, _ = from_onnx(model)
    runs = {"interpreter": evaluate(mod, feeds)}
    if compiled:
        runs["compiled"] = build(mod, "llvm").run(**feeds)
    for label, result in runs.items():
        got = [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]
        assert len(got) == len(want), label
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, f"{label}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=label)


# --- If -----------------------------------------------------------------------------------------------


def branches(then_op: str = "Add", else_op: str = "Mul", else_shape_changes: bool = False
             ) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """Branches that read the outer-scope values `x` and `y` (no inputs of their own)."""
    then_graph = helper.make_graph([helper.make_node(then_op, ["x", "y"], ["t"])], "then", [], [vi("t")])
    else_nodes = [helper.make_node(else_op, ["x", "y"], ["e0"])]
    if else_shape_changes:
        else_nodes.append(helper.make_node("ReduceSum", ["e0"], ["e"], keepdims=0))
    else:
        else_nodes.append(helper.make_node("Neg", ["e0"], ["e"]))
    else_graph = helper.make_graph(else_nodes, "else", [], [vi("e")])
    return then_graph, else_graph


@pytest.mark.parametrize("rows", [3, 2])
def test_if_with_condition_known_from_shapes_imports_the_taken_branch(rows: int) -> None:
    then_graph, else_graph = branches()
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("zero", np.array([0], np.int64)), const("two", np.array([2], np.int64)),
        helper.make_node("Gather", ["shape", "zero"], ["rows"]),
        helper.make_node("Greater", ["rows", "two"], ["cond"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=then_graph, else_branch=else_graph),
    ]
    model = model_of(nodes, [vi("x", F, [rows, 5]), vi("y", F, [rows, 5])], ["out"])
    feeds = {"x": rand(rows, 5), "y": rand(rows, 5)}
    check_all(model, feeds)
    text = print_module(from_onnx(model)[0])
    assert ("add(" in text) == (rows > 2) and ("multiply(" in text) == (rows <= 2)
    assert "where(" not in text


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_with_run_time_condition_selects_between_both_branches(sign: float) -> None:
    then_graph, else_graph = branches()
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        const("zero", np.array(0, np.float32)),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=then_graph, else_branch=else_graph),
    ]
    model = model_of(nodes, [vi("x", F, [3, 7]), vi("y", F, [3, 7])], ["out"])
    x = np.abs(rand(3, 7)) * sign
    check_all(model, {"x": x, "y": rand(3, 7)})


def test_nested_if_sees_every_enclosing_scope() -> None:
    inner_then, inner_else = branches("Sub", "Max")
    inner = helper.make_node("If", ["c_inner"], ["inner_out"], then_branch=inner_then, else_branch=inner_else)
    outer_then = helper.make_graph(
        [helper.make_node("Less", ["x", "y"], ["lt"]),
         helper.make_node("Cast", ["lt"], ["lt_f"], to=F),
         helper.make_node("ReduceMin", ["lt_f"], ["c_inner_f"], keepdims=0),
         helper.make_node("Cast", ["c_inner_f"], ["c_inner"], to=TensorProto.BOOL), inner,
         helper.make_node("Add", ["inner_out", "x"], ["t"])],
        "outer_then", [], [vi("t")])
    outer_else = helper.make_graph([helper.make_node("Div", ["x", "y"], ["e"])], "outer_else", [], [vi("e")])
    model = model_of([helper.make_node("If", ["c"], ["out"], then_branch=outer_then, else_branch=outer_else)],
                     [vi("c", TensorProto.BOOL, []), vi("x", F, [2, 3]), vi("y", F, [2, 3])], ["out"])
    for c in (True, False):
        check_all(model, {"c": np.array(c), "x": rand(2, 3), "y": rand(2, 3)}, compiled=c)


def test_if_with_run_time_condition_and_different_branch_types_is_a_clear_error() -> None:
    then_graph, else_graph = branches(else_shape_changes=True)
    model = model_of([helper.make_node("If", ["c"], ["out"], then_branch=then_graph, else_branch=else_graph)],
                     [vi("c", TensorProto.BOOL, []), vi("x", F, [2, 3]), vi("y", F, [2, 3])], ["out"])
    with pytest.raises(UnsupportedError, match=r"\(If\): the condition is computed at run time and output 0"):
        from_onnx(model)


# --- Loop ---------------------------------------------------------------------------------------------


def loop_body(cond_from_iteration: int | None = None, scan_output: bool = True,
              cond_from_state: bool = False) -> onnx.GraphProto:
    """y <- y * 0.9 + x[i % rows] + i (x from the outer scope); scans y; the condition passes through, or is
    `i + 1 < cond_from_iteration`, or `sum(y) < 4` (known only at run time)."""
    nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=F),
        const("rows", np.array(3, np.int64)), const("decay", np.array(0.9, np.float32)),
        helper.make_node("Mod", ["i", "rows"], ["row"]),
        helper.make_node("Gather", ["x", "row"], ["x_row"], axis=0),
        helper.make_node("Mul", ["y_in", "decay"], ["decayed"]),
        helper.make_node("Add", ["decayed", "x_row"], ["summed"]),
        helper.make_node("Add", ["summed", "i_f"], ["y_out"]),
    ]
    if cond_from_iteration is not None:
        nodes += [const("one", np.array(1, np.int64)), const("limit", np.array(cond_from_iteration, np.int64)),
                  helper.make_node("Add", ["i", "one"], ["next"]),
                  helper.make_node("Less", ["next", "limit"], ["cond_out"])]
    elif cond_from_state:
        nodes += [helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
                  const("four", np.array(4.0, np.float32)), helper.make_node("Less", ["total", "four"], ["cond_out"])]
    else:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    outputs = [vi("cond_out", TensorProto.BOOL, []), vi("y_out")]
    if scan_output:
        nodes.append(helper.make_node("Identity", ["y_out"], ["scan"]))
        outputs.append(vi("scan"))
    return helper.make_graph(nodes, "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []),
                                             vi("y_in")], outputs)


def test_loop_with_constant_trip_count_unrolls_with_scan_outputs() -> None:
    nodes = [const("trip", np.array(5, np.int64)), const("cond", np.array(True)),
             helper.make_node("Loop", ["trip", "cond", "y0"], ["y", "ys"], body=loop_body())]
    model = model_of(nodes, [vi("x", F, [3, 7]), vi("y0", F, [7])], ["y", "ys"])
    check_all(model, {"x": rand(3, 7), "y0": rand(7)})


def test_loop_without_trip_count_stops_when_its_condition_folds_false() -> None:
    nodes = [const("cond", np.array(True)),
             helper.make_node("Loop", ["", "cond", "y0"], ["y", "ys"], body=loop_body(cond_from_iteration=4))]
    model = model_of(nodes, [vi("x", F, [3, 5]), vi("y0", F, [5])], ["y", "ys"])
    check_all(model, {"x": rand(3, 5), "y0": rand(5)})
    assert np.asarray(evaluate(from_onnx(model)[0], {"x": rand(3, 5), "y0": rand(5)})[1]).shape == (4, 5)


def test_loop_with_run_time_condition_keeps_state_after_it_turns_false() -> None:
    nodes = [const("trip", np.array(6, np.int64)),
             helper.make_node("Loop", ["trip", "c0", "y0"], ["y"], body=loop_body(scan_output=False,
                                                                                 cond_from_state=True))]
    model = model_of(nodes, [vi("c0", TensorProto.BOOL, []), vi("x", F, [3, 2]), vi("y0", F, [2])], ["y"])
    x = np.abs(rand(3, 2)) * 0.3
    for c0, y0 in ((True, np.zeros(2, np.float32)), (True, np.full(2, 2.5, np.float32)), (False, rand(2))):
        check_all(model, {"c0": np.array(c0), "x": x, "y0": y0}, reference=False)


def test_loop_that_cannot_be_unrolled_is_a_clear_error() -> None:
    nodes = [helper.make_node("Loop", ["trip", "c0", "y0"], ["y", "ys"], body=loop_body())]
    inputs = [vi("trip", TensorProto.INT64, []), vi("c0", TensorProto.BOOL, []), vi("x", F, [3, 2]), vi("y0", F, [2])]
    with pytest.raises(UnsupportedError, match=r"\(Loop\): the trip count is computed at run time"):
        from_onnx(model_of(nodes, inputs, ["y", "ys"]))
    bound = model_of([const("trip", np.array(3, np.int64)), *nodes], inputs[1:], ["y", "ys"])
    with pytest.raises(UnsupportedError, match=r"scan output.*length known only at run time"):
        from_onnx(bound)


# --- Scan ---------------------------------------------------------------------------------------------


def scan_body() -> onnx.GraphProto:
    """state <- state + a * b (a from the first scan input, b from the second); scans state and a - b."""
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["s_in", "ab"], ["s_out"]),
             helper.make_node("Sub", ["a", "b"], ["diff"]), helper.make_node("Identity", ["s_out"], ["s_scan"])]
    return helper.make_graph(nodes, "scan_body", [vi("s_in"), vi("a"), vi("b")],
                             [vi("s_out"), vi("s_scan"), vi("diff")])


@pytest.mark.parametrize(("input_axes", "directions", "output_axes", "output_directions"), [
    ([0, 0], [0, 0], [0, 0], [0, 0]),
    ([1, 0], [0, 1], [-1, 1], [1, 0]),
])
def test_scan_unrolls_over_axes_and_directions(input_axes: list[int], directions: list[int], output_axes: list[int],
                                               output_directions: list[int]) -> None:
    steps, width = 3, 5
    a_shape = [width, steps] if input_axes[0] == 1 else [steps, width]
    node = helper.make_node("Scan", ["s0", "a", "b"], ["s", "s_scan", "diffs"], body=scan_body(), num_scan_inputs=2,
                            scan_input_axes=input_axes, scan_input_directions=directions,
                            scan_output_axes=output_axes, scan_output_directions=output_directions)
    model = model_of([node], [vi("s0", F, [width]), vi("a", F, a_shape), vi("b", F, [steps, width])],
                     ["s", "s_scan", "diffs"])
    # onnx.reference implements forward directions only
    check_all(model, {"s0": rand(width), "a": rand(*a_shape), "b": rand(steps, width)},
              reference=not any(directions + output_directions))


def test_scan8_runs_the_body_per_batch_item() -> None:
    node = helper.make_node("Scan", ["", "s0", "a", "b"], ["s", "s_scan", "diffs"], body=scan_body(),
                            num_scan_inputs=2, directions=[1, 0])
    model = model_of([node], [vi("s0", F, [2, 5]), vi("a", F, [2, 3, 5]), vi("b", F, [2, 3, 5])],
                     ["s", "s_scan", "diffs"], opset=8)
    check_all(model, {"s0": rand(2, 5), "a": rand(2, 3, 5), "b": rand(2, 3, 5)}, reference=False)


def test_unsupported_operator_inside_a_subgraph_is_listed_with_its_place() -> None:
    then_graph = helper.make_graph([helper.make_node("TfIdfVectorizer", ["x"], ["t"])], "then", [], [vi("t")])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then_graph, else_branch=else_graph, name="branch")
    model = model_of([node], [vi("c", TensorProto.BOOL, []), vi("x", F, [2])], ["out"])
    with pytest.raises(UnsupportedError,
                       match=r"TfIdfVectorizer \(x1\) first at node #0 in then_branch of node #0 'branch'"):
        from_onnx(model)


def test_error_inside_a_subgraph_names_the_node_and_the_subgraph() -> None:
    then_graph = helper.make_graph([helper.make_node("Add", ["x", "missing"], ["t"])], "then", [], [vi("t")])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then_graph, else_branch=else_graph)
    model = model_of([const("c", np.array(True)), node], [vi("x", F, [2])], ["out"])
    with pytest.raises(OnnxModelError, match=r"\(If\): in subgraph 'then': ONNX node #0 \(Add\): input\(s\) 'missing'"):
        from_onnx(model)
