"""`python -m experiments`: every subcommand runs in a tiny configuration and reports what it measured; bad input
is one line and exit status 2; the shared timer interleaves engines. Behaviour only, never timings."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.__main__ import SUBCOMMANDS, main
from experiments.timing import Samples, TimedCallable, interleaved

REPO = Path(__file__).resolve().parents[1]


def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m experiments ARGV` from the repository root, as experiments/README.md runs it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "experiments", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


# ---------------------------------------------------------------------------------------------------------------
# the entry point
# ---------------------------------------------------------------------------------------------------------------


def test_help_lists_every_subcommand() -> None:
    done = run_module("--help")
    assert done.returncode == 0, done.stderr
    for name in SUBCOMMANDS:
        assert name in done.stdout
    assert set(SUBCOMMANDS) >= {"kernels", "search", "curve", "models", "distributed", "fuzz", "gpu-check"}


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m experiments {name}" in out and "--" in out


@pytest.mark.parametrize("argv, message", [
    (["models", "--models", "nosuchnet"], "unknown network(s) nosuchnet"),
    (["models", "--models", "mlp", "--log", "missing.jsonl"], "no such tuning log: missing.jsonl"),
    (["kernels", "--only", "nosuchop"], "no workload name contains 'nosuchop'"),
    (["search", "--workloads", "nosuch"], "unknown workload 'nosuch'"),
    (["search", "--strategies", "guess"], "unknown strategy 'guess'"),
    (["curve", "--models", "alexnet"], "unknown model(s) alexnet"),
    (["fuzz", "--kinds", "pictures"], "unknown kinds pictures"),
    (["build-time", "--models", "lenet"], "unknown model(s) lenet"),
    (["models", "--models", "mlp", "--baseline-tree", "/nonexistent"], "holds no relay_tune package"),
    (["models", "--models", "light_lenet"], "unknown network(s) light_lenet"),
    (["matvec", "--only", "nosuch"], "no workload name contains 'nosuch'"),
    (["elementwise", "--model", "nosuch"], "unknown network 'nosuch'"),
    (["pooling", "--only", "nosuch", "--skip-model"], "no pooling kernel name contains 'nosuch'"),
    (["recurrent", "--seq", "0"], "must be at least 1"),
    (["fidelity", "--relay", "missing.relay", "--log", "missing.jsonl"], "no such file: missing.relay"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str) -> None:
    done = run_module(*argv)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_no_subcommand_is_a_usage_error() -> None:
    done = run_module()
    assert done.returncode == 2 and "SUBCOMMAND" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------------------------
# the shared timer
# ---------------------------------------------------------------------------------------------------------------


class _Model:
    """Stands in for a CompiledModel: `benchmark(repeat, inputs)` returns one cost per repeat."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def benchmark(self, repeat: int = 3, inputs: object = None) -> list[float]:
        self.calls.append("model")
        return [0.002] * repeat


def test_engines_take_turns_in_every_round() -> None:
    calls: list[str] = []
    engines = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "model": _Model(calls)}
    timed = interleaved(engines, rounds=3, repeat=2)
    assert set(timed) == {"a", "b", "model"}
    assert {name: len(s.seconds) for name, s in timed.items()} == {"a": 6, "b": 6, "model": 6}
    # each round: a warm-up call and two timed calls of a, the same of b, then the model's own benchmark
    assert calls == ["a"] * 3 + ["b"] * 3 + ["model"] + ["a"] * 3 + ["b"] * 3 + ["model"] + \
        ["a"] * 3 + ["b"] * 3 + ["model"]
    assert timed["model"].median == pytest.approx(0.002) and timed["model"].spread == 0.0


def test_a_timed_callable_waits_warms_and_repeats() -> None:
    calls: list[str] = []
    timed = TimedCallable(lambda: calls.append("run"), number=4, warmup=2, before=lambda: calls.append("settle"))
    samples = timed.benchmark(repeat=3)
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert calls == ["settle"] + ["run"] * (2 + 3 * 4)


