"""Concatenations written in place: the kernels producing a concatenation's inputs write them straight into its
buffer (`relay_tune.compile.concat.in_place_concats`), and the copy kernel is gone. Checked against the
reference interpreter, in blocked and NCHW layouts, nested, through save and load, and where it must not apply."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import BuildWarning
from relay_tune.compile.concat import concat_axis
from relay_tune.interpreter import Interpreter
from relay_tune.runtime.model import load
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import tasks_from_module

BRANCHES = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 32, 9, 11), float32]) {
  %0 = nn.conv2d(%x, meta_wa, channels=16, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%x, meta_wb, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %3 = nn.relu(%2);
  %4 = (%1, %3);
  %5 = concatenate(%4, axis=1);
  nn.conv2d(%5, meta_wc, channels=16, kernel_size=[1, 1])
}"""

NESTED = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 32, 9, 11), float32]) {
  %0 = nn.conv2d(%x, meta_wa, channels=16, kernel_size=[1, 1]);
  %1 = nn.conv2d(%x, meta_wb, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %2 = concatenate((%0, %1), axis=1);
  %3 = nn.conv2d(%2, meta_wc, channels=16, kernel_size=[1, 1]);
  %4 = nn.relu(%3);
  %5 = concatenate((%2, %4), axis=1);
  nn.conv2d(%5, meta_wd, channels=16, kernel_size=[1, 1])
}"""


def _model(text: str, channels_in: tuple[int, ...]) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    shapes = {"wa": (16, 32, 1, 1), "wb": (32, 32, 3, 3), "wc": (16, channels_in[0], 1, 1)}
    if len(channels_in) > 1:
        shapes["wd"] = (16, channels_in[1], 1, 1)
    params = {name: rng.uniform(-0.5, 0.5, shape).astype("float32") for name, shape in shapes.items()}
    for name in params:
        text = text.replace(f"meta_{name}", f"%{name}")
    header = ", ".join(f"%{name}: Tensor[{shape}, float32]".replace("(", "(").replace(",)", ")")
                       for name, shape in shapes.items())
    text = text.replace("def @main(%x: Tensor[(1, 32, 9, 11), float32])",
                        f"def @main(%x: Tensor[(1, 32, 9, 11), float32], {header})")
    return relay_tune.bind_params(parse_module(text), params), params


def _reference(mod: object, x: np.ndarray) -> list[np.ndarray]:
    out = Interpreter(mod).run({"x": x})
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


def _outputs(model: object, x: np.ndarray) -> list[np.ndarray]:
    out = model.run(x=x)
    return list(out) if isinstance(out, tuple) else [out]


def _concat_calls(model: object) -> int:
    names = {t.kernel for t in model.plan.tasks if t.description.startswith("concatenate")}
    return sum(call.kernel in names for call in model.plan.calls)


@pytest.mark.parametrize("layout_planning", [True, False])
def test_branches_are_written_into_the_concatenation(layout_planning: bool) -> None:
    mod, _ = _model(BRANCHES, (48,))
    model = relay_tune.build(mod, target="llvm", layout_planning=layout_planning)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 32, 9, 11)).astype("float32")
    assert _concat_calls(model) == 0  # the copy kernel is gone...
    inner = [s for s in model.plan.storages if s.kind == "arena" and s.offset]
    assert inner  # ...because a branch lives inside the concatenation's buffer
    for got, want in zip(_outputs(model, x), _reference(mod, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_nested_concatenations_share_one_buffer_and_survive_save_and_load(tmp_path: Path) -> None:
    mod, _ = _model(NESTED, (48, 64))
    model = relay_tune.build(mod, target="llvm")
    x = np.random.default_rng(2).uniform(-1, 1, (1, 32, 9, 11)).astype("float32")
    want = _reference(mod, x)
    assert _concat_calls(model) == 0
    offsets = sorted(s.offset for s in model.plan.storages if s.kind == "arena" and s.offset)
    assert len(offsets) >= 2  # the inner concatenation's second part and the outer one's
    for got, expected in zip(_outputs(model, x), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    loaded = load(model.save(tmp_path / "nested.rtmod"))
    assert [s.offset for s in loaded.plan.storages] == [s.offset for s in model.plan.storages]
    for got, expected in zip(_outputs(loaded, x), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_concatenations_that_cannot_be_written_in_place_still_copy_and_are_tuned() -> None:
    # a model input among the parts; a part that is also a model output, concatenated along the rows
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 32, 9, 11), float32], %wa: Tensor[(32, 32, 1, 1), float32],
          %wb: Tensor[(16, 64, 1, 1), float32], %wc: Tensor[(16, 32, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %wa, channels=32, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = concatenate((%x, %1), axis=1);
  %3 = nn.conv2d(%x, %wa, channels=32, kernel_size=[1, 1]);
  %4 = concatenate((%3, %1), axis=2);
  %5 = nn.conv2d(%2, %wb, channels=16, kernel_size=[1, 1]);
  %6 = nn.conv2d(%4, %wc, channels=16, kernel_size=[1, 1]);
  (%5, %6, %3)
}"""
    rng = np.random.default_rng(3)
    mod = relay_tune.bind_params(parse_module(text), {
        name: rng.uniform(-0.5, 0.5, shape).astype("float32")
        for name, shape in (("wa", (32, 32, 1, 1)), ("wb", (16, 64, 1, 1)), ("wc", (16, 32, 1, 1)))})
    x = rng.uniform(-1, 1, (1, 32, 9, 11)).astype("float32")
    # NCHW: `%x` itself is concatenated (with layout planning a layout transform of it would be, in place)
    model = relay_tune.build(mod, target="llvm", layout_planning=False)
    assert _concat_calls(model) == 2
    assert not any(s.offset for s in model.plan.storages)
    assert len(_concat_tasks(mod, False)) == 2
    for got, want in zip(_outputs(model, x), _reference(mod, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_concat_axis_needs_unit_axes_before_it() -> None:
    assert concat_axis((1, 48, 9, 11), [(1, 16, 9, 11), (1, 32, 9, 11)]) == 1
    assert concat_axis((1, 3, 9, 11, 16), [(1, 1, 9, 11, 16), (1, 2, 9, 11, 16)]) == 1  # blocks of channels
    assert concat_axis((2, 48, 9, 11), [(2, 16, 9, 11), (2, 32, 9, 11)]) is None  # batch 2: strided parts
    assert concat_axis((1, 16, 18, 11), [(1, 16, 9, 11), (1, 16, 9, 11)]) is None  # rows of many channels
    assert concat_axis((1, 1, 18), [(1, 1, 9), (1, 1, 9)]) == 2
    assert concat_axis((1, 48, 9, 11), [(1, 16, 9, 11), (1, 31, 9, 11)]) is None


def _concat_tasks(mod: object, layout_planning: bool) -> list[tuple[str, int]]:
    tasks = tasks_from_module(mod, "llvm", layout_planning=layout_planning)
    return [(t.description, t.weight) for t in tasks if t.description.startswith("concatenate")]


@pytest.mark.parametrize("layout_planning", [True, False])
def test_concatenations_written_in_place_are_not_tuned_or_looked_up(layout_planning: bool) -> None:
    for text, channels in ((BRANCHES, (48,)), (NESTED, (48, 64))):
        mod, _ = _model(text, channels)
        assert _concat_tasks(mod, layout_planning) == []
        asked: list[str] = []

        def lookup(key: str, target: object, asked: list[str] = asked) -> None:
            asked.append(key)
            return None

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BuildWarning)
            model = relay_tune.build(mod, target="llvm", logs=lookup, layout_planning=layout_planning)
        wanted = {t.key for t in tasks_from_module(mod, "llvm", layout_planning=layout_planning)}
        assert set(asked) == wanted  # the build looks up exactly the tuner's tasks
        untuned = [str(w.message) for w in caught if "have no tuning record" in str(w.message)]
        assert len(untuned) == 1 and untuned[0].startswith(f"{len(wanted)} of {len(wanted)} tasks")
        assert not any(t.description.startswith("concatenate") for t in model.plan.tasks)
        assert {t.key for t in model.plan.tasks if t.kernel} == wanted


def test_a_concatenation_copied_at_one_site_and_in_place_at_another_is_tuned_for_one() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 32, 9, 11), float32], %wa: Tensor[(32, 32, 1, 1), float32],
          %wb: Tensor[(16, 64, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %wa, channels=32, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = concatenate((%x, %1), axis=1);
  %3 = nn.conv2d(%1, %wa, channels=32, kernel_size=[1, 1]);
  %4 = sigmoid(%3);
  %5 = nn.conv2d(%1, %wa, channels=32, kernel_size=[1, 1]);
  %6 = tanh(%5);
  %7 = concatenate((%4, %6), axis=1);
  %8 = nn.conv2d(%2, %wb, channels=16, kernel_size=[1, 1]);
  %9 = nn.conv2d(%7, %wb, channels=16, kernel_size=[1, 1]);
  add(%8, %9)
}"""
    rng = np.random.default_rng(4)
    mod = relay_tune.bind_params(parse_module(text), {
        "wa": rng.uniform(-0.5, 0.5, (32, 32, 1, 1)).astype("float32"),
        "wb": rng.uniform(-0.5, 0.5, (16, 64, 1, 1)).astype("float32")})
    assert [n for _, n in _concat_tasks(mod, False)] == [1]  # two calls of one workload, one of them in place
    model = relay_tune.build(mod, target="llvm", layout_planning=False)
    assert _concat_calls(model) == 1
    (concat,) = [t for t in model.plan.tasks if t.description.startswith("concatenate")]
    assert concat.occurrences == 1
    x = rng.uniform(-1, 1, (1, 32, 9, 11)).astype("float32")
    for got, want in zip(_outputs(model, x), _reference(mod, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_command_lines_task_table_leaves_in_place_concatenations_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from relay_tune.cli import main

    text = BRANCHES.replace("def @main(%x: Tensor[(1, 32, 9, 11), float32])",
                            "def @main(%x: Tensor[(1, 32, 9, 11), float32], %wa: Tensor[(16, 32, 1, 1), float32], "
                            "%wb: Tensor[(32, 32, 3, 3), float32], %wc: Tensor[(16, 48, 1, 1), float32])")
    for name in ("wa", "wb", "wc"):
        text = text.replace(f"meta_{name}", f"%{name}")
    path = tmp_path / "branches.relay"
    path.write_text(text)
    assert main(["tasks", str(path), "--no-layout-planning"]) == 0
    out = capsys.readouterr().out
    assert "conv2d" in out and "concatenate" not in out
