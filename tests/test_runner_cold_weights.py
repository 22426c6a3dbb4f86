"""Cold weights: the runner times a kernel with its weights rotating through copies larger than the caches, as a
model reads them, and the copies are real (distinct buffers with the same values) while activations stay put. The
measurement worker keeps a task's copies across its configs (`WeightCopies`), one set per weight layout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import relay_tune
from relay_tune.errors import RelayTuneError
from relay_tune.text import parse_module
from relay_tune.tuning import LocalRunner
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.tuning.runner import MAX_WEIGHT_COPIES, WEIGHT_COPY_SETS, WeightCopies
from relay_tune.tuning.task import BuildArtifact, KernelArg, LayoutStep, TensorSpec, apply_layout
from relay_tune.tuning.tune_model import COLD_WEIGHTS_BYTES, COLD_WEIGHTS_ENV, cold_weights_bytes, default_runner

CONV = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 24, 13, 11), float32], %w: Tensor[(K, 24, 3, 3), float32], %b: Tensor[(K), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=K, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}
"""


def _conv_task(channels: int = 40, layout_planning: bool | None = False) -> object:
    """The conv2d+bias+relu task; NCHW by default on every host (layout planning would block 40 channels into
    NCHW8c on an 8-lane target, where the configs no longer pack the weight in layouts of their own)."""
    rng = np.random.default_rng(3)
    mod = relay_tune.bind_params(parse_module(CONV.replace("K", str(channels))), {
        "w": rng.uniform(-1, 1, (channels, 24, 3, 3)).astype("float32"),
        "b": rng.uniform(-1, 1, (channels,)).astype("float32"),
    })
    (task,) = [t for t in tasks_from_module(mod, "llvm", layout_planning=layout_planning) if "conv2d" in t.description]
    return task


def test_a_tasks_weight_inputs_are_its_model_constants() -> None:
    task = _conv_task()
    specs = task.input_specs()
    assert task.weight_inputs and all(len(specs[i].shape) in (1, 4) for i in task.weight_inputs)
    activation = [i for i, s in enumerate(specs) if s.shape == (1, 24, 13, 11)]
    assert activation and activation[0] not in task.weight_inputs


def test_argument_tables_copy_the_weights_and_keep_the_activations() -> None:
    spec_x, spec_w = TensorSpec((4, 8), "float32"), TensorSpec((16, 8), "float32")
    spec_y = TensorSpec((4, 16), "float32")
    artifact = BuildArtifact(code=b"", code_format="elf-object", kernel_name="k", args=(
        KernelArg(spec_x, "input", 0), KernelArg(spec_w, "input", 1), KernelArg(spec_y, "output", 0)))
    buffers = [np.arange(32, dtype="float32").reshape(4, 8), np.arange(128, dtype="float32").reshape(16, 8) + 0.5,
               np.zeros((4, 16), "float32")]
    pointers = [b.ctypes.data for b in buffers]
    store = WeightCopies()
    table = store.argument_table("t", artifact, buffers, pointers, {1}, {}, cold_bytes=512 * 8)
    assert table is not None and table.shape == (8, 3)  # 4 KiB of copies of a 512-byte weight
    assert len(set(table[:, 1].tolist())) == 8 and pointers[1] not in table[:, 1]  # every copy its own bytes
    assert set(table[:, 0].tolist()) == {pointers[0]} and set(table[:, 2].tolist()) == {pointers[2]}
    (held,) = store._sets.values()
    for address in table[:, 1].tolist():  # each copy holds the weight's values, on a cache line
        offset = address - held.block.__array_interface__["data"][0]
        assert address % 64 == 0
        assert np.array_equal(held.block[offset:offset + buffers[1].nbytes].view("float32").reshape(16, 8),
                              buffers[1])
    # Nothing to rotate: rotation off, no weight among the arguments, or an empty weight.
    assert store.argument_table("t", artifact, buffers, pointers, {1}, {}, cold_bytes=0) is None
    assert store.argument_table("t", artifact, buffers, pointers, set(), {}, cold_bytes=1 << 20) is None
    # Tiny weights: the number of copies is bounded, not their bytes.
    many = WeightCopies().argument_table("t", artifact, buffers, pointers, {1}, {}, cold_bytes=1 << 30)
    assert many is not None and len(many) == MAX_WEIGHT_COPIES


def _weight_args(task: object, artifact: BuildArtifact) -> tuple[KernelArg, ...]:
    return tuple(a for a in artifact.args if a.role == "input" and a.index in task.weight_inputs)