def test_samples_summarise_median_and_spread() -> None:
    samples = Samples((1.0, 2.0, 3.0, 4.0, 100.0))
    assert samples.median == 3.0
    assert samples.spread == pytest.approx((4.0 - 2.0) / 3.0)  # the outlier does not widen the interquartile range
    assert samples.describe(unit=1.0, label="s") == "3.000 s ±33.3%"
    with pytest.raises(ValueError):
        interleaved({"a": lambda: None}, rounds=0)


# ---------------------------------------------------------------------------------------------------------------
# kernels, models, fuzz, gpu-check: seconds each
# ---------------------------------------------------------------------------------------------------------------


def test_kernels_on_one_small_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels", "--only", "depthwise 1x960x7x7", "--rounds", "1", "--min-ms", "1", "--settle", "0"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("depthwise 1x960x7x7 3x3")]
    assert rows and all(len(line.split()) >= 8 for line in rows)  # cores, ours, numpy, ratio, compile time


def test_matvec_times_a_layer_against_the_triad(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matvec", "--only", "ffn", "--trials", "0", "--rounds", "1", "--repeat", "1", "--triad-mib", "8",
                 "--cold-mib", "8", "--min-ms", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[3]: line.split() for line in out.splitlines()
            if line.startswith("transformer ffn 768x3072") and "MiB" not in line}
    assert set(rows) == {"triad", "default", "tiled", "numpy"}
    assert float(rows["triad"][5]) == 1.0 and all(float(row[4]) > 0 for row in rows.values())  # GB/s, ratio


def test_bf16_times_a_dense_at_both_precisions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bf16", "--only", "dense", "--dense", "64,96", "--rounds", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    error = float(out.split("bf16 relative error against fp32 ")[1].split()[0])
    assert 2.0**-16 < error < 2.0**-6  # bfloat16's rounding, not fp32's nor a wrong result
    assert "contrib_conv2d_NCHWc_bf16" in out
    rows = [line for line in out.splitlines() if "ratio to relay-tune fp32" in line]
    ratios = {row.split(" ms")[0].rsplit(" ", 1)[0].strip(): float(row.split("ratio to relay-tune fp32 ")[1].split()[0])
              for row in rows}
    assert set(ratios) == {"relay-tune fp32", "relay-tune bf16 (widened)", "numpy sgemv"}
    assert ratios["relay-tune fp32"] == 1.0 and all(r > 0 for r in ratios.values())


