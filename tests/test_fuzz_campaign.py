"""A slice of the fuzz campaign (`relay_tune.testing.fuzz`, `python -m experiments fuzz`) in the test suite:
10,000 inputs through parse and type inference (and ONNX import, and the log reader), and a smaller slice through
the passes, the interpreter and LLVM. Zero defects: every failure a RelayTuneError with a location, no wrong
result, no MemoryError or hang (the inputs run in a worker process with an address-space limit and a per-input
alarm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_tune.testing import fuzz


def _no_defects(stats: object) -> None:
    defects = stats.defects  # type: ignore[attr-defined]
    assert not defects, "\n\n".join(f"{d['defect']} [{d['kind']} #{d['index']} seed {d['seed']}]: {d['detail']}\n"
                                    f"{d.get('input', '')[:2000]}" for d in defects[:5])


def test_fast_slice_of_10000_inputs(tmp_path: Path) -> None:
    stats = fuzz.run_campaign(10_000, seed=2026, jobs=1, deep=False, scratch=tmp_path)
    assert stats.inputs == 10_000
    _no_defects(stats)
    stages = stats.by_stage
    # the slice reaches every stage it is meant to test: parse errors, type errors and well-typed programs
    assert stages["text-char: rejected at parse"] > 1000
    assert stages["text-token: rejected at types"] > 300
    assert stages["registry: types"] > 2000
    assert stages["onnx: types"] > 300 and stages["onnx: rejected at import"] > 100
    assert stages["log: rejected at log"] > 200


def test_deep_slice_runs_the_passes_interpreter_and_llvm(tmp_path: Path) -> None:
    stats = fuzz.run_campaign(600, seed=7, jobs=1, build_every=10, scratch=tmp_path)
    _no_defects(stats)
    assert stats.interpreted > 150 and stats.built >= 5 and stats.onnx_checked > 20


@pytest.mark.parametrize("text", [
    "def @main(%x: Tensor[(2, 3), float32]) { expand_dims(%x, axis=0, num_newaxis=2147483648) }",
    "def @main(%x: Tensor[(1, 3, 4, 4), float32]) { nn.lrn(%x, size=1099511627776) }",
    'def @main(%x: Tensor[(4, 4), float32]) { nn.dense(%x, %x, out_dtype="wrap") }',
    "def @main(%x: Tensor[(4), bool]) { negative(%x) }",
    "def @main(%x: Tensor[(4), bool]) { subtract(%x, %x) }",
    "def @main(%x: Tensor[(0, 8, 1099511627776, 6), float32]) { nn.avg_pool2d(%x, pool_size=[3, 3]) }",
])
def test_defects_the_campaign_found_stay_fixed(text: str) -> None:
    """Each of these once crashed (TypeError, MemoryError, OverflowError) or allocated without bound."""
    from relay_tune.errors import RelayTypeError
    from relay_tune.text import parse_module
    from relay_tune.type_infer import infer_types

    with pytest.raises(RelayTypeError) as info:
        infer_types(parse_module(fuzz.HEADER + text, "regression.relay"))
    assert "regression.relay:2:" in str(info.value)  # line 2: after the version header


def test_attribute_beyond_int64_is_a_type_error() -> None:
    """Generated in memory (the parser already refuses such a literal): it used to pass type inference and then
    make the printed program unparsable."""
    from relay_tune.errors import RelayTypeError
    from relay_tune.ir import Call, Function, IRModule, TensorType, Var, op
    from relay_tune.op.registry import get_op
    from relay_tune.type_infer import infer_types

    x = Var("x", TensorType((2, 3), "float32"))
    attrs = get_op("reshape").make_attrs({"newshape": [6], "allowzero": 10**20})
    with pytest.raises(RelayTypeError, match="out of the int64 range"):
        infer_types(IRModule({"main": Function((x,), Call(op("reshape"), (x,), attrs))}))
