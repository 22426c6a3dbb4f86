"""Which NCHW convolutions keep their sums channel-innermost (`conv2d_nchw_cl`), and builds from logs written
before that rule changed.

Rows narrower than `relay_tune.op.nn.NARROW_MAP` columns (56, 28, 14, 7...) accumulate with a vector across output
channels; wide rows, pointwise stride-1 convolutions and convolutions with fewer output channels than a vector keep
the vector along the row. Every kernel is compiled and compared with the reference interpreter. A log whose records
for a task were measured under the other rule holds configs of another schedule space: the build passes them over
(the next valid record, or the default schedule), it does not fail. These are the rules of unplanned NCHW graphs:
layout planning (on by default, `tests/test_plan_layouts.py`) is off here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import BuildWarning, bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import evaluate
from relay_tune.op import nn
from relay_tune.records.log_format import TuningRecord, host_cpu_name
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types

HOST = resolve_target("llvm -num-cores=2")
RNG = np.random.default_rng(5)


def conv_module(cin: int, size: int, cout: int, kernel: int = 3, stride: int = 1) -> relay_tune.ir.IRModule:
    pad = kernel // 2
    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {size}, {size}), float32], %w: Tensor[({cout}, {cin}, {kernel}, {kernel}), float32],
          %b: Tensor[({cout}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}],
                                channels={cout}, kernel_size=[{kernel}, {kernel}]), %b))
}}"""
    weights = {"w": (RNG.standard_normal((cout, cin, kernel, kernel)) / np.sqrt(kernel * kernel * cin))
               .astype("float32"), "b": RNG.standard_normal(cout).astype("float32")}
    return infer_types(bind_params(infer_types(parse_module(source)), weights))


def anchor_task(mod: relay_tune.ir.IRModule) -> RelayTuneTask:
    return next(t for t in tasks_from_module(mod, HOST, layout_planning=False) if t.family != "injective")


@pytest.mark.parametrize(("cin", "size", "cout", "kernel", "stride", "family"), [
    (9, 28, 32, 3, 1, "conv2d_nchw_cl"),   # ResNet-50's 28-column 3x3 convolutions
    (7, 56, 20, 3, 1, "conv2d_nchw_cl"),   # 56 columns: 3.5 vectors per row
    (12, 30, 17, 1, 2, "conv2d_nchw_cl"),  # a stride-2 1x1 convolution onto 15 columns
    (5, 28, 12, 3, 1, "conv2d_nchw"),      # fewer output channels than a vector
    (6, 70, 16, 3, 1, "conv2d_nchw"),      # wide rows
    (24, 28, 32, 1, 1, "conv2d_nchw"),     # pointwise stride 1: a matrix product over the positions
])
def test_family_by_map_width_and_channels(cin: int, size: int, cout: int, kernel: int, stride: int,
                                          family: str) -> None:
    task = anchor_task(conv_module(cin, size, cout, kernel, stride))
    assert task.family == family
    inputs = [RNG.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None
    rng = np.random.default_rng(0)
    configs = [task.default_config()] + [task.space.sample(rng) for _ in range(2)]
    for config in configs:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
        np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4, err_msg=f"{task.description} {config}")


def _record(task: RelayTuneTask, config: object, seconds: float) -> str:
    return TuningRecord(task.key, task.target, config, (seconds,), host_cpu=host_cpu_name()).to_json()


def test_build_passes_over_records_of_the_previous_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = conv_module(9, 28, 32)
    task = anchor_task(mod)
    assert task.family == "conv2d_nchw_cl"
    with monkeypatch.context() as patch:  # the task as the rule before saw it: sums along the row
        patch.setattr(nn, "NARROW_MAP", 16)
        old = anchor_task(mod)
    assert old.key == task.key and old.family == "conv2d_nchw"
    old_config = old.default_config()
    assert not task.space.is_valid(old_config)
    rng = np.random.default_rng(1)
    valid = next(c for c in (task.space.sample(rng) for _ in range(50)) if c != task.default_config())
    x = RNG.standard_normal((1, 9, 28, 28)).astype("float32")
    expected = np.asarray(evaluate(mod, {"x": x}))

    log = tmp_path / "mixed.jsonl"
    log.write_text(_record(task, old_config, 1e-6) + "\n" + _record(task, valid, 1e-3) + "\n")
    # the faster old record is passed over, not fatal
    model = relay_tune.build(mod, target=HOST, logs=log, layout_planning=False)
    assert model.build_info["tuned_tasks"] == 1
    np.testing.assert_allclose(model.run(x=x), expected, rtol=1e-4, atol=1e-4)
    # the profile beside the log shows the record the build used, given the tasks to tell the spaces apart
    from relay_tune.runtime.profile import compare_with_logs

    logged = {r.profile.key: r.logged for r in compare_with_logs(model, [log], repeat=1, tasks=[task])}
    assert logged[task.key] == pytest.approx(1e-3)
    assert {r.profile.key: r.logged for r in compare_with_logs(model, [log], repeat=1)}[task.key] == \
        pytest.approx(1e-6)

    log.write_text(_record(task, old_config, 1e-6) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BuildWarning)
        model = relay_tune.build(mod, target=HOST, logs=log, layout_planning=False)
    assert model.build_info["tuned_tasks"] == 0
    assert any("default schedule" in str(w.message) for w in caught)
    np.testing.assert_allclose(model.run(x=x), expected, rtol=1e-4, atol=1e-4)
