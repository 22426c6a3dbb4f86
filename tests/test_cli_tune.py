"""`relay-tune MODEL --trials N` and `relay-tune logs`: the main form end to end, and the run surviving SIGKILL and
Ctrl-C with its log intact and resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from model_sources import write_tiny_cnn

from relay_tune.cli import main
from relay_tune.tuning import read_events, read_records


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich wraps at 80 columns when not writing to a terminal; long temporary paths would be split.
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    return write_tiny_cnn(tmp_path)


def no_repeats(log: Path) -> bool:
    counts = Counter((r.workload_key, r.target, r.config_key) for r in read_records(log))
    return max(counts.values()) == 1


def test_tune_prints_results_and_builds_the_model(model_file: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    log, out = tmp_path / "tiny.jsonl", tmp_path / "tiny.rtmod"
    assert main([str(model_file), "--trials", "8", "--log", str(log), "-o", str(out), "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert "tuning results" in text and "conv2d_nchw+bias+relu" in text and "softmax" in text
    assert "default" in text and "tuned" in text and "speedup" in text
    assert "end-to-end latency" in text and "trials/min" in text
    assert f"log: {log}" in text and f"model: {out}" in text
    assert len(read_records(log)) == 8 and out.is_file()
    assert main(["run", str(out), "--repeat", "1"]) == 0


def test_default_log_and_model_paths(model_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["tune", str(model_file), "--trials", "3", "--tasks", "dense"]) == 0
    logs = list((tmp_path / "logs").glob("tiny.llvm-*.jsonl"))
    assert len(logs) == 1
    assert logs[0].with_suffix(".rtmod").is_file()
    assert list((tmp_path / "logs").glob("tiny.llvm-*.optuna.journal"))  # the embedded Optuna storage
    assert {r.description for r in read_records(logs[0])} == {"dense 1x864 * 20x864"}
    text = capsys.readouterr().out
    # a rerun of the finished run measures nothing new
    assert main(["tune", str(model_file), "--trials", "3", "--tasks", "dense"]) == 0
    assert "0 trials this run (3 of 3 in the log)" in capsys.readouterr().out
    assert len(read_records(logs[0])) == 3 and "3 trials this run" in text


def test_help_explains_the_main_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--trials", "--target", "--log", "--storage", "--timeout", "--jobs", "--seed", "--search",
                   "--output", "--tasks"):
        assert option in text
    assert "resumes" in text and "Ctrl-C" in text
    assert main([]) == 2
    top = capsys.readouterr().out
    assert "tune" in top and "logs" in top


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{model}", "--trials", "-1"], "--trials must be >= 0"),
        (["{model}", "--trials", "2", "--tasks", "nothing like this"], "no task matches"),
        (["{tmp}/missing.relay", "--trials", "2"], "no such file"),
        (["{model}", "--trials", "2", "--target", "tpu"], "unknown target kind"),
    ],
)
def test_user_mistakes_end_with_one_message(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    args = [a.format(model=model_file, tmp=tmp_path) for a in argv] + ["--log", str(tmp_path / "x.jsonl")]
    assert main(args) == (2 if "target" in message else 1)  # a bad --target is a usage error
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cuda_target_without_a_gpu(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from relay_tune.runtime.cuda import cuda_available

    if cuda_available() is None:
        pytest.skip("a GPU is available here")
    assert main([str(model_file), "--trials", "2", "--target", "cuda", "--log", str(tmp_path / "g.jsonl")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("relay-tune: cannot tune for cuda") and len(err.splitlines()) == 1


def test_logs_summary_best_and_merge(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main([str(model_file), "--trials", "4", "--log", str(first), "--search", "random"]) == 0
    assert main([str(model_file), "--trials", "4", "--log", str(second), "--seed", "5", "--search", "random",
                 "--no-cache"]) == 0  # the tuning cache would answer every task from the first run
    capsys.readouterr()
    assert main(["logs", "summary", str(first), str(second)]) == 0
    text = capsys.readouterr().out
    assert "8 records" in text and "conv2d_nchw+bias+relu" in text and "2 tuning session(s): 2 finished" in text
    assert main(["logs", "best", str(first)]) == 0
    assert '"family":' in capsys.readouterr().out
    merged, best = tmp_path / "merged.jsonl", tmp_path / "best.jsonl"
    assert main(["logs", "merge", str(first), str(second), "-o", str(merged)]) == 0
    assert len(read_records(merged)) == 8
    assert main(["logs", "merge", str(first), str(second), "-o", str(best), "--best"]) == 0
    kept = read_records(best)
    assert len({(r.workload_key, r.target) for r in kept}) == len(kept) >= 1
    capsys.readouterr()
    assert main(["logs", "merge", str(first), "-o", str(merged)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["logs", "merge", str(first), "-o", str(first), "--force"]) == 1
    assert "in place" in capsys.readouterr().err
    assert main(["logs", "best", str(first), "-o", str(tmp_path / "top2.jsonl"), "--top", "2"]) == 0
    assert main(["logs", "summary", str(tmp_path / "nope.jsonl")]) == 1


# ---------------------------------------------------------------------------------------------------------------
# Killed and interrupted runs (real processes)
# ---------------------------------------------------------------------------------------------------------------


def start_tuner(model_file: Path, log: Path, trials: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "relay_tune", str(model_file), "--trials", str(trials), "--log", str(log),
           "--search", "tpe"]
    env = {**os.environ, "COLUMNS": "400"}
    # A shell without job control starts background jobs with SIGINT ignored, and an ignored signal stays ignored
    # across exec (Python then installs no KeyboardInterrupt handler): give the tuner Ctrl-C as a terminal would.
    return subprocess.Popen(cmd, cwd=model_file.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_records(log: Path, count: int, process: subprocess.Popen[str], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and len(read_records(log)) >= count:
            return
        if process.poll() is not None:
            pytest.fail(f"the tuner ended early: {process.communicate()[0][-2000:]}")
        time.sleep(0.2)
    process.kill()
    pytest.fail("the tuner did not log enough records in time")


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_resumes_without_losing_records(model_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "tiny.jsonl"
    trials = 24
    tuner = start_tuner(model_file, log, trials)
    wait_for_records(log, 6, tuner)
    tuner.send_signal(signal.SIGKILL)  # the driver only: its worker processes must die with it
    tuner.communicate(timeout=60)
    assert tuner.returncode == -signal.SIGKILL
    killed_text = log.read_text()
    killed = read_records(log)
    assert 6 <= len(killed) < trials
    rerun = subprocess.run([sys.executable, "-m", "relay_tune", str(model_file), "--trials", str(trials), "--log",
                            str(log)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "COLUMNS": "400"})
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert log.read_text().startswith(killed_text)  # append-only: nothing measured before the kill is lost
    records = read_records(log)
    assert len(records) == trials and records[: len(killed)] == killed
    assert no_repeats(log)  # the resumed search did not measure a config again
    assert f"{trials - len(killed)} trials this run ({trials} of {trials} in the log)" in rerun.stdout
    sessions = [e for e in read_events(log) if e.event == "session_start"]
    ends = [e for e in read_events(log) if e.event == "session_end"]
    assert len(sessions) == 2 and len(ends) == 1  # the killed session never ended
    summary = subprocess.run([sys.executable, "-m", "relay_tune", "logs", "summary", str(log)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert "1 finished, 0 interrupted, 1 without an end (killed)" in summary.stdout


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_exit_130_and_a_resume_hint(model_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "tiny.jsonl"
    tuner = start_tuner(model_file, log, 200)
    wait_for_records(log, 3, tuner)
    os.killpg(tuner.pid, signal.SIGINT)  # as a terminal does: the whole process group
    output, _ = tuner.communicate(timeout=120)
    assert tuner.returncode == 130, output[-3000:]
    assert "Resume with" in output and f"--log {log}" in output
    ends = [e for e in read_events(log) if e.event == "session_end"]
    assert len(ends) == 1 and ends[0].data["interrupted"]
    assert no_repeats(log)
