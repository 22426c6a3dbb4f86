"""ONNX backend node conformance: every node test case of the installed `onnx` package through relay-tune.

Each case of `onnx.backend.test.case.node.collect_testcases()` (a one-node model plus input and expected
output arrays) is imported with `relay_tune.frontend.from_onnx` and run by the reference interpreter or by
the compiled model (`relay_tune.build(mod, "llvm")`), then classified:

- ``passed``: every output matches in dtype, shape and value (the case's own rtol; atol at least
  `MIN_ATOL`, the slack float32 reductions need),
- ``unsupported``: the importer does not convert an operator of the model (a miss, counted against the
  pass rate and tabulated by operator),
- ``failed``: anything else (an import error, a run error or a mismatch), with the reason,
- ``excluded``: out of scope by one of the rules in `EXCLUSION_RULES` (training, sequence, optional and
  string cases), counted by rule and left out of the pass rate.

Integer inputs that decide shapes (a Reshape's shape, a Slice's starts, TopK's k, ...) are constants in
exported models. When a case fails to import with its integer inputs as run-time inputs, it is imported
again with those inputs bound to the data set's values (`CaseResult.bound_inputs` says so).

    python -m relay_tune.testing.onnx_cases [--compiled] [--match SUBSTRING] [--failures]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx.backend.test.case.node import collect_testcases

from relay_tune import build
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import UnsupportedOperatorsError
from relay_tune.interpreter import evaluate

MIN_ATOL = 1e-5
STATUSES = ("passed", "unsupported", "failed", "excluded")

# Operator types (any domain) and value types that put a case out of scope, by rule.
_TRAINING_OPS = frozenset({"Gradient", "Adagrad", "Adam", "Momentum"})
_SEQUENCE_OPS = frozenset({
    "SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceInsert", "SequenceErase", "SequenceLength",
    "SequenceMap", "SplitToSequence", "ConcatFromSequence",
})
_OPTIONAL_OPS = frozenset({"Optional", "OptionalHasElement", "OptionalGetElement"})
_STRING_OPS = frozenset({"StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch", "LabelEncoder"})

Runner = Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one node test case."""

    name: str
    op_types: tuple[str, ...]
    status: str  # one of STATUSES
    reason: str = ""  # the failure, the exclusion rule, or the unsupported operators
    missing_ops: tuple[str, ...] = ()  # for "unsupported": the operator types the importer lacks
    bound_inputs: tuple[str, ...] = ()  # integer inputs imported as constants


@dataclass
class ConformanceReport:
    """All case results of one run (interpreter or compiled)."""

    runner_name: str
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def in_scope(self) -> int:
        return len(self.results) - self.count("excluded")

    @property
    def pass_rate(self) -> float:
        return self.count("passed") / self.in_scope if self.in_scope else 0.0

    def excluded_by_rule(self) -> Counter[str]:
        return Counter(r.reason for r in self.results if r.status == "excluded")

    def misses_by_operator(self) -> Counter[str]:
        """Unsupported cases per missing operator type (a case missing two operators counts for each)."""
        return Counter(op for r in self.results if r.status == "unsupported" for op in r.missing_ops)

    def failures_by_operator(self) -> Counter[str]:
        return Counter(r.op_types[0] if r.op_types else "?" for r in self.results if r.status == "failed")

    def summary(self) -> str:
        excluded = ", ".join(f"{rule} {n}" for rule, n in sorted(self.excluded_by_rule().items()))
        bound = sum(1 for r in self.results if r.status == "passed" and r.bound_inputs)
        return (
            f"ONNX backend node cases ({self.runner_name}, onnx {onnx.__version__}): {len(self.results)} cases, "
            f"{self.count('excluded')} excluded ({excluded}); {self.in_scope} in scope: "
            f"{self.count('passed')} passed ({self.pass_rate:.1%}), {self.count('unsupported')} unsupported, "
            f"{self.count('failed')} failed; {bound} passed with integer inputs bound as constants "
            f"({self.seconds:.0f} s)"
        )

    def table(self, limit: int | None = None) -> str:
        misses = self.misses_by_operator().most_common(limit)
        failures = self.failures_by_operator()
        lines = [f"{'operator':<28}{'unsupported cases':>18}"]
        lines += [f"{op:<28}{n:>18}" for op, n in misses]
        lines.append("")
        lines.append(f"{'operator':<28}{'failed cases':>18}")
        lines += [f"{op:<28}{n:>18}" for op, n in failures.most_common(limit)]
        return "\n".join(lines)

    def failures(self) -> str:
        return "\n".join(f"FAIL {r.name}: {r.reason}" for r in self.results if r.status == "failed")