def _artifacts_by_weight_layout(task: object, want: int) -> list[list[BuildArtifact]]:
    """Built configs of `task` grouped by their weight arguments (shape, dtype, layout): sampled until one group
    has `want` configs and there are two groups (an unpacked and a packed weight, or two packings)."""
    rng = np.random.default_rng(7)
    groups: dict[tuple[KernelArg, ...], list[BuildArtifact]] = {}
    seen: set[str] = set()
    for _ in range(40):
        config = task.space.sample(rng)
        if config.key in seen:
            continue
        seen.add(config.key)
        artifact = task.build(config)
        groups.setdefault(_weight_args(task, artifact), []).append(artifact)
        if len(groups) >= 2 and max(len(g) for g in groups.values()) >= want:
            return sorted(groups.values(), key=len, reverse=True)
    raise AssertionError(f"no two weight layouts with {want} configs among 40 samples")


def _stats(runner: LocalRunner) -> tuple[int, int]:
    stats = runner.worker_stats()
    return stats["copy_sets_built"], stats["copy_sets_reused"]


def test_the_worker_builds_a_tasks_weight_copies_once_per_layout() -> None:
    task, other = _conv_task(), _conv_task(channels=16)
    same, packed = _artifacts_by_weight_layout(task, want=3)[:2]
    assert all(_weight_args(task, a) != _weight_args(task, same[0]) for a in packed)
    with LocalRunner(timeout=30.0, number=1, repeat=2, min_repeat_ms=1, cold_weights_bytes=1 << 20) as runner:
        def measure(which: object, artifact: BuildArtifact) -> None:
            result = runner.run(which, artifact)
            assert result.error_kind is None, result.error_msg  # every config's outputs were checked

        for artifact in same[:3]:
            measure(task, artifact)
        assert _stats(runner) == (1, 2)  # three configs of one layout: built once, not per config
        measure(task, packed[0])
        assert _stats(runner) == (2, 2)  # another weight layout: copies of its own
        measure(task, same[0])
        measure(task, packed[0])
        assert _stats(runner) == (2, 4)  # both layouts kept while the task lasts
        measure(other, other.build(other.default_config()))
        measure(task, same[0])
        assert _stats(runner)[0] == 4  # a new task frees the last one's copies
    with LocalRunner(timeout=30.0, number=1, repeat=2, min_repeat_ms=1, cold_weights_bytes=1 << 20,
                     reuse_weight_copies=False) as fresh:
        assert fresh.run(task, same[0]).error_kind is None and _stats(fresh) == (0, 0)  # built per run instead


def _artifact(weight: KernelArg) -> BuildArtifact:
    spec_x, spec_y = TensorSpec((4, 8), "float32"), TensorSpec((4, 16), "float32")
    return BuildArtifact(code=b"", code_format="elf-object", kernel_name="k", args=(
        KernelArg(spec_x, "input", 0), weight, KernelArg(spec_y, "output", 0)))


