"""experiments/pool_in_graph.py: the parallel split it reports for a pooling kernel follows the `parallel` knob
(serial, or the outer loop's extent and where the second core's share starts)."""

from __future__ import annotations

from relay_tune.compile import resolve_target
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import config_to_steps, tasks_from_module
from tests.experiment_scripts import load_experiment

POOL = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 8, 20, 20), float32]) {
  nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
}"""


def test_the_reported_split_follows_the_parallel_knob() -> None:
    script = load_experiment("pool_in_graph")
    target = resolve_target("llvm -num-cores=2")
    (task,) = tasks_from_module(parse_module(POOL), target, layout_planning=False)
    config = dict(task.default_config())
    assert "parallel" in config
    serial = script.describe_split(task, config_to_steps(task.func, {**config, "parallel": 0}, target), target, 2)
    split = script.describe_split(task, config_to_steps(task.func, {**config, "parallel": 1}, target), target, 2)
    assert "serial" in serial and "parallel" not in serial
    # 8 channels x 10 x 10 outputs in one fused loop (or its outer part): the second core starts half way
    extent = int(split.split(" in ")[1].split()[0])
    assert extent >= 8 and f"second core from {-(-extent // 2)}" in split
