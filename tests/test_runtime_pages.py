"""Huge-page memory for streamed data: a model's constants lie in one 2 MiB-aligned block that asks for huge pages
(and get them where the kernel gives them), and so do the runner's copies of a task's weights."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import evaluate
from relay_tune.runtime import pages
from relay_tune.runtime.model import CompiledModel
from relay_tune.runtime.pages import (
    HUGE_PAGE_BYTES,
    huge_page_bytes_backing,
    huge_page_empty,
    huge_pages_enabled,
    numpy_small_pages,
    pack,
)
from relay_tune.text import parse_module
from relay_tune.tuning.runner import WeightCopies
from relay_tune.tuning.task import BuildArtifact, KernelArg, TensorSpec

THP = huge_pages_enabled()


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_huge_page_memory_is_aligned_writable_and_backed_by_huge_pages() -> None:
    block = huge_page_empty(3 * HUGE_PAGE_BYTES + 100)
    assert block.dtype == np.uint8 and block.nbytes == 3 * HUGE_PAGE_BYTES + 100
    assert _address(block) % HUGE_PAGE_BYTES == 0
    block[:] = 7  # first touch: where the kernel honours the request, these faults map huge pages
    assert int(block[-1]) == 7 and int(block[0]) == 7
    backing = huge_page_bytes_backing(_address(block), block.nbytes)
    if THP and backing is not None:
        assert backing >= HUGE_PAGE_BYTES, "transparent huge pages are on, yet the block got none"


def test_pack_lays_copies_one_after_another_in_one_block() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((5, 7)).astype("float32"), np.arange(3, dtype="int64"),
              np.zeros((0, 4), "float32"), np.array([True, False, True]), rng.standard_normal(1000)]
    packed = pack(arrays)
    assert len(packed) == len(arrays)
    for original, copy in zip(arrays, packed):
        assert copy.shape == original.shape and copy.dtype == original.dtype
        np.testing.assert_array_equal(copy, original)
        assert copy.flags.c_contiguous and copy.flags.writeable
    # one after another on cache lines: 140 bytes take 192, 24 take 64, the empty array one line of its own
    addresses = [_address(c) for c in packed if c.size]
    assert addresses[0] % HUGE_PAGE_BYTES == 0
    assert [a - addresses[0] for a in addresses] == [0, 192, 320, 384]
    arrays[0][0, 0] = 99.0  # copies, not views of the originals
    assert packed[0][0, 0] != 99.0
    assert pack([]) == []


DENSE = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 2048), float32], %w: Tensor[(1000, 2048), float32], %b: Tensor[(1000), float32]) {
  nn.bias_add(nn.dense(%x, %w), %b)
}
"""


@pytest.fixture(scope="module")
def classifier() -> tuple[CompiledModel, dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    params = {"w": (0.05 * rng.standard_normal((1000, 2048))).astype("float32"),
              "b": rng.standard_normal(1000).astype("float32")}
    return relay_tune.build(parse_module(DENSE), params=params), params


def test_a_models_constants_share_one_huge_page_block(classifier: tuple[CompiledModel, dict]) -> None:
    model, params = classifier
    constants = model._constants
    assert constants and sum(c.nbytes for c in constants) >= 1000 * 2048 * 4
    addresses = sorted(_address(c) for c in constants)
    assert addresses[0] % HUGE_PAGE_BYTES == 0
    total = sum(-(-c.nbytes // 64) * 64 for c in constants)
    assert addresses[-1] < addresses[0] + total  # one block, one constant after another
    slots = {int(model._executor.slots[i]) for i, s in enumerate(model.plan.storages) if s.kind == "constant"}
    assert slots == set(addresses)  # the kernels read the block, not the arrays the build handed over
    backing = huge_page_bytes_backing(addresses[0], total)
    if THP and backing is not None:
        assert backing >= total // 2, f"only {backing} of {total} constant bytes on huge pages"
    x = np.random.default_rng(3).standard_normal((1, 2048)).astype("float32")
    expected = np.asarray(evaluate(parse_module(DENSE), {"x": x, **params}))
    np.testing.assert_allclose(model.run(x), expected, rtol=1e-4, atol=1e-4)


def test_a_loaded_models_constants_are_on_huge_pages_too(classifier: tuple[CompiledModel, dict], tmp_path) -> None:
    model, _ = classifier
    loaded = relay_tune.runtime.load(model.save(tmp_path / "classifier.rtmod"))
    assert min(_address(c) for c in loaded._constants) % HUGE_PAGE_BYTES == 0
    x = np.random.default_rng(4).standard_normal((1, 2048)).astype("float32")
    np.testing.assert_array_equal(loaded.run(x), model.run(x))


def test_the_runners_weight_copies_start_on_a_huge_page() -> None:
    spec_x, spec_w, spec_y = TensorSpec((1, 256), "float32"), TensorSpec((64, 256), "float32"), \
        TensorSpec((1, 64), "float32")
    artifact = BuildArtifact(code=b"", code_format="elf-object", kernel_name="k", args=(
        KernelArg(spec_x, "input", 0), KernelArg(spec_w, "input", 1), KernelArg(spec_y, "output", 0)))
    buffers = [np.ones((1, 256), "float32"), np.arange(64 * 256, dtype="float32").reshape(64, 256),
               np.zeros((1, 64), "float32")]
    store = WeightCopies()  # owns the copies: the table's addresses are valid while it lives
    table = store.argument_table("t", artifact, buffers, [b.ctypes.data for b in buffers], {1}, {},
                                 cold_bytes=8 << 20)
    assert table is not None and len(table) == (8 << 20) // buffers[1].nbytes
    first = int(table[:, 1].min())
    assert first % HUGE_PAGE_BYTES == 0
    backing = huge_page_bytes_backing(first, 8 << 20)
    if THP and backing is not None:
        assert backing >= 4 << 20


def _numpy_asks_for_huge_pages() -> bool:
    switch = pages._numpy_switch
    assert switch is not None, "this numpy has no huge-page switch"
    setting = bool(switch(True))
    switch(setting)
    return setting


def test_numpy_small_pages_turns_numpys_huge_pages_off_and_restores_them_after_nesting_and_errors() -> None:
    before = _numpy_asks_for_huge_pages()
    with pytest.raises(RuntimeError), numpy_small_pages():
        assert not _numpy_asks_for_huge_pages()
        with numpy_small_pages():
            assert not _numpy_asks_for_huge_pages()
        assert not _numpy_asks_for_huge_pages()  # the outer block is still open
        raise RuntimeError("leaves the block")
    assert _numpy_asks_for_huge_pages() == before


def test_a_build_restores_numpys_setting(classifier: tuple[CompiledModel, dict]) -> None:
    _, params = classifier
    switch = pages._numpy_switch
    assert switch is not None
    before = _numpy_asks_for_huge_pages()
    for setting in (True, False):
        switch(setting)
        try:
            relay_tune.build(parse_module(DENSE), params=params, build_cache=False)
            assert _numpy_asks_for_huge_pages() == setting
        finally:
            switch(before)