def _buffers(weight: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    buffers = [np.arange(32, dtype="float32").reshape(4, 8), weight, np.zeros((4, 16), "float32")]
    return buffers, [b.ctypes.data for b in buffers]


def _rows(copies: WeightCopies, *args: object, **kwargs: object) -> list[list[int]] | None:
    """`WeightCopies.argument_table` as lists of pointers (None: no rotation)."""
    table = copies.argument_table(*args, **kwargs)
    return None if table is None else table.tolist()


def _check_sets(sets: Sequence[Sequence[int]], buffers: list[np.ndarray], pointers: list[int], count: int) -> None:
    assert len(sets) == count and len({s[1] for s in sets}) == count  # every copy is its own buffer...
    assert pointers[1] not in {s[1] for s in sets}
    assert {s[0] for s in sets} == {pointers[0]} and {s[2] for s in sets} == {pointers[2]}  # activations stay
    weight = buffers[1]
    for s in sets:  # ... holding the weight in the kernel's layout
        copy = np.ctypeslib.as_array((ctypes_float * weight.size).from_address(s[1])).reshape(weight.shape)
        assert np.array_equal(copy, weight)


ctypes_float = np.ctypeslib.as_ctypes_type(np.float32)


def test_weight_copies_are_kept_per_layout_and_checked_against_the_weights() -> None:
    logical = np.arange(128, dtype="float32").reshape(16, 8) + 0.5
    plain = KernelArg(TensorSpec((16, 8), "float32"), "input", 1)
    packed_layout = (LayoutStep("reshape", (2, 8, 8)), LayoutStep("transpose", (0, 2, 1)))
    packed = KernelArg(TensorSpec((2, 8, 8), "float32"), "input", 1, packed_layout)
    copies = WeightCopies()
    sets_by_layout = {}
    for arg, weight in ((plain, logical), (packed, apply_layout(logical, packed_layout))):
        buffers, pointers = _buffers(weight.copy())
        sets = _rows(copies, "task", _artifact(arg), buffers, pointers, {1}, {}, cold_bytes=512 * 8)
        _check_sets(sets, buffers, pointers, 8)  # 4 KiB of copies of a 512-byte weight
        sets_by_layout[arg] = [s[1] for s in sets]
    assert copies.built == 2 and copies.reused == 0
    # Another config with the unpacked weight: the same copies, though its own buffers are new.
    buffers, pointers = _buffers(logical.copy())
    again = _rows(copies, "task", _artifact(plain), buffers, pointers, {1}, {}, cold_bytes=512 * 8)
    assert [s[1] for s in again] == sets_by_layout[plain] and (copies.built, copies.reused) == (2, 1)
    _check_sets(again, buffers, pointers, 8)
    # Weights with other values under the same key are never timed on stale copies.
    buffers, pointers = _buffers(logical + 1.0)
    changed = _rows(copies, "task", _artifact(plain), buffers, pointers, {1}, {}, cold_bytes=512 * 8)
    _check_sets(changed, buffers, pointers, 8)
    assert copies.built == 3
    # A new task frees the last one's copies; the count of layouts kept is bounded.
    for i in range(WEIGHT_COPY_SETS + 2):
        layout = (LayoutStep("reshape", (16, 8)),) * (i + 1)
        buffers, pointers = _buffers(logical.copy())
        _rows(copies, "other", _artifact(KernelArg(plain.spec, "input", 1, layout)), buffers, pointers, {1},
                            {}, cold_bytes=512 * 8)
    assert copies.held_bytes == WEIGHT_COPY_SETS * (8 * logical.nbytes + 64)  # one aligned block per layout
    # The three blocks of the first task's sets and the two sets pushed out were copied into, not allocated again.
    assert copies.built == 3 + WEIGHT_COPY_SETS + 2 and copies.refilled == 5
    _check_sets(_rows(copies, "other", _artifact(plain), buffers, pointers, {1}, {}, cold_bytes=512 * 8),
                buffers, pointers, 8)
    # Nothing to rotate: rotation off, or no weight among the arguments.
    assert _rows(copies, "other", _artifact(plain), buffers, pointers, {1}, {}, cold_bytes=0) is None
    assert _rows(copies, "other", _artifact(plain), buffers, pointers, set(), {}, cold_bytes=1 << 20) is None


def test_the_cold_weight_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COLD_WEIGHTS_ENV, "4096")
    assert cold_weights_bytes() == 4096 and default_runner().timing.cold_weights_bytes == 4096
    monkeypatch.setenv(COLD_WEIGHTS_ENV, "64MiB")
    with pytest.raises(RelayTuneError, match="RELAY_TUNE_COLD_WEIGHTS_BYTES='64MiB' is not a number of bytes"):
        cold_weights_bytes()
    monkeypatch.delenv(COLD_WEIGHTS_ENV)
    assert cold_weights_bytes() == COLD_WEIGHTS_BYTES


def test_the_tuners_runner_measures_with_cold_weights_and_checks_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real size (the rest of the suite rotates 1 MiB, `conftest.py`): the copies hold more than the caches."""
    monkeypatch.delenv(COLD_WEIGHTS_ENV)
    task = _conv_task(layout_planning=None)  # as the tuner gets it on this host
    with default_runner() as cold:
        assert cold.timing.cold_weights_bytes == COLD_WEIGHTS_BYTES > 32 << 20
        for config in (task.default_config(), task.space.sample(np.random.default_rng(1))):
            artifact = task.build(config)
            result = cold.run(task, artifact)
            assert result.error_kind is None, result.error_msg
            assert result.costs is not None and len(result.costs) == 3 and min(result.costs) > 0
        stats = cold.worker_stats()
    assert COLD_WEIGHTS_BYTES <= stats["copy_bytes"] <= 2 * (COLD_WEIGHTS_BYTES + 40 * 24 * 9 * 4 + 40 * 4)
