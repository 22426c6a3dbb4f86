"""experiments/bench_onnx_e2e.py's timing: relay-tune's builds alternate single inferences in one block (each
pair's order flipped), tuned / default is taken per adjacent pair, and two builds running the same code are said to
be the same build."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from experiment_scripts import load_experiment

pytest.importorskip("onnx")
bench = load_experiment("bench_onnx_e2e")


def test_builds_alternate_single_runs_and_pairs_are_ratios() -> None:
    calls: list[str] = []

    def runner(label: str, seconds: float) -> Callable[[], None]:
        def run() -> None:
            calls.append(label)
            time.sleep(seconds)
        return run

    runners = {"onnxruntime": runner("onnxruntime", 0.001), "default": runner("default", 0.002),
               "tuned": runner("tuned", 0.004)}
    builds = {"default": object(), "tuned": object()}
    args = argparse.Namespace(rounds=2, per_round=4, settle=0.0)
    samples, _spins, pairs = bench.time_interleaved(runners, builds, args)
    assert {k: len(v) for k, v in samples.items()} == {"onnxruntime": 8, "default": 8, "tuned": 8}
    ours = [c for c in calls[6:] if c != "onnxruntime"]  # after the warm-up: 2 runs each
    # per round: one untimed run of each build, then default, tuned | tuned, default | default, tuned | ...
    assert ours[:10] == ["default", "tuned", "default", "tuned", "tuned", "default", "default", "tuned", "tuned",
                         "default"]
    assert len(pairs["tuned"]) == 8
    assert 1.5 < sorted(pairs["tuned"])[4] < 2.6  # 4 ms over 2 ms, pair by pair


def test_same_build_means_the_same_code() -> None:
    def build(code: bytes, tuned: bool) -> SimpleNamespace:
        task = SimpleNamespace(kernel="k0", tuned=tuned)
        return SimpleNamespace(object_code=[code], plan=SimpleNamespace(tasks=(task,)))

    assert bench.same_build(build(b"a", False), build(b"a", False))
    assert bench.same_build(build(b"b", False), build(b"a", False))  # every kernel kept its default schedule
    assert not bench.same_build(build(b"b", True), build(b"a", False))
    assert bench.same_build(build(b"a", True), build(b"a", False))  # a record that is the default config
