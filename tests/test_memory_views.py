"""Fused groups that leave every element where it is in memory become aliases of their input (no kernel): pure
reshapes, and layout transforms / transposes whose element permutation is the identity (NCHW16c -> NCHW on a 1x1
map after global pooling). Such groups are no tuning tasks; every other transform stays a kernel. Models are
checked against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.compile.tasks import is_memory_view
from relay_tune.interpreter import Interpreter
from relay_tune.ir import IRModule
from relay_tune.passes import extract_tasks, optimize
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.type_infer import infer_types


def _single_group(shape: tuple[int, ...], body: str) -> object:
    """The one fused function of `@main(%x) { body }` (no layout planning)."""
    dims = ", ".join(str(d) for d in shape)
    text = f'#[version = "0.0.5"]\ndef @main(%x: Tensor[({dims}), float32]) {{\n  {body}\n}}'
    fused = optimize(infer_types(parse_module(text)), layout_block=0)
    (spec,) = extract_tasks(IRModule({"main": fused["main"]}))
    return spec.func


@pytest.mark.parametrize(("shape", "body", "view"), [
    ((1, 4, 1, 1, 16), 'layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW")', True),
    ((1, 64, 1, 1), 'layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c")', True),
    ((1, 4, 1, 1, 16), 'reshape(layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW"), newshape=[1, 64])',
     True),
    ((1, 1, 7, 7, 16), 'layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW")', False),  # channels move
    ((1, 4, 2, 1, 16), 'layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW")', False),  # two rows
    ((1, 2, 1, 1, 16), 'layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW8c")', True),  # 1x1 map
    ((1, 2, 2, 1, 16), 'layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW8c")', False),  # reblocked
    ((1, 8, 1), "transpose(%x, axes=[0, 2, 1])", True),  # unit axes only
    ((2, 3), "transpose(%x, axes=[1, 0])", False),
])
def test_memory_identity_is_decided_exactly(shape: tuple[int, ...], body: str, view: bool) -> None:
    assert is_memory_view(_single_group(shape, body)) is view


TAIL = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 16, 7, 7), float32], %w: Tensor[(64, 16, 3, 3), float32], %d: Tensor[(10, 64), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=64, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  %2 = nn.global_avg_pool2d(%1);
  %3 = reshape(%2, newshape=[1, 64]);
  nn.dense(%3, %d, units=10)
}"""


def test_blocked_pooled_tail_is_an_alias_not_a_kernel_or_task() -> None:
    rng = np.random.default_rng(0)
    mod = relay_tune.bind_params(parse_module(TAIL), {
        "w": rng.uniform(-0.5, 0.5, (64, 16, 3, 3)).astype("float32"),
        "d": rng.uniform(-0.5, 0.5, (10, 64)).astype("float32")})
    # Planned for AVX-512 (NCHW16c) and for the host (NCHW16c or NCHW8c); only the host's code runs here.
    for target in ("llvm -mcpu=skylake-avx512", "llvm"):
        model = relay_tune.build(mod, target=target, layout_planning=True)
        tail = [t for t in model.plan.tasks if t.description.startswith("layout_transform+reshape")]
        assert len(tail) == 1 and tail[0].kernel == "", target  # NCHW{b}c -> NCHW on the 1x1 map: an alias
        assert all(c.kernel for c in model.plan.calls)
        assert len(model.plan.calls) == 4  # the image's transform, the convolution, the pooling, the dense
    x = rng.uniform(-1, 1, (1, 16, 7, 7)).astype("float32")
    np.testing.assert_allclose(model.run(x=x), Interpreter(mod).run({"x": x}), rtol=1e-4, atol=1e-4)
    described = [t.description for t in tasks_from_module(mod, "llvm -mcpu=skylake-avx512", layout_planning=True)]
    assert not any(d.startswith("layout_transform+reshape") for d in described)
    assert any(d.startswith("layout_transform ") for d in described)  # the image's transform is a real kernel


def test_a_transform_that_moves_elements_stays_a_kernel() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 2, 3, 1, 16), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW16c", dst_layout="NCHW");
  %1 = nn.relu(%0);
  %2 = layout_transform(%1, src_layout="NCHW", dst_layout="NCHW16c");
  reshape(%2, newshape=[1, 96])
}"""
    mod = infer_types(parse_module(text))
    model = relay_tune.build(mod, target="llvm", layout_planning=False)
    assert all(c.kernel for c in model.plan.calls) and model.plan.calls
    x = np.random.default_rng(1).uniform(-1, 1, (1, 2, 3, 1, 16)).astype("float32")
    np.testing.assert_allclose(model.run(x=x), Interpreter(mod).run({"x": x}), rtol=1e-6)