# ------------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------------


def _graph_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    """The nodes of `graph` and of every subgraph (Loop / If / Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graph_nodes(sub)


def _value_kinds(type_proto: onnx.TypeProto) -> set[str]:
    """'sequence', 'optional', 'map' and 'string' for the parts of a value type that are those."""
    kinds: set[str] = set()
    which = type_proto.WhichOneof("value")
    if which == "sequence_type":
        kinds |= {"sequence"} | _value_kinds(type_proto.sequence_type.elem_type)
    elif which == "optional_type":
        kinds |= {"optional"} | _value_kinds(type_proto.optional_type.elem_type)
    elif which == "map_type":
        kinds.add("sequence")
    elif which == "tensor_type" and type_proto.tensor_type.elem_type == onnx.TensorProto.STRING:
        kinds.add("string")
    return kinds


def exclusion_rule(model: onnx.ModelProto, name: str) -> str | None:
    """The rule that puts a case out of scope, or None.

    - ``training``: a training operator (Gradient, Adagrad, Adam, Momentum; the preview training domain) or
      a case named for its training mode (``*_training*``: BatchNormalization / Dropout in training mode),
    - ``sequence``: a sequence (or map) value or a sequence operator,
    - ``optional``: an optional value or an optional operator,
    - ``string``: a string tensor or a string operator.
    """
    nodes = list(_graph_nodes(model.graph))
    op_types = {n.op_type for n in nodes}
    if op_types & _TRAINING_OPS or any(n.domain == "ai.onnx.preview.training" for n in nodes) or "_training" in name:
        return "training"
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    kinds = set().union(*(_value_kinds(v.type) for v in values)) if values else set()
    kinds |= {"string" for n in nodes for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
              and a.t.data_type == onnx.TensorProto.STRING}
    if "sequence" in kinds or op_types & _SEQUENCE_OPS:
        return "sequence"
    if "optional" in kinds or op_types & _OPTIONAL_OPS:
        return "optional"
    if "string" in kinds or op_types & _STRING_OPS:
        return "string"
    return None


# ------------------------------------------------------------------------------------------------
# running one case
# ------------------------------------------------------------------------------------------------


def interpreter_runner(mod: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs `mod` with the numpy reference interpreter."""
    result = evaluate(mod, inputs)
    return [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]


def compiled_runner(mod: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Compiles `mod` for the host CPU with default schedules and runs it."""
    result = build(mod, "llvm").run(**inputs)
    return [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return text if len(text) <= 240 else text[:237] + "..."


def _bind_integer_inputs(model: onnx.ModelProto, names: Sequence[str], values: Sequence[np.ndarray]
                         ) -> tuple[onnx.ModelProto, list[str]]:
    """`model` with its integer graph inputs turned into initializers holding `values`."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    integer = {name: value for name, value in zip(names, values) if np.asarray(value).dtype.kind in "iu"}
    kept = [vi for vi in bound.graph.input if vi.name not in integer]
    del bound.graph.input[:]
    bound.graph.input.extend(kept)
    for name, value in integer.items():
        bound.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))
    return bound, sorted(integer)


def _arrays(values: Sequence[Any]) -> list[np.ndarray]:
    """Data-set values as numpy arrays (some cases store exotic element types as TensorProto)."""
    return [onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in values]


