"""`--shape NAME=D0,D1,...` on every command that loads a model: symbolic input dimensions fixed from the command line,
one message (exit code 2) for dimensions still unknown and for shapes that do not fit the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relay_tune.cli import main
from relay_tune.interpreter import evaluate

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402  (after the importorskip of onnx)

SHAPES = ["--shape", "x=2,3,5,7", "--shape", "b=2,4,5,7"]
COMMANDS = ["tasks", "build", "tune"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich wraps at 80 columns when not writing to a terminal; the messages checked below are single lines.
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture()
def symbolic_model(tmp_path: Path) -> Path:
    """conv2d(x) + b, flattened: x is [N, 3, H, 7] and b [batch, 4, H, 7] (N, batch and H symbolic)."""
    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype("float32")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["conv", "b"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["act"]),
        helper.make_node("Flatten", ["act"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", 7]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4, "H", 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )
    path = tmp_path / "symbolic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _command_line(command: str, model: Path, *extra: str) -> list[str]:
    """Arguments of `command` on `model`: outputs and logs go beside the model, tuning takes two trials."""
    if command == "build":
        return ["build", str(model), "-o", str(model.with_suffix(".rtmod")), "--jobs", "1", *extra]
    if command == "tune":
        return [str(model), "--trials", "2", "--log", str(model.with_suffix(".jsonl")), *extra]
    return [command, str(model), *extra]


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_dimensions_are_listed_in_one_message(command: str, symbolic_model: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_command_line(command, symbolic_model)) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "x [N, 3, H, 7]" in line and "b [batch, 4, H, 7]" in line
    assert "--shape NAME=D0,D1,..." in line and "--shape x=1,3,1,7 --shape b=1,4,1,7" in line
    assert not symbolic_model.with_suffix(".rtmod").exists() and not symbolic_model.with_suffix(".jsonl").exists()


def test_a_partly_given_shape_lists_only_what_is_still_unknown(symbolic_model: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", str(symbolic_model), "--shape", "x=2,3,5,7"]) == 2
    err = capsys.readouterr().err
    assert "b [batch, 4, H, 7]" in err and "x [" not in err


def test_the_message_comes_without_a_traceback(symbolic_model: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "relay_tune", "tasks", str(symbolic_model)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.startswith("relay-tune: ")


def test_check_with_shapes(symbolic_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Flatten needs the sizes of every axis it folds: without them the import says which inputs to give
    assert main(["check", str(symbolic_model)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "(Flatten)" in line and "x [N, 3, H, 7]; b [batch, 4, H, 7]" in line and "--shape" in line
    assert main(["check", str(symbolic_model), *SHAPES]) == 0
    out = capsys.readouterr().out
    assert "%x: Tensor[(2, 3, 5, 7), float32]" in out and "Tensor[(2, 140), float32]" in out


def test_tasks_with_shapes(symbolic_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", str(symbolic_model), *SHAPES]) == 0
    assert "2x3x5x7 * 4x3x3x3" in capsys.readouterr().out


def test_build_with_shapes_matches_the_interpreter(symbolic_model: Path) -> None:
    from relay_tune.frontend import from_onnx
    from relay_tune.runtime import load

    assert main(_command_line("build", symbolic_model, *SHAPES)) == 0
    model = load(symbolic_model.with_suffix(".rtmod"))
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((2, 3, 5, 7)).astype("float32"),
              "b": rng.standard_normal((2, 4, 5, 7)).astype("float32")}
    mod, _ = from_onnx(symbolic_model, shape_overrides={"x": (2, 3, 5, 7), "b": (2, 4, 5, 7)})
    np.testing.assert_allclose(model.run(**inputs), np.asarray(evaluate(mod, inputs)), rtol=1e-4, atol=1e-5)


def test_tune_with_shapes(symbolic_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_command_line("tune", symbolic_model, *SHAPES)) == 0
    assert "2x3x5x7" in capsys.readouterr().out
    assert symbolic_model.with_suffix(".jsonl").is_file() and symbolic_model.with_suffix(".rtmod").is_file()


@pytest.mark.parametrize("command", ["check", *COMMANDS])
@pytest.mark.parametrize(("shape", "says"), [
    ("q=2,3,5,7", "the model has no input 'q' (inputs: x, b)"),
    ("x=2,3,5", "gives 3 dimension(s); input 'x' has 4: [N, 3, H, 7]"),
    ("x=2,4,5,7", "changes the fixed size of dimension 1 of input 'x' [N, 3, H, 7]"),
])
def test_a_shape_that_does_not_fit_the_model(command: str, shape: str, says: str, symbolic_model: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_command_line(command, symbolic_model, "--shape", shape)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("relay-tune: ") and says in line


@pytest.mark.parametrize("command", ["check", *COMMANDS])
def test_one_input_given_two_shapes(command: str, symbolic_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _command_line(command, symbolic_model, "--shape", "x=1,3,5,7", "--shape", "x=2,3,5,7")
    assert main(args) == 2
    assert "gives input 'x' two shapes: 1,3,5,7 and 2,3,5,7" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["check", *COMMANDS])
@pytest.mark.parametrize("shape", ["x=2,a", "x", "=1,2", "x=-1,3"])
def test_a_malformed_shape_is_a_usage_error(command: str, shape: str, symbolic_model: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(_command_line(command, symbolic_model, "--shape", shape))
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shape: expected NAME=D0,D1,..." in err and "Traceback" not in err


DYNAMIC_RELAY = """#[version = "0.0.5"]
def @main(%x: Tensor[(?, 4), float32], %w: Tensor[(3, ?), float32]) {
  %0 = nn.relu(%x);
  nn.dense(%0, %w)
}
"""


def test_relay_text_with_open_dimensions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dynamic.relay"
    path.write_text(DYNAMIC_RELAY)
    assert main(["check", str(path)]) == 0  # type checking needs no sizes
    assert "-> Tensor[(?, 3), float32]" in capsys.readouterr().out
    assert main(["tasks", str(path)]) == 2
    assert "x [?, 4]; w [3, ?]" in capsys.readouterr().err
    assert main(["tasks", str(path), "--shape", "x=5,4", "--shape", "w=3,4"]) == 0
    assert "dense 5x4 * 3x4" in capsys.readouterr().out
    assert main(["tasks", str(path), "--shape", "x=5,4", "--shape", "w=2,4"]) == 2
    assert "changes the fixed size of dimension 0 of input 'w' [3, ?]" in capsys.readouterr().err


def test_a_scalar_input_has_a_known_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scaled.relay"
    path.write_text('#[version = "0.0.5"]\ndef @main(%x: Tensor[(?, 4), float32], %s: float32) {\n'
                    "  multiply(%x, %s)\n}\n")
    assert main(["tasks", str(path)]) == 2
    assert "unknown dimensions in: x [?, 4]. Give" in capsys.readouterr().err  # the scalar is not listed
    assert main(["tasks", str(path), "--shape", "x=3,4"]) == 0


def test_an_onnx_input_without_a_shape_takes_any_given_shape(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "rankless",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "rankless.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert "x (no shape)" in err and "e.g. --shape x=D0,D1,..." in err
    assert main(["tasks", str(path), "--shape", "x=2,3,5"]) == 0
    assert "relu 2x3x5" in capsys.readouterr().out


def test_a_negative_onnx_size_is_an_open_dimension(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Some exporters (Paddle's) write an open size as -1: it is listed as unknown and takes a given size."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "minus_one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    path = tmp_path / "minus_one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["tasks", str(path)]) == 2
    assert "x [?, 3, 4]" in capsys.readouterr().err
    assert main(["tasks", str(path), "--shape", "x=2,3,4"]) == 0
    assert "relu 2x3x4" in capsys.readouterr().out
