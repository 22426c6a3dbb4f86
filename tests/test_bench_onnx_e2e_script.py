"""experiments/bench_onnx_e2e.py's timing: every engine and build is timed in a block of its own; relay-tune's
builds also alternate single inferences in one more block (each pair's order flipped) for the paired ratios tuned /
default; two builds running the same code are said to be the same build."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from tests.experiment_scripts import load_experiment

pytest.importorskip("onnx")
bench = load_experiment("bench_onnx_e2e")


def test_builds_run_in_blocks_of_their_own_and_alternate_for_the_paired_ratios() -> None:
    calls: list[str] = []

    def runner(label: str, warm: float, cold: float) -> Callable[[], None]:
        def run() -> None:  # slower right after another engine's run: its data left the caches
            time.sleep(warm if calls and calls[-1] == label else cold)
            calls.append(label)
        return run

    runners = {"onnxruntime": runner("onnxruntime", 0.001, 0.001), "default": runner("default", 0.002, 0.006),
               "tuned": runner("tuned", 0.004, 0.008)}
    builds = {"default": object(), "tuned": object()}
    args = argparse.Namespace(rounds=2, per_round=4, settle=0.0)
    samples, spins, pairs = bench.time_interleaved(runners, builds, args)
    assert {k: len(v) for k, v in samples.items()} == {"onnxruntime": 8, "default": 8, "tuned": 8}
    assert {k: len(v) for k, v in spins.items()} == {"onnxruntime": 2, "default": 4, "tuned": 4}
    first_round = calls[6:6 + 25]  # after the warm-up (2 runs each): an untimed run, then 4 timed, per block
    assert first_round[:15] == ["onnxruntime"] * 5 + ["default"] * 5 + ["tuned"] * 5
    assert first_round[15:] == ["default", "tuned",  # untimed, then pairs in flipped order
                                "default", "tuned", "tuned", "default", "default", "tuned", "tuned", "default"]
    # the medians come from each build's own block (warm), the pairs from alternating runs (both cold)
    assert sorted(samples["default"])[4] < 0.004 and sorted(samples["tuned"])[4] < 0.006
    assert len(pairs["tuned"]) == 8
    assert 1.15 < sorted(pairs["tuned"])[4] < 1.6  # 8 ms over 6 ms, pair by pair


def test_same_build_means_the_same_code() -> None:
    def build(code: bytes, tuned: bool) -> SimpleNamespace:
        task = SimpleNamespace(kernel="k0", tuned=tuned)
        return SimpleNamespace(object_code=[code], plan=SimpleNamespace(tasks=(task,)))

    assert bench.same_build(build(b"a", False), build(b"a", False))
    assert bench.same_build(build(b"b", False), build(b"a", False))  # every kernel kept its default schedule
    assert not bench.same_build(build(b"b", True), build(b"a", False))
    assert bench.same_build(build(b"a", True), build(b"a", False))  # a record that is the default config