def test_elementwise_times_a_densenet_injective_function_before_and_after(capsys: pytest.CaptureFixture[str]) -> None:
    # DenseNet's pre-activations are prologues of their 1x1 convolutions: its input's layout transform is timed
    assert main(["elementwise", "--model", "light_densenet121", "--only", "layout_transform 1x3x224x224", "--top",
                 "1", "--rounds", "1", "--min-ms", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("layout_transform 1x3x224x224"))
    assert row[-1] in ("same", "new") and all(float(value) > 0 for value in row[-7:-1])  # MB, before, after, ...


def test_pooling_times_a_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pooling", "--only", "global max pool u8", "--skip-model", "--rounds", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "global max pool u8" in out and " ms " in out


def test_models_checks_and_times_a_small_network(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "models.csv"
    argv = ["models", "--models", "mlp,small_cnn", "--threads", "1", "--rounds", "2", "--repeat", "2",
            "--settle", "0", "--openvino", "off", "--csv", str(table)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mlp" in out and "onnxruntime" in out and "MISMATCH" not in out
    rows = list(csv.DictReader(table.open()))
    assert [r["model"] for r in rows] == ["mlp", "small_cnn"]
    for row in rows:
        assert row["matches"] == "True" and float(row["default_error"]) < 1e-3
        assert float(row["default_ms"]) > 0 and float(row["onnxruntime_ms"]) > 0 and float(row["default_ratio"]) > 0
        assert int(row["default_kernel_calls"]) > 0


def test_thread_team_times_both_runtimes_idle_and_busy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "team.csv"
    argv = ["thread-team", "--models", "", "--rounds", "1", "--repeat", "1", "--busy", "0,1", "--settle", "0",
            "--native-spins", "0", "--csv", str(table)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 busy processes" in out and "geometric mean native / openmp" in out
    rows = list(csv.DictReader(table.open()))
    assert [(r["workload"], r["busy"]) for r in rows] == [(w, b) for b in ("0", "1") for w in ("region", "pools",
                                                                                                 "conv1x1")]
    for row in rows:
        assert float(row["native_over_openmp"]) > 0 and float(row["native_spin0_over_openmp"]) > 0


def test_models_times_openvino_in_f32_when_installed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    table = tmp_path / "models.csv"
    argv = ["models", "--models", "small_cnn", "--threads", "1", "--rounds", "1", "--repeat", "1", "--settle", "0",
            "--openvino", "on", "--csv", str(table)]
    assert main(argv) == 0
    (row,) = list(csv.DictReader(table.open()))
    assert float(row["openvino_error"]) < 1e-3 and float(row["openvino_ms"]) > 0
    assert "openvino" in capsys.readouterr().out


@pytest.mark.slow
def test_models_builds_one_network_from_each_tuning_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    from relay_tune.testing.onnx_zoo import mlp

    model, log = tmp_path / "mlp.onnx", tmp_path / "mlp.jsonl"
    onnx.save(mlp(), str(model))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "relay_tune", "tune", str(model), "--trials", "4", "--log", str(log),
               "--no-cache", "--jobs", "1", "--target", "llvm -num-cores=1"]  # the target `--threads 1` builds for
    tuned = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert tuned.returncode == 0, tuned.stderr
    table = tmp_path / "models.csv"
    # --no-check-tuned: every record is built in, however the in-graph check would weigh 4 trials
    assert main(["models", "--models", "mlp", "--threads", "1", "--rounds", "1", "--repeat", "1", "--settle", "0",
                 "--openvino", "off", "--log", str(log), "--log", str(log), "--no-check-tuned",
                 "--csv", str(table)]) == 0
    (row,) = list(csv.DictReader(table.open()))
    for label in ("default", "tuned1", "tuned2"):  # two logs: two tuned builds, each checked and timed
        assert float(row[f"{label}_error"]) < 1e-3 and float(row[f"{label}_ms"]) > 0
    assert row["default_tuned_tasks"] == "0" and int(row["tuned1_tuned_tasks"]) > 0
    assert "tuned2" in capsys.readouterr().out


def test_fuzz_a_few_hundred_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "campaign.json"
    assert main(["fuzz", "--inputs", "200", "--jobs", "0", "--shallow", "--seed", "3", "--out", str(out)]) == 0
    assert "0 defects" in capsys.readouterr().out
    campaign = json.loads(out.read_text())
    assert campaign["inputs"] == 200 and campaign["defects"] == []
    assert sum(campaign["by_kind"].values()) == 200


def _has_cuda() -> bool:
    try:
        from relay_tune.runtime.cuda import cuda_device

        cuda_device()
    except Exception:
        return False
    return True


def test_gpu_check_without_a_gpu_fails_its_device_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if _has_cuda():
        pytest.skip("this machine has a GPU: the check would run for minutes")
    table = tmp_path / "gpu.csv"
    assert main(["gpu-check", "--skip-models", "--trials", "1", "--budget-s", "30", "--csv", str(table)]) == 1
    rows = list(csv.DictReader(table.open()))
    assert rows[0]["check"] == "device" and rows[0]["result"] == "FAIL"
    assert "1 failed" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# search and curve: their pure parts, then short real runs (slow)
# ---------------------------------------------------------------------------------------------------------------


def test_the_default_search_workloads_are_one_task_each() -> None:
    from experiments import search

    for workload in search.WORKLOADS:  # layout planning and Winograd would split these into several tasks
        task = search.relay_task(workload, 1)
        assert task.flops > 0 and task.space.size() > 1


def test_whole_model_workloads_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from experiments import search

    tasks = search.model_tasks("mobilenet_v1", 1)
    assert len(tasks) > 10
    names = search.model_workloads(["mobilenet_v1:top3", "mobilenet_v1:02", "dense"], 1)
    top = sorted(range(len(tasks)), key=lambda i: -tasks[i].weight * tasks[i].flops)[:3]
    assert names[:3] == [f"mobilenet_v1:{i:02d}" for i in sorted(top)] and names[-1] == "dense"
    assert search.relay_task("mobilenet_v1:02", 1).key == tasks[2].key
    with pytest.raises(ValueError, match="no task 99"):
        search.model_workloads(["mobilenet_v1:99"], 1)
    # Two tasks, two seeds: "xgb-transfer" reaches the best estimate after 2 trials per task, "xgb" after 4.
    workloads = [f"mobilenet_v1:{i:02d}" for i in sorted(top[:2])]
    slow, fast = [1.0, 2.0, 5.0, 10.0, 10.0], [5.0, 10.0, 10.0, 10.0, 10.0]
    outcomes = [search.RunOutcome(w, strategy, seed, list(curve), 0.0, 0.0, 0.0)
                for w in workloads for seed in (0, 1)
                for strategy, curve in (("xgb", slow), ("xgb-transfer", fast))]
    args = argparse.Namespace(workloads=workloads, strategies=["xgb", "xgb-transfer"], transfer_sources=[], cores=1)
    rows = search.whole_model_table(outcomes, args)
    assert [(r["strategy"], r["median_trials_to_95pct"]) for r in rows] == [("xgb", 8), ("xgb-transfer", 4)]
    assert "2.00x fewer than xgb" in capsys.readouterr().out


@pytest.mark.slow
def test_search_runs_caches_and_remeasures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments import search
    from relay_tune.tuning import read_records

    argv = ["search", "--trials", "6", "--seeds", "1", "--workloads", "depthwise", "--strategies", "random,xgb",
            "--warmup", "4", "--batch", "3", "--build-jobs", "1", "--remeasure-rounds", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trials to reach 95%" in out and "re-measuring depthwise" in out
    rows = list(csv.DictReader((tmp_path / "curves.csv").open()))
    for strategy in ("random", "xgb"):
        curve = [float(r["best_gflops"]) for r in rows if r["strategy"] == strategy]
        assert len(curve) == 6 and curve == sorted(curve) and curve[-1] > 0  # best-so-far never drops
    assert (tmp_path / "search_efficiency.png").stat().st_size > 0
    cache = tmp_path / "measurements" / "depthwise-relay.jsonl"
    measured = len(cache.read_text().splitlines())
    assert 6 <= measured <= 12
    for entry in map(json.loads, (tmp_path / "measurements" / "depthwise-relay-remeasured.jsonl").open()):
        assert len(entry["rounds"]) == 2 and entry["gflops"] == pytest.approx(sum(entry["rounds"]) / 2)
    task = search.relay_task("depthwise", 1)  # every run measures the default schedule first, as relay-tune does
    for strategy in ("random", "xgb"):
        assert read_records(tmp_path / "logs" / "depthwise" / f"{strategy}-s0.jsonl")[0].config == \
            task.default_config()
    # a second invocation is answered from the caches: nothing new is measured, the same curves
    assert main(argv) == 0
    assert "already done" in capsys.readouterr().out
    assert len(cache.read_text().splitlines()) == measured
    again = list(csv.DictReader((tmp_path / "curves.csv").open()))
    assert [r for r in again if r["strategy"] == "random"] == [r for r in rows if r["strategy"] == "random"]


def _record(i: int, session: str, at: float) -> object:
    from relay_tune.records.log_format import TuningRecord
    from search_space import Config

    return TuningRecord("k", "llvm", Config({"i": i}), (1e-3,), None, timestamp=at, session=session)


def test_the_tuning_clock_sums_sessions_and_skips_the_gaps(tmp_path: Path) -> None:
    from experiments import curve
    from relay_tune.records.log_format import LogEvent, LogWriter

    log = tmp_path / "run.jsonl"
    writer = LogWriter(log)
    # session a: 1000..1030, then an hour's pause, session b: 5000..5010 (a resumed run)
    writer.write_one(LogEvent("session_start", "a", 1000.0))
    writer.write([_record(0, "a", 1010.0), _record(1, "a", 1030.0)])
    writer.write_one(LogEvent("session_end", "a", 1031.0))
    writer.write_one(LogEvent("session_start", "b", 5000.0))
    writer.write([_record(2, "b", 5004.0), _record(3, "b", 5010.0)])
    clock = curve.tuning_clock(log)
    assert [round(t, 6) for t, _ in clock] == [10.0, 30.0, 35.0, 41.0]
    assert [r.config["i"] for _, r in clock] == [0, 1, 2, 3]
    assert curve.tuning_seconds(log) == pytest.approx(41.0)
    assert curve.tuning_clock(tmp_path / "missing.jsonl") == []


def test_checkpoints_and_time_to_share() -> None:
    from experiments import curve

    assert curve.checkpoints(130.0, 60.0) == [0.0, 60.0, 120.0, 130.0]
    assert curve.checkpoints(0.0, 60.0) == [0.0]

    def points(latencies: list[float]) -> list[object]:
        return [curve.Point("m", "v", 60.0 * i, 10 * i, None, 0, None, e2e) for i, e2e in enumerate(latencies)]

    # default 10 ms, final 5 ms: 90% of the improvement is 5.5 ms, first reached at the third point
    assert curve.time_to_share(points([10.0, 7.0, 5.4, 5.6, 5.0]), 10.0, 0.9) == 120.0
    assert curve.time_to_share(points([10.0, 10.5]), 10.0, 0.9) is None  # no improvement to speak of


@pytest.mark.slow
def test_curve_then_fidelity_on_its_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["curve", "--models", "tiny_resnet18", "--variants", "gradient", "--trials", "6", "--batch", "1",
              "--checkpoint-s", "2", "--rounds", "2", "--out", str(tmp_path)]
    # a piece of tuning that ends this invocation early; the same command continues
    assert main([*common, "--stage", "tune", "--piece-s", "0.5"]) == 0
    assert "run the same command again to continue" in capsys.readouterr().out
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "tiny_resnet18: default schedules" in out and "90% of that improvement after" in out
    rows = list(csv.DictReader((tmp_path / "curve.csv").open()))
    assert float(rows[0]["tuning_s"]) == 0.0 and int(rows[0]["trials"]) == 0 and int(rows[-1]["trials"]) == 6
    assert float(rows[0]["e2e_ms"]) == pytest.approx(float(rows[0]["default_e2e_ms"]))  # nothing tuned yet
    assert all(float(r["e2e_ms"]) > 0 for r in rows)
    assert (tmp_path / "tuning_curve.png").stat().st_size > 10_000

    from relay_tune.testing import zoo

    model = tmp_path / "tiny_resnet18.relay"
    zoo.write(zoo.resnet(18, image=32, width=8, num_classes=10), model)
    log = tmp_path / "logs" / "tiny_resnet18.gradient.jsonl"
    assert main(["fidelity", "--relay", str(model), "--log", str(log), "--top", "1", "--repeats", "1",
                 "--rounds", "1", "--profile-rounds", "1", "--number", "1", "--out", str(tmp_path)]) == 0
    assert "tasks within 15% of logged" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "fidelity_tiny_resnet18.csv").open()))
    tasks = [r for r in rows if not r["task"].startswith("[model]")]
    assert tasks and all(float(r["in_graph_us"]) > 0 for r in tasks)
    assert any(r["task"] == "[model] tuned / default" for r in rows)


@pytest.mark.slow
def test_distributed_with_one_worker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("initdb") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("PostgreSQL is not installed")
    out = tmp_path / "distributed.json"
    assert main(["distributed", "--workers", "1", "--per-worker", "3", "--trial-s", "0.01", "--space", "small",
                 "--search", "random", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["workers"] == 1 and row["recorded"] == 3 and row["duplicates"] == 0
    assert "| 1 | 3 (3) |" in capsys.readouterr().out


def test_recurrent_builds_and_times_a_small_lstm_stack(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["recurrent", "--layers", "2", "--hidden", "7", "--seq", "3", "--input", "5", "--batch", "2",
            "--rounds", "1", "--repeat", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 bidirectional LSTM layer(s), hidden 7, seq 3, batch 2: import" in out
    assert "relay-tune:" in out and "onnxruntime:" in out and "ratio relay-tune / onnxruntime" in out


def test_recurrent_int8_profiles_against_onnxruntime(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["recurrent", "--int8", "--profile", "--layers", "1", "--hidden", "7", "--seq", "3", "--input", "5",
            "--rounds", "1", "--repeat", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 bidirectional int8 LSTM layer(s), hidden 7" in out
    assert "lstm_sequence_int8" in out and "DynamicQuantizeLSTM" in out  # both engines' profiles
    assert "ratio relay-tune / onnxruntime" in out


def _documented_commands() -> list[list[str]]:
    """Every `python -m experiments ...` command in experiments/README.md and README.md, as argument lists."""
    import re
    import shlex

    commands = []
    for readme in (REPO / "experiments" / "README.md", REPO / "README.md"):
        text = readme.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
        inline = re.findall(r"`([^`]+)`", re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S))
        lines = [line for block in blocks for line in block.splitlines()] + [" ".join(s.split()) for s in inline]
        for line in lines:
            if "python -m experiments" in line:
                commands.append(shlex.split(line.split("python -m experiments", 1)[1]))
    return commands


def test_every_documented_command_parses() -> None:
    from experiments.__main__ import parser
    from relay_tune.testing.onnx_light import LIGHT
    from relay_tune.testing.onnx_zoo import RELATIVES, SMALL, ZOO

    commands = [argv for argv in _documented_commands() if argv and argv[0] != "SUBCOMMAND" and "--help" not in argv]
    assert len(commands) >= 15
    assert {argv[0] for argv in commands} >= set(SUBCOMMANDS)
    for argv in commands:
        args = parser().parse_args(argv)
        if argv[0] == "models":
            known = {*ZOO, *RELATIVES, *SMALL, "light", *(f"light_{name}" for name in LIGHT)}
            assert set(args.models.split(",")) <= known, argv


# ---------------------------------------------------------------------------------------------------------------
# trained: models from wheels (the test places a small model where the fetch would put it: no download)
# ---------------------------------------------------------------------------------------------------------------


def test_trained_lists_its_models(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.trained import MODELS

    assert main(["trained", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(m.name in listed and m.package in listed for m in MODELS)
    assert all("==" in m.package for m in MODELS), "every wheel is pinned to one version"


def test_trained_rejects_an_unknown_model() -> None:
    done = run_module("trained", "--models", "no_such_model")
    assert done.returncode == 2
    assert "unknown model(s) no_such_model" in done.stderr and "Traceback" not in done.stderr
    done = run_module("trained", "--models", "silero_vad", "--log", "/no/such/log.jsonl")
    assert done.returncode == 2 and "--log /no/such/log.jsonl: no such file" in done.stderr


def test_first_calls_rejects_bad_arguments(tmp_path: Path) -> None:
    done = run_module("first-calls", "--model", "no_such_model")
    assert done.returncode == 2
    assert "unknown model no_such_model" in done.stderr and "Traceback" not in done.stderr
    done = run_module("first-calls", "--model", "silero_vad")
    assert done.returncode == 2 and "float32 inputs only" in done.stderr
    done = run_module("first-calls", "--gaps", "1,x")
    assert done.returncode == 2 and "--gaps 1,x" in done.stderr
    done = run_module("first-calls", "--baseline-tree", str(tmp_path))
    assert done.returncode == 2 and "holds no relay_tune package" in done.stderr


def test_trained_compares_a_cached_model_with_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments import trained
    from relay_tune.testing.onnx_zoo import small_cnn

    model = trained.TrainedModel("small", "not-a-package==0", "pkg/small.onnx", {"input": (1, 3, 32, 32)}, "test")
    monkeypatch.setenv("RELAY_TUNE_MODEL_CACHE", str(tmp_path))
    path = tmp_path / "not-a-package-0" / "pkg" / "small.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(small_cnn().SerializeToString())
    assert trained.fetch(model) == path  # a cached model is not downloaded again
    log = tmp_path / "empty.jsonl"  # no records: the "tuned" build takes default schedules
    log.write_text("")
    row = trained.compare(model, threads=2, rounds=1, repeat=1, runtimes=("openmp", "native"), log=log)
    assert row["status"] == "ok" and row["rel_error"] <= row["tolerance"] == 1e-4
    assert row["ort_ms"] > 0 and row["relay_tune_ms"] > 0 and row["ratio"] > 0
    assert row["native_ms"] > 0 and row["openmp_ms"] > 0 and row["native_ratio"] > 0
    assert row["tuned_rel_error"] <= 1e-4 and row["tuned_ms"] > 0 and row["tuned_ratio"] > 0


def test_fresh_processes_times_a_saved_build_in_separate_processes(tmp_path: Path) -> None:
    import relay_tune
    from relay_tune.text import parse_module

    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 8, 9, 9), float32]) {
  nn.max_pool2d(%x, pool_size=[3, 3], padding=[1, 1, 1, 1])
}
""")
    relay_tune.build(mod, "llvm -num-cores=2", build_cache=False).save(tmp_path / "pool.rtmod")
    done = run_module("fresh-processes", "--model", str(tmp_path / "pool.rtmod"), "--processes", "1",
                      "--variants", "default,nogc", "--csv", str(tmp_path / "rows.csv"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("median of medians") == 2 and done.stdout.count("threads (CPU s @ last core)") == 4
    assert len((tmp_path / "rows.csv").read_text().splitlines()) == 3
    bad = run_module("fresh-processes", "--variants", "no_such_variant")
    assert bad.returncode == 2 and "no_such_variant" in bad.stderr


def test_trained_checks_and_times_openvino_beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openvino")
    from experiments import trained
    from relay_tune.testing.onnx_zoo import small_cnn

    model = trained.TrainedModel("small", "not-a-package==0", "pkg/small.onnx", {"input": (1, 3, 32, 32)}, "test")
    monkeypatch.setenv("RELAY_TUNE_MODEL_CACHE", str(tmp_path))
    path = tmp_path / "not-a-package-0" / "pkg" / "small.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(small_cnn().SerializeToString())
    row = trained.compare(model, threads=1, rounds=1, repeat=1, openvino=True)
    assert row["status"] == "ok" and "ov_status" not in row
    assert row["ov_rel_error"] <= 1e-4  # OpenVINO's outputs are checked against onnxruntime's like relay-tune's
    assert row["ov_ms"] > 0 and row["ov_ratio"] == pytest.approx(row["relay_tune_ms"] / row["ov_ms"], rel=0.05)


def test_trained_names_what_openvino_cannot_convert() -> None:
    from experiments.trained import _openvino_failure

    message = ("Exception from src/inference/src/cpp/core.cpp:84:\nCheck 'false' failed at x.cpp:151:\n"
               "Model wasn't fully converted.\nSummary:\n-- Conversion is failed for: Conv-15, ReduceMean-15\n")
    assert _openvino_failure(RuntimeError(message)) == "RuntimeError: Conversion is failed for: Conv-15, ReduceMean-15"
    assert _openvino_failure(ValueError("bad shape\nmore")) == "ValueError: bad shape"


def test_trained_integer_inputs_cover_their_range() -> None:
    from experiments import trained

    model = trained.TrainedModel("ints", "not-a-package==0", "m.onnx", {"bytes": (4, 2048)}, "test", (0, 256),
                                 dtype="int32")
    arrays = model.input_arrays(seed=3)
    assert arrays["bytes"].dtype == np.int32 and arrays["bytes"].shape == (4, 2048)
    assert arrays["bytes"].min() == 0 and arrays["bytes"].max() == 256  # both ends drawn (256: magika's padding)
    assert not np.array_equal(arrays["bytes"], model.input_arrays(seed=4)["bytes"])


def test_trained_quantization_step_is_one_8_bit_step_of_the_range() -> None:
    from experiments import trained

    assert trained.quantization_step(np.array([-1.0, 0.5, 4.1])) == pytest.approx(5.1 / 255 / 4.1)
    assert trained.quantization_step(np.zeros(3)) == 0.0


def test_trained_reports_what_stops_a_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from onnx import TensorProto, helper

    from experiments import trained

    node = helper.make_node("Unique", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = trained.TrainedModel("unique", "not-a-package==0", "pkg/unique.onnx", {"x": (4,)}, "test")
    monkeypatch.setenv("RELAY_TUNE_MODEL_CACHE", str(tmp_path))
    path = tmp_path / "not-a-package-0" / "pkg" / "unique.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(proto, path)
    row = trained.compare(model, threads=1, rounds=1, repeat=1)
    assert "Unique" in row["status"] and "rel_error" not in row
