"""The ONNX backend test models shipped with the `onnx` package, through relay-tune.

Folders `pytorch-converted`, `pytorch-operator` and `simple` under `onnx/backend/test/data` each hold
one directory per model: `model.onnx` plus `test_data_set_*/{input,output}_*.pb` (inputs and the
reference outputs). Every model is imported and run by the reference interpreter (and by the
compiled model too: see the slow test) and compared with the reference outputs.

A model counts as
- "passed" when every data set matches,
- "unsupported" when it uses operators the importer does not convert (`UnsupportedOperatorsError`),
- "failed" otherwise (import error, run error or mismatch), listed with the reason.

The per-folder counts and the failures are printed; floors a little below the current results make
regressions fail. Run this file directly for the report alone: `python tests/test_onnx_backend_suite.py`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import UnsupportedOperatorsError
from relay_tune.interpreter import evaluate

DATA_DIR = Path(onnx.__file__).resolve().parent / "backend" / "test" / "data"
FOLDERS = ("pytorch-converted", "pytorch-operator", "simple")
# The backend suite's own tolerances are rtol 1e-3, atol 1e-7; float32 sums over large windows need a
# little absolute slack.
RTOL, ATOL = 1e-3, 1e-5

# Floors: passed models per folder (current results: 82/82, 35/35, 3 of 7 in scope; the 4 failures are
# Expand models whose target shape is a run-time input, which static shapes cannot express).
FLOORS = {"pytorch-converted": 80, "pytorch-operator": 34, "simple": 3}
IN_SCOPE_RATE_FLOOR = 0.93

Runner = Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]]


@dataclass
class SuiteResult:
    folder: str
    passed: list[str] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def in_scope(self) -> int:
        return len(self.passed) + len(self.failed)

    def report(self) -> str:
        lines = [
            f"{self.folder}: {len(self.passed)}/{self.in_scope} in-scope models pass; "
            f"{len(self.unsupported)} unsupported, {len(self.failed)} failed"
        ]
        lines += [f"  FAIL {name}: {reason}" for name, reason in sorted(self.failed.items())]
        lines += [f"  unsupported {name}: {reason}" for name, reason in sorted(self.unsupported.items())]
        return "\n".join(lines)


def _data_sets(model_dir: Path) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    sets = []
    for data_dir in sorted(model_dir.glob("test_data_set_*")):
        load = lambda files: [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]
        sets.append((load(sorted(data_dir.glob("input_*.pb"))), load(sorted(data_dir.glob("output_*.pb")))))
    return sets


def interpreter_runner(mod: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    result = evaluate(mod, inputs)
    return list(result) if isinstance(result, tuple) else [result]


def _check_model(model_dir: Path, runner: Runner) -> str | None:
    """None if the model passes, else the reason it fails. Raises UnsupportedOperatorsError."""
    model = onnx.load(str(model_dir / "model.onnx"))
    try:
        mod, _ = from_onnx(model)
    except UnsupportedOperatorsError:
        raise
    except Exception as err:  # every failure is reported, never hidden
        return f"import: {type(err).__name__}: {_short(err)}"
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    for k, (inputs, expected) in enumerate(_data_sets(model_dir)):
        try:
            outputs = runner(mod, dict(zip(names, inputs)))
        except Exception as err:
            return f"data set {k}: run: {type(err).__name__}: {_short(err)}"
        if len(outputs) != len(expected):
            return f"data set {k}: {len(outputs)} outputs, expected {len(expected)}"
        for i, (got, want) in enumerate(zip(outputs, expected)):
            if got.shape != want.shape or got.dtype != want.dtype:
                return f"data set {k}, output {i}: {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
            if not np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True):
                error = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
                return f"data set {k}, output {i}: values differ (max abs error {error:.3g})"
    return None


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return text if len(text) <= 200 else text[:197] + "..."


def run_folder(folder: str, runner: Runner) -> SuiteResult:
    result = SuiteResult(folder)
    for model_dir in sorted(p for p in (DATA_DIR / folder).iterdir() if (p / "model.onnx").is_file()):
        try:
            reason = _check_model(model_dir, runner)
        except UnsupportedOperatorsError as err:
            result.unsupported[model_dir.name] = ", ".join(f"{op} (x{n})" for op, n in sorted(err.counts.items()))
            continue
        if reason is None:
            result.passed.append(model_dir.name)
        else:
            result.failed[model_dir.name] = reason
    return result


def _require_data() -> None:
    # the onnx wheel ships its backend test data; a build of onnx without it cannot run this suite
    assert DATA_DIR.is_dir(), f"the onnx package has no backend test data at {DATA_DIR}"


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, SuiteResult]:
    _require_data()
    return {folder: run_folder(folder, interpreter_runner) for folder in FOLDERS}


@pytest.mark.parametrize("folder", FOLDERS)
def test_backend_folder_through_interpreter(
    folder: str, interpreter_results: dict[str, SuiteResult], capsys: pytest.CaptureFixture[str]
) -> None:
    result = interpreter_results[folder]
    with capsys.disabled():
        print("\n" + result.report())
    assert len(result.passed) >= FLOORS[folder], result.report()


def test_backend_in_scope_pass_rate(interpreter_results: dict[str, SuiteResult],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    passed = sum(len(r.passed) for r in interpreter_results.values())
    in_scope = sum(r.in_scope for r in interpreter_results.values())
    unsupported = sum(len(r.unsupported) for r in interpreter_results.values())
    with capsys.disabled():
        print(f"\nONNX backend suite (interpreter): {passed}/{in_scope} in-scope models pass "
              f"({passed / in_scope:.1%}); {unsupported} models use unsupported operators")
    assert passed / in_scope >= IN_SCOPE_RATE_FLOOR


def test_unsupported_models_are_only_those_with_out_of_scope_operators(
    interpreter_results: dict[str, SuiteResult]
) -> None:
    """Sequences, strings and gradients are out of scope; nothing else may land in 'unsupported'."""
    out_of_scope = ("Sequence", "SplitToSequence", "ConcatFromSequence", "StringNormalizer", "Gradient")
    for result in interpreter_results.values():
        for name, ops in result.unsupported.items():
            assert any(token in ops for token in out_of_scope), f"{name}: {ops}"


# --------------------------------------------------------------------------------------------
# compiled models
# --------------------------------------------------------------------------------------------


def compiled_runner() -> Runner:
    """A runner compiling each module for the host CPU with default schedules."""
    from relay_tune import build

    def run(mod: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        # The imported module embeds its weights, so no params are bound at build time.
        result = build(mod, "llvm").run(**inputs)
        return list(result) if isinstance(result, tuple) else [np.asarray(result)]

    return run


@pytest.mark.slow
def test_backend_suite_through_compiled_models(
    interpreter_results: dict[str, SuiteResult], capsys: pytest.CaptureFixture[str]
) -> None:
    runner = compiled_runner()
    reports = []
    for folder in FOLDERS:
        result = run_folder(folder, runner)
        reports.append(result.report())
        # Compiled execution must pass whatever the interpreter passes, less a small margin.
        assert len(result.passed) >= len(interpreter_results[folder].passed) - 2, result.report()
    with capsys.disabled():
        print("\nONNX backend suite (compiled):\n" + "\n".join(reports))


if __name__ == "__main__":
    started = time.perf_counter()
    use_compiled = "--compiled" in sys.argv[1:]
    runner = compiled_runner() if use_compiled else interpreter_runner
    if runner is None:
        sys.exit("relay_tune.build is not available")
    totals = [0, 0, 0]
    for folder in FOLDERS:
        result = run_folder(folder, runner)
        print(result.report())
        totals[0] += len(result.passed)
        totals[1] += result.in_scope
        totals[2] += len(result.unsupported)
    print(f"total: {totals[0]}/{totals[1]} in-scope pass, {totals[2]} unsupported "
          f"({time.perf_counter() - started:.1f} s, {os.cpu_count()} CPUs)")
