"""Cold weights: the runner times a kernel with its weights rotating through copies larger than the caches, as a
model reads them, and the copies are real (distinct buffers with the same values) while activations stay put."""

from __future__ import annotations

import numpy as np

import relay_tune
from relay_tune.text import parse_module
from relay_tune.tuning import LocalRunner
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.tuning.runner import MAX_WEIGHT_COPIES, _cold_weight_pointer_sets
from relay_tune.tuning.task import BuildArtifact, KernelArg, TensorSpec
from relay_tune.tuning.tune_model import COLD_WEIGHTS_BYTES, default_runner

CONV = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 24, 13, 11), float32], %w: Tensor[(40, 24, 3, 3), float32], %b: Tensor[(40), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=40, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}
"""


def _conv_task() -> object:
    rng = np.random.default_rng(3)
    mod = relay_tune.bind_params(parse_module(CONV), {
        "w": rng.uniform(-1, 1, (40, 24, 3, 3)).astype("float32"),
        "b": rng.uniform(-1, 1, (40,)).astype("float32"),
    })
    (task,) = [t for t in tasks_from_module(mod, "llvm") if "conv2d" in t.description]
    return task


def test_a_tasks_weight_inputs_are_its_model_constants() -> None:
    task = _conv_task()
    specs = task.input_specs()
    assert task.weight_inputs and all(len(specs[i].shape) in (1, 4) for i in task.weight_inputs)
    activation = [i for i, s in enumerate(specs) if s.shape == (1, 24, 13, 11)]
    assert activation and activation[0] not in task.weight_inputs


def test_pointer_sets_copy_the_weights_and_keep_the_activations() -> None:
    spec_x, spec_w = TensorSpec((4, 8), "float32"), TensorSpec((16, 8), "float32")
    spec_y = TensorSpec((4, 16), "float32")
    artifact = BuildArtifact(code=b"", code_format="elf-object", kernel_name="k", args=(
        KernelArg(spec_x, "input", 0), KernelArg(spec_w, "input", 1), KernelArg(spec_y, "output", 0)))
    buffers = [np.arange(32, dtype="float32").reshape(4, 8), np.arange(128, dtype="float32").reshape(16, 8) + 0.5,
               np.zeros((4, 16), "float32")]
    pointers = [b.ctypes.data for b in buffers]
    sets = _cold_weight_pointer_sets(artifact, buffers, pointers, {1}, {}, cold_bytes=512 * 8)
    assert len(sets) == 8  # 4 KiB of copies of a 512-byte weight
    assert sets[0] == pointers
    assert len({s[1] for s in sets}) == 8  # every copy is its own buffer
    assert {s[0] for s in sets} == {pointers[0]} and {s[2] for s in sets} == {pointers[2]}
    copies = [b for b in buffers[3:]]
    assert len(copies) == 7 and all(np.array_equal(c, buffers[1]) for c in copies)
    # Nothing to rotate: rotation off, no weight among the arguments, or an empty weight.
    assert _cold_weight_pointer_sets(artifact, buffers, pointers, {1}, {}, cold_bytes=0) == []
    assert _cold_weight_pointer_sets(artifact, buffers, pointers, set(), {}, cold_bytes=1 << 20) == []
    # Tiny weights: the number of copies is bounded, not their bytes.
    many = _cold_weight_pointer_sets(artifact, list(buffers[:3]), pointers, {1}, {}, cold_bytes=1 << 30)
    assert len(many) == MAX_WEIGHT_COPIES


def test_the_tuners_runner_measures_with_cold_weights_and_checks_results() -> None:
    runner = default_runner()
    assert runner.timing.cold_weights_bytes == COLD_WEIGHTS_BYTES > 32 << 20
    runner.close()
    task = _conv_task()
    with LocalRunner(timeout=30.0, number=1, repeat=2, min_repeat_ms=2, cold_weights_bytes=4 << 20) as cold:
        for config in (task.default_config(), task.space.sample(np.random.default_rng(1))):
            artifact = task.build(config)
            result = cold.run(task, artifact)
            assert result.error_kind is None, result.error_msg
            assert result.costs is not None and len(result.costs) == 2 and min(result.costs) > 0
