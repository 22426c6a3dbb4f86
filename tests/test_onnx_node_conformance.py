"""ONNX backend node conformance: every node test case of the installed onnx package (see
`relay_tune.testing.onnx_cases`), through the interpreter and, in the slow test, the compiled model.

Floors a little below the current pass rates make regressions fail; the report (counts, exclusions by
rule, misses by operator) is printed. `python -m relay_tune.testing.onnx_cases [--compiled]` prints it alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from relay_tune.testing.onnx_cases import (
    ConformanceReport,
    collect_cases,
    compiled_runner,
    exclusion_rule,
    interpreter_runner,
    run_case,
    run_cases,
)

# Current results with onnx 1.23 (1884 cases, 75 excluded, 1809 in scope): 1701 pass with the interpreter and
# 1701 with the compiled models (94.0%).
INTERPRETER_PASS_RATE_FLOOR = 0.92
COMPILED_PASS_RATE_FLOOR = 0.92


@pytest.fixture(scope="module")
def cases() -> list[Any]:
    return collect_cases()


@pytest.fixture(scope="module")
def interpreter_report(cases: list[Any]) -> ConformanceReport:
    return run_cases(cases, interpreter_runner, "interpreter")


def test_node_cases_through_the_interpreter(interpreter_report: ConformanceReport,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n" + interpreter_report.summary() + "\n" + interpreter_report.table(15))
    assert interpreter_report.pass_rate >= INTERPRETER_PASS_RATE_FLOOR, interpreter_report.summary()


def test_every_case_is_classified_and_only_by_the_four_rules(interpreter_report: ConformanceReport,
                                                             cases: list[Any]) -> None:
    assert len(interpreter_report.results) == len(cases) > 1000
    assert set(interpreter_report.excluded_by_rule()) <= {"training", "sequence", "optional", "string"}
    for result in interpreter_report.results:
        assert result.status in ("passed", "unsupported", "failed", "excluded")
        assert (result.status == "unsupported") == bool(result.missing_ops)
        assert result.status == "passed" or result.reason


@pytest.mark.slow
def test_node_cases_through_compiled_models(cases: list[Any], interpreter_report: ConformanceReport,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    report = run_cases(cases, compiled_runner, "compiled")
    with capsys.disabled():
        print("\n" + report.summary() + "\n" + report.table(15))
    assert report.pass_rate >= COMPILED_PASS_RATE_FLOOR, report.summary()
    # Compiled execution passes what the interpreter passes, less a small margin.
    assert report.count("passed") >= interpreter_report.count("passed") - 10, report.failures()


# --- the classification itself, on small made-up cases ----------------------------------------------


class _Case:
    def __init__(self, name: str, model: onnx.ModelProto, inputs: list[np.ndarray], outputs: list[np.ndarray]):
        self.name, self.model, self.data_sets = name, model, [(inputs, outputs)]
        self.rtol, self.atol = 1e-3, 1e-7


def _model(op: str, inputs: dict[str, int], shapes: dict[str, list[int]] | None = None, opset: int = 18,
           output_type: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    node = helper.make_node(op, list(inputs), ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, (shapes or {}).get(n))
                                            for n, t in inputs.items()],
                              [helper.make_tensor_value_info("y", output_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_matching_case_passes_and_a_wrong_expectation_fails() -> None:
    x = np.array([[-1.0, 2.0]], np.float32)
    model = _model("Relu", {"x": onnx.TensorProto.FLOAT}, {"x": [1, 2]})
    assert run_case(_Case("relu", model, [x], [np.maximum(x, 0)]), interpreter_runner).status == "passed"
    wrong = run_case(_Case("relu", model, [x], [x]), interpreter_runner)
    assert wrong.status == "failed" and "values differ" in wrong.reason


def test_an_unknown_operator_is_a_miss_named_by_operator() -> None:
    model = _model("ImageDecoder", {"x": onnx.TensorProto.FLOAT}, {"x": [2]})
    case = _Case("image_decoder", model, [np.zeros(2, np.float32)], [np.zeros(2, np.float32)])
    result = run_case(case, interpreter_runner)
    assert result.status == "unsupported" and result.missing_ops == ("ImageDecoder",)


def test_integer_shape_inputs_are_bound_when_the_import_needs_them() -> None:
    model = _model("Reshape", {"x": onnx.TensorProto.FLOAT, "shape": onnx.TensorProto.INT64}, {"x": [6], "shape": [2]})
    x = np.arange(6, dtype=np.float32)
    result = run_case(_Case("reshape", model, [x, np.array([3, 2])], [x.reshape(3, 2)]), interpreter_runner)
    assert result.status == "passed" and result.bound_inputs == ("shape",)


def test_exclusion_rules() -> None:
    string_model = _model("Identity", {"x": onnx.TensorProto.STRING}, output_type=onnx.TensorProto.STRING)
    assert exclusion_rule(string_model, "test_identity_string") == "string"
    assert exclusion_rule(_model("Relu", {"x": onnx.TensorProto.FLOAT}), "test_dropout_training") == "training"
    assert exclusion_rule(_model("SequenceEmpty", {}), "test_sequence_empty") == "sequence"
    assert exclusion_rule(_model("OptionalHasElement", {"x": onnx.TensorProto.FLOAT}), "test_optional") == "optional"
    assert exclusion_rule(_model("Relu", {"x": onnx.TensorProto.FLOAT}), "test_relu") is None