def _compare(outputs: Sequence[np.ndarray], expected: Sequence[Any], rtol: float, atol: float) -> str | None:
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(outputs, expected)):
        want = np.asarray(want)
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"output {i}: {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
        if want.dtype.kind == "V" and got.dtype == want.dtype and want.dtype.name.startswith(("bfloat", "float")):
            # ml_dtypes floats (kind "V"): compared as float32 values, so NaNs of any payload are equal
            got, want = got.astype(np.float32), want.astype(np.float32)
        if want.dtype.kind in "fc":
            if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
                error = float(np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))))
                return f"output {i}: values differ (max abs error {error:.3g})"
        elif not np.array_equal(got, want):
            return f"output {i}: values differ ({int(np.sum(got != want))} of {want.size} elements)"
    return None


def run_case(case: Any, runner: Runner) -> CaseResult:
    """Imports, runs and classifies one `onnx.backend.test.case` TestCase."""
    model: onnx.ModelProto = case.model
    op_types = tuple(dict.fromkeys(n.op_type for n in model.graph.node))
    rule = exclusion_rule(model, case.name)
    if rule is not None:
        return CaseResult(case.name, op_types, "excluded", rule)
    initializers = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in initializers]
    atol = max(float(case.atol), MIN_ATOL)
    bound_names: list[str] = []
    for raw_inputs, raw_expected in case.data_sets:
        inputs, expected = _arrays(raw_inputs), _arrays(raw_expected)
        try:
            mod, _ = from_onnx(model)
            feed = dict(zip(names, inputs))
        except UnsupportedOperatorsError as err:
            missing = tuple(sorted(err.counts))
            return CaseResult(case.name, op_types, "unsupported", ", ".join(missing), missing)
        except Exception as first_err:  # every failure is reported with its reason, never hidden
            bound_model, bound_names = _bind_integer_inputs(model, names, inputs)
            if not bound_names:
                return CaseResult(case.name, op_types, "failed", f"import: {_short(first_err)}")
            try:
                mod, _ = from_onnx(bound_model)
            except Exception as err:
                return CaseResult(case.name, op_types, "failed", f"import: {_short(err)}")
            feed = {n: v for n, v in zip(names, inputs) if n not in bound_names}
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                outputs = runner(mod, feed)
        except Exception as err:
            return CaseResult(case.name, op_types, "failed", f"run: {_short(err)}", bound_inputs=tuple(bound_names))
        mismatch = _compare(outputs, expected, float(case.rtol), atol)
        if mismatch is not None:
            return CaseResult(case.name, op_types, "failed", mismatch, bound_inputs=tuple(bound_names))
    return CaseResult(case.name, op_types, "passed", bound_inputs=tuple(bound_names))


def collect_cases(match: str = "") -> list[Any]:
    """The node test cases of the installed onnx package whose name contains `match`."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the case generators overflow casts on purpose
        cases = collect_testcases()
    return [c for c in cases if match in c.name]


def run_cases(cases: Sequence[Any], runner: Runner, runner_name: str) -> ConformanceReport:
    started = time.perf_counter()
    report = ConformanceReport(runner_name, [run_case(case, runner) for case in cases])
    report.seconds = time.perf_counter() - started
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relay_tune.testing.onnx_cases", description=__doc__.split("\n")[0])
    parser.add_argument("--compiled", action="store_true", help="run the compiled models (default: the interpreter)")
    parser.add_argument("--match", default="", help="only the cases whose name contains this")
    parser.add_argument("--failures", action="store_true", help="list every failed case with its reason")
    parser.add_argument("--top", type=int, default=40, help="rows of the per-operator tables (default 40)")
    args = parser.parse_args(argv)
    cases = collect_cases(args.match)
    runner, name = (compiled_runner, "compiled") if args.compiled else (interpreter_runner, "interpreter")
    report = run_cases(cases, runner, name)
    print(report.summary())
    print()
    print(report.table(args.top))
    if args.failures:
        print()
        print(report.failures())
    return 0


if __name__ == "__main__":
    sys.exit(main())
