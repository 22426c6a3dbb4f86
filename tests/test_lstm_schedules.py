"""The `lstm` family (`search_space.families.lstm`): every point of the LSTM kernels' schedule space (block widths
narrower and wider than a panel, reduction unrolls with and without a remainder, directions in parallel, in turn
and interleaved) computes the same result as the reference interpreter, for `nn.lstm_sequence` and its int8 twin
on odd sizes (hidden not a multiple of the vector width, batch > 1, forward, reverse and bidirectional); configs
serialise one to one; a tuning log's LSTM record reaches the build; the space follows the target's vector width."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.recurrent import lstm_stack, quantized
from relay_tune import build
from relay_tune.compile import resolve_target
from relay_tune.errors import CompileError
from relay_tune.frontend import from_onnx
from relay_tune.kernel.recurrent import LstmSchedule, fixed_kernel_call
from relay_tune.records.log_format import TuningRecord, append_lines, host_cpu_name
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.tuning.runner import LocalRunner
from search_space.config import Config, InvalidConfigError
from search_space.decode import ConfigNotInSpace, config_to_steps
from search_space.families.lstm import LSTM_FAMILY

HOST = resolve_target("llvm -num-cores=2")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")  # loop nests lowered, never run


def _model(hidden: int, seq: int, batch: int, int8: bool, layers: int = 1) -> object:
    """A bidirectional ONNX LSTM stack (`experiments.recurrent.lstm_stack`, input size 7), int8 if asked."""
    model = lstm_stack(layers, hidden, seq, batch, 7)
    return quantized(model) if int8 else model


def _lstm_task(hidden: int, seq: int, batch: int, int8: bool, target: object = HOST) -> RelayTuneTask:
    mod, _ = from_onnx(_model(hidden, seq, batch, int8))
    (task,) = [t for t in tasks_from_module(mod, target) if t.family == LSTM_FAMILY]
    return task


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize(("hidden", "seq", "batch"), [(17, 5, 3), (13, 4, 1)])
def test_every_schedule_matches_the_reference(hidden: int, seq: int, batch: int, int8: bool) -> None:
    """Each config of the space, built as the tuner builds it, checked by the runner against the interpreter on
    random non-zero inputs (the check a wrong kernel fails with WRONG_RESULT)."""
    task = _lstm_task(hidden, seq, batch, int8)
    configs = list(task.space.enumerate())
    widths = {c["width"] for c in configs}
    if hidden == 17:  # 68 gate columns in two panels of 64: quarter, half and whole panels at 8 or 16 lanes
        assert {16, 32, 64} <= widths, widths
    depth = task.workload.dims["depth"]  # hidden, or its pairs for int8 weights: unrolls with a remainder loop
    assert {c["k_unroll"] for c in configs} == {u for u in (1, 2, 4, 8) if u <= depth}
    assert {(c["parallel"], c["interleave"]) for c in configs} == {(False, False), (False, True), (True, False)}
    assert task.default_config() in configs
    with LocalRunner(number=1, repeat=1, min_repeat_ms=0.5) as runner:
        results = runner.run_batch(task, [task.build(c) for c in configs])
    bad = [(dict(c), r.error_kind, r.error_msg[:160]) for c, r in zip(configs, results) if r.error_kind is not None]
    assert not bad, bad


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_a_logged_lstm_config_reaches_the_build(int8: bool, tmp_path: Path) -> None:
    """A non-default config written to a tuning log: the build takes it (the task counts as tuned), the output
    matches the default build's, and the record's config reads back equal."""
    model = _model(17, 6, 2, int8, layers=2)
    mod, _ = from_onnx(model)
    tasks = [t for t in tasks_from_module(mod, HOST) if t.family == LSTM_FAMILY]
    assert len(tasks) == 1 and tasks[0].weight == 2  # both layers' recurrent kernels are one workload
    log = tmp_path / "lstm.jsonl"
    chosen = []
    for task in tasks:
        config = next(c for c in task.space.enumerate() if c != task.default_config() and c["width"] == 16
                      and c["interleave"])
        chosen.append(config)
        append_lines(log, [TuningRecord(task.key, task.target, config, (1e-6,), host_cpu=host_cpu_name()).to_json()])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    for record, config in zip(records, chosen):
        assert Config(record["config"]) == config  # one to one through JSON
    x = np.random.default_rng(3).uniform(-1, 1, (6, 2, 7)).astype(np.float32)
    default = build(mod, target=HOST)
    tuned = build(mod, target=HOST, logs=log)
    assert sum(1 for t in tuned.plan.tasks if t.tuned and "lstm_sequence" in t.description) == 1
    np.testing.assert_allclose(np.asarray(tuned.run(X=x)), np.asarray(default.run(X=x)), rtol=1e-5, atol=1e-6)


def test_configs_outside_the_space_are_rejected() -> None:
    task = _lstm_task(17, 3, 1, False)
    default = task.default_config()
    with pytest.raises(InvalidConfigError):
        task.build(Config({**default, "width": 24}))  # neither divides the panel nor is whole panels
    with pytest.raises(InvalidConfigError):
        task.build(Config({**default, "parallel": True, "interleave": True}))
    with pytest.raises(ConfigNotInSpace):
        config_to_steps(task.func, {**default, "width": 24}, HOST)
    call = fixed_kernel_call(task.func)
    assert call is not None
    with pytest.raises(CompileError, match="neither divides"):
        LstmSchedule(24, 4, False).check(call)


def test_the_space_follows_the_vector_width() -> None:
    """Widths are whole vectors of the target, within its accumulator registers: at 16 lanes (AVX-512, 28
    accumulator registers) two panels of 64 (8 registers) are a point, at 8 lanes (AVX2, 12) they (16) are not."""
    for target in (AVX512, resolve_target("llvm -mcpu=znver3 -num-cores=2")):
        task = _lstm_task(32, 3, 1, False, target)  # 128 gate columns: two panels of 64
        lanes = target.vector_lanes("float32")
        widths = {c["width"] for c in task.space.enumerate()}
        assert all(w % lanes == 0 for w in widths), widths
        assert (128 in widths) == (lanes == 16), (lanes, widths)
        for config in task.space.enumerate():
            task.lower(config)  # every point lowers on the target, run or not


@pytest.mark.parametrize("case_id", ["h17_reverse_initial", "h33_bidirectional_batch3", "h9_full_lens"])
def test_tuned_models_match_onnxruntime(case_id: str, tmp_path: Path) -> None:
    """Whole one-node ONNX LSTMs (a reverse direction with initial states, a bidirectional layer at batch 3, full
    `sequence_lens`) built from a log holding one non-default config per block width (the reduction unroll and the
    direction order varied along), against onnxruntime."""
    from test_lstm_sequence import CASES, check, make_model, onnxruntime_outputs

    case = next(c for c in CASES if c.id == case_id)
    model, feeds = make_model(case)
    want = onnxruntime_outputs(case)
    mod, _ = from_onnx(model)
    (task,) = [t for t in tasks_from_module(mod, HOST) if t.family == LSTM_FAMILY]
    configs = [c for c in task.space.enumerate() if c != task.default_config()]
    picked = {}
    for index, config in enumerate(configs):  # one per width, cycling through the other knobs
        if config["width"] not in picked and (index % 3 == len(picked) % 3 or index == len(configs) - 1):
            picked[config["width"]] = config
    assert picked
    for width, config in picked.items():
        log = tmp_path / f"w{width}.jsonl"
        append_lines(log, [TuningRecord(task.key, task.target, config, (1e-6,), host_cpu=host_cpu_name()).to_json()])
        tuned = build(mod, target=HOST, logs=log)
        assert any(t.tuned for t in tuned.plan.tasks if "lstm_sequence" in t.description)
        check([np.asarray(v) for v in tuned.run(**feeds)], want, f"{dict(config)}")
