"""Run-to-run buffers of a compiled model: output memory is reused only when the caller let go of it, and inputs
are read in place unless a kernel needs more alignment than the caller's array has."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.runtime.model import CompiledModel
from relay_tune.text import parse_module

TWO_OUTPUTS = """#[version = "0.0.5"]
def @main(%x: Tensor[(16, 32), float32], %w: Tensor[(24, 32), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.relu(%0);
  (%1, sigmoid(%0))
}
"""


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


@pytest.fixture(scope="module")
def model() -> tuple[CompiledModel, object]:
    mod = parse_module(TWO_OUTPUTS)
    return relay_tune.build(mod, target="llvm"), mod


def _expected(mod: object, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(o) for o in Interpreter(mod).run(inputs)]


def test_a_dropped_output_buffer_is_reused_and_a_held_one_never_is(model: tuple[CompiledModel, object]) -> None:
    compiled, mod = model
    first_inputs = compiled.random_inputs(seed=1)
    second_inputs = compiled.random_inputs(seed=2)
    first = compiled.run(**first_inputs)
    addresses = [_address(o) for o in first]
    kept = [o.copy() for o in first]
    del first
    second = compiled.run(**second_inputs)
    assert [_address(o) for o in second] == addresses  # nothing held them: the same memory, already mapped
    for got, want in zip(second, _expected(mod, second_inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    # Held results, or views of them, keep their memory: the next run writes elsewhere and they do not change.
    relu_view = second[0][2:5]
    sigmoid = second[1]
    held = [relu_view.copy(), sigmoid.copy()]
    del second
    third = compiled.run(**first_inputs)
    assert _address(third[0]) != addresses[0] and _address(third[1]) != addresses[1]
    np.testing.assert_array_equal(relu_view, held[0])
    np.testing.assert_array_equal(sigmoid, held[1])
    for got, want in zip(third, kept):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    # Results collected in a list are all distinct arrays with their own values.
    results = [compiled.run(**compiled.random_inputs(seed=s)) for s in range(3)]
    assert len({_address(r[0]) for r in results}) == 3
    for seed, result in enumerate(results):
        np.testing.assert_allclose(result[1], _expected(mod, compiled.random_inputs(seed=seed))[1], rtol=1e-5,
                                   atol=1e-6)


def test_benchmark_and_profile_leave_later_results_correct(model: tuple[CompiledModel, object]) -> None:
    compiled, mod = model
    inputs = compiled.random_inputs(seed=5)
    kept = compiled.run(**inputs)
    compiled.benchmark(repeat=3, number=2, inputs=inputs)
    compiled.profile(repeat=2, inputs=inputs)
    again = compiled.run(**inputs)
    for a, b, want in zip(kept, again, _expected(mod, inputs)):
        np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a, b)


def test_inputs_are_read_in_place_unless_strided(model: tuple[CompiledModel, object]) -> None:
    compiled, mod = model
    inputs = compiled.random_inputs(seed=7)
    # An array starting 4 bytes past a 64-byte boundary: the templates' kernels assume only element alignment.
    raw = np.zeros(16 * 32 + 32, dtype=np.float32)
    shift = (16 - (_address(raw) % 64) // 4 + 1) % 16
    odd = raw[shift : shift + 16 * 32].reshape(16, 32)
    odd[...] = inputs["x"]
    assert _address(odd) % 64 != 0
    got = compiled.run(x=odd, w=inputs["w"])
    assert compiled._bound_inputs[0] is odd and not compiled._staging  # no copy was made
    np.testing.assert_allclose(got[0], _expected(mod, inputs)[0], rtol=1e-5, atol=1e-6)

    # A strided view is copied into an aligned buffer first: the kernels read dense rows.
    wide = np.zeros((16, 64), dtype=np.float32)
    wide[:, ::2] = inputs["x"]
    got = compiled.run(x=wide[:, ::2], w=inputs["w"])
    assert 0 in compiled._staging
    np.testing.assert_allclose(got[0], _expected(mod, inputs)[0], rtol=1e-5, atol=1e-6)
