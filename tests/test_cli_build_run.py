"""`relay-tune build` and `relay-tune run`: compile to one file, run it, and fail cleanly on user mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relay_tune.cli import main
from relay_tune.interpreter import evaluate
from relay_tune.runtime import load
from relay_tune.text import load_module

MODEL = """#[version = "0.0.5"]
def @main(%data: Tensor[(1, 3, 10, 10), float32]) {
  %0 = nn.conv2d(%data, meta[relay.Constant][0], padding=[1, 1, 1, 1], channels=6, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, meta[relay.Constant][1]);
  %2 = nn.relu(%1);
  %3 = reshape(%2, newshape=[1, 600]);
  nn.dense(%3, meta[relay.Constant][2])
}
"""
EXAMPLES = Path(__file__).resolve().parents[1] / "relay_tune" / "examples"
CONSTS = {"relay.Constant": [
    {"dtype": "float32", "shape": [6, 3, 3, 3]},
    {"dtype": "float32", "shape": [6]},
    {"dtype": "float32", "shape": [4, 600]},
]}


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich wraps at 80 columns when not writing to a terminal; long temporary paths would be split.
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.relay"
    path.write_text(MODEL)
    (tmp_path / "tiny.consts.json").write_text(json.dumps(CONSTS))
    return path


@pytest.fixture()
def built(model_file: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = model_file.with_suffix(".rtmod")
    assert main(["build", str(model_file), "-o", str(out), "--jobs", "1"]) == 0
    capsys.readouterr()
    return out


def test_build_prints_tasks_and_compile_time(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = model_file.parent / "tiny.rtmod"
    assert main(["build", str(model_file), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.is_file()
    assert "conv2d_nchw+bias+relu" in text and "dense" in text
    assert "default" in text and "alias" in text
    assert "compiled 2 kernels" in text and "LLVM" in text
    assert "arena" in text and f"wrote {out}" in text


def test_run_random_inputs_prints_shapes_and_latency(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(built), "--repeat", "3", "--profile"]) == 0
    text = capsys.readouterr().out
    assert "output 0: [1, 4] float32" in text
    assert "median" in text and "min" in text
    assert "random, seed 0" in text
    assert "conv2d" in text  # the profile lines


def test_run_of_several_models_checks_and_times_them_in_the_same_rounds(
    built: Path, model_file: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    other = model_file.parent / "other.rtmod"
    assert main(["build", str(model_file), "-o", str(other), "--jobs", "1", "--opt-level", "2"]) == 0
    capsys.readouterr()
    assert main(["run", str(built), str(other)]) == 0
    text = capsys.readouterr().out
    assert f"{other}: outputs within" in text
    assert "same interleaved rounds" in text
    lines = [x for x in text.splitlines() if ": median " in x]
    assert len(lines) == 2 and lines[0].startswith(f"  {built}:") and lines[1].startswith(f"  {other}:")
    assert f"against {built}: " in lines[1]


def test_run_of_several_models_refuses_single_model_options_and_other_inputs(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", str(built), str(built), "--profile"]) == 1
    assert "take one model" in capsys.readouterr().err
    other_source = tmp_path / "other.relay"
    other_source.write_text('#[version = "0.0.5"]\ndef @main(%x: Tensor[(2, 3), float32]) { nn.relu(%x) }\n')
    other = tmp_path / "relu.rtmod"
    assert main(["build", str(other_source), "-o", str(other), "--jobs", "1"]) == 0
    capsys.readouterr()
    assert main(["run", str(built), str(other)]) == 1
    assert "takes other inputs than" in capsys.readouterr().err


def test_run_times_many_warmed_single_runs_by_default(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(built)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("latency"))
    runs = int(line.split("(")[1].split(" x ")[0])
    # nine rounds of at least five single runs (about a second in all), not ten cold ones
    assert runs >= 45 and "x 1 runs, warmed up" in line


def test_run_with_input_file_matches_the_interpreter(
    built: Path, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = np.random.default_rng(0).standard_normal((1, 3, 10, 10)).astype("float32")
    np.savez(tmp_path / "in.npz", data=data)
    assert main(["run", str(built), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
                 "--repeat", "0"]) == 0
    assert "latency" not in capsys.readouterr().out
    with np.load(tmp_path / "out.npz") as outputs:
        got = outputs["output_0"]
    expected = evaluate(load_module(model_file), {"data": data})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)  # type: ignore[arg-type]


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.relay")), ids=lambda p: p.stem)
def test_bundled_example_type_checks_builds_and_matches_the_interpreter(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every model under relay_tune/examples (the Quickstart's among them), through the commands a user runs."""
    assert main(["check", str(example), "--summary"]) == 0
    built = tmp_path / f"{example.stem}.rtmod"
    assert main(["build", str(example), "-o", str(built)]) == 0
    assert f"wrote {built}" in capsys.readouterr().out
    inputs = load(built).random_inputs(seed=3)
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["run", str(built), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
                 "--repeat", "0"]) == 0
    with np.load(tmp_path / "out.npz") as outputs:
        got = outputs["output_0"]
    expected = np.asarray(evaluate(load_module(example), inputs))
    assert np.isfinite(expected).all() and np.ptp(expected) > 0  # weights that give a non-degenerate output
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_build_with_a_log_reports_tuned_and_untuned_tasks(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from relay_tune.compile import resolve_target
    from relay_tune.passes import extract_tasks, optimize
    from relay_tune.tuning import TuningRecord
    from relay_tune.type_infer import infer_types
    from search_space import Config

    tasks = extract_tasks(optimize(infer_types(load_module(model_file))))
    dense = next(t for t in tasks if t.anchor_op == "nn.dense")
    log = tmp_path / "tiny.jsonl"
    record = TuningRecord(dense.key, str(resolve_target("llvm")), Config({"steps": "[]"}), (1e-4,))
    log.write_text(record.to_json() + "\n")
    out = tmp_path / "tuned.rtmod"
    # no in-graph timing check: the record's kernel (an unscheduled loop nest) may be slower than the default one,
    # and the check would then drop it
    assert main(["build", str(model_file), "-o", str(out), "--log", str(log), "--no-check-tuned"]) == 0
    text = capsys.readouterr().out
    assert "(1 tuned" in text
    assert "warning: 1 of 2 tasks have no tuning record" in text
    assert main(["build", str(model_file), "-o", str(out), "--log", str(log), "--require-tuned"]) == 1
    assert "no tuning record" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "{tmp}/missing.rtmod"], "no such file"),
        (["run", "{model}"], "not a relay-tune model file"),
        (["run", "{built}", "--inputs", "{tmp}/wrong.npz"], "unknown input 'x'"),
        (["run", "{built}", "--inputs", "{tmp}/garbage.npz"], "garbage.npz"),
        (["build", "{tmp}/missing.relay", "-o", "{tmp}/x.rtmod"], "no such file"),
        (["build", "{model}", "-o", "{tmp}/x.rtmod", "--target", "llvm -speed=9"], "unknown target option"),
        (["build", "{model}", "-o", "{tmp}/x.rtmod", "--target", "tpu"], "unknown target kind"),
    ],
)
def test_user_errors_end_with_one_message(
    argv: list[str], message: str, built: Path, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.savez(tmp_path / "wrong.npz", x=np.zeros((1, 3, 10, 10), "float32"))
    (tmp_path / "garbage.npz").write_bytes(b"this is not an npz file")
    filled = [a.format(tmp=tmp_path, model=model_file, built=built) for a in argv]
    assert main(filled) == (2 if "target" in message else 1)  # a bad --target is a usage error
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.startswith("relay-tune: ")


def test_the_installed_command_builds_and_runs(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmd.rtmod"
    build = subprocess.run([sys.executable, "-m", "relay_tune", "build", str(model_file), "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([sys.executable, "-m", "relay_tune", "run", str(out), "--repeat", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "output 0: [1, 4] float32" in run.stdout


def test_tasks_spaces_prints_each_tasks_template_family_and_space(model_file: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", str(model_file), "--spaces"]) == 0
    out = capsys.readouterr().out
    assert "tasks on llvm" in out
    lines = [line for line in out.splitlines()[2:] if line.strip()]
    assert lines and all(line.split()[0].startswith(("conv2d", "dense", "reduction", "injective")) for line in lines)
    assert any(line.split()[0].startswith("conv2d") and int(line.split()[2].replace(",", "")) > 1 for line in lines)
