"""Compiling a model's kernels in worker processes (`relay_tune.compile.parallel`): how kernels are split into
modules, and that every module's kernels load and compute what they should."""

from __future__ import annotations

import numpy as np

from relay_tune.codegen.jit import KernelSignature, load_object
from relay_tune.compile import parallel
from relay_tune.kernel import tir
from relay_tune.target import Target

HOST = Target.host().with_cores(1)


def _scale(name: str, extent: int, factor: float, unroll: int = 1) -> tir.PrimFunc:
    """out[i, u] = a[i] * factor * (u + 1), the u loop UNROLLED when `unroll` > 1."""
    a, out = tir.Buffer("a", (extent,), "float32"), tir.Buffer("out", (extent, unroll), "float32")
    i, u = tir.LoopVar("i"), tir.LoopVar("u")
    value = tir.Load(a, (i,)) * tir.FloatImm(factor) * tir.Cast("float32", u + tir.IntImm(1, "int64"))
    body = tir.For(i, extent, tir.For(u, unroll, tir.Store(out, (i, u), value),
                                      tir.ForKind.UNROLLED if unroll > 1 else tir.ForKind.SERIAL))
    return tir.PrimFunc(name, (a, out), body)


FUNCS = [_scale(f"scale{n}", 5 + n, 1.0 + n, unroll=1 + (n * 7) % 13) for n in range(13)]


def test_every_kernel_lands_in_exactly_one_module() -> None:
    for jobs in (1, 2, 3):
        chunks = parallel._chunks(FUNCS, jobs)
        assert sorted(f.name for chunk in chunks for f in chunk) == sorted(f.name for f in FUNCS)
        assert all(chunks)
        assert len(chunks) == (1 if jobs == 1 else min(len(FUNCS), jobs * parallel.CHUNKS_PER_JOB))


def test_the_split_is_deterministic_and_largest_first() -> None:
    """The same kernels give the same modules (their kernel-cache keys), the most expensive module first."""
    first, again = parallel._chunks(FUNCS, 2), parallel._chunks(list(FUNCS), 2)
    assert [[f.name for f in c] for c in first] == [[f.name for f in c] for c in again]
    estimates = [sum(parallel.compile_cost(f) for f in chunk) for chunk in first]
    assert estimates == sorted(estimates, reverse=True)
    assert max(estimates) - min(estimates) <= max(parallel.compile_cost(f) for f in FUNCS)


def test_unrolled_code_is_estimated_dearer() -> None:
    assert parallel.compile_cost(_scale("u", 9, 2.0, unroll=8)) > parallel.compile_cost(_scale("s", 9, 2.0))


def test_worker_processes_compile_every_module() -> None:
    objects = parallel.compile_all(FUNCS, HOST, jobs=2)
    assert len(objects) == 2 * parallel.CHUNKS_PER_JOB
    rng = np.random.default_rng(4)
    for obj, chunk in objects:
        library = load_object(obj, [KernelSignature.from_primfunc(f) for f in chunk])
        for func in chunk:
            extent, unroll = func.params[1].shape
            a = rng.standard_normal(extent).astype(np.float32)
            out = np.zeros((extent, unroll), np.float32)
            library.get(func.name)(a, out)
            factor = 1.0 + int(func.name.removeprefix("scale"))
            np.testing.assert_allclose(out, (a * np.float32(factor))[:, None] * np.arange(1, unroll + 1),
                                       rtol=1e-6)
