"""The numpy reference interpreter: values, control flow, closures, input checks, memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from relay_tune.errors import RelayTuneError, RelayTypeError, UnsupportedError
from relay_tune.interpreter import Closure, InputError, Interpreter, ReferenceMismatchError, evaluate
from relay_tune.ir import Call, Function, IRModule, Let, TensorType, TupleGetItem, Var, op
from relay_tune.op.registry import get_op
from relay_tune.text import parse_module

RNG = np.random.default_rng(7)


def module(text: str, constants: list[np.ndarray] | None = None) -> IRModule:
    return parse_module('#[version = "0.0.5"]\n' + text, "t.relay", constants)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_operator_chain_by_name_and_by_position() -> None:
    mod = module("""
def @main(%x: Tensor[(2, 3), float32], %w: Tensor[(4, 3), float32], %b: Tensor[(4), float32]) {
  %0 = nn.dense(%x, %w, units=4);
  %1 = nn.bias_add(%0, %b, axis=-1);
  nn.softmax(%1)
}
""")
    x, w, b = (RNG.standard_normal(s).astype("float32") for s in [(2, 3), (4, 3), (4,)])
    expected = softmax(x @ w.T + b)
    np.testing.assert_allclose(evaluate(mod, {"x": x, "w": w, "b": b}), expected, rtol=1e-5)
    np.testing.assert_allclose(Interpreter(mod).run([x, w, b]), expected, rtol=1e-5)


def test_constants_tuples_projection_and_tuple_result() -> None:
    gamma = np.array([1.0, 2.0], dtype="float32")
    mod = module("""
def @main(%x: Tensor[(1, 2, 3), float32]) {
  %0 = nn.batch_norm(%x, meta[relay.Constant][0], meta[relay.Constant][1], meta[relay.Constant][1],
                     meta[relay.Constant][0]);
  %1 = %0.0;
  (%1, %0.2, nn.dropout(%1).0)
}
""", [gamma, np.zeros(2, dtype="float32")])
    x = RNG.standard_normal((1, 2, 3)).astype("float32")
    out, var, dropped = evaluate(mod, [x])
    expected = x / np.sqrt(gamma + 1e-5)[None, :, None] * gamma[None, :, None]
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    np.testing.assert_array_equal(var, gamma)
    np.testing.assert_array_equal(dropped, out)


def test_primitive_function_literal_and_direct_function_call() -> None:
    mod = module("""
def @main(%a: Tensor[(5, 7), float32]) {
  %0 = fn (%p0: Tensor[(5, 7), float32], %p1: Tensor[(5, 7), float32], Primitive=1) {
    %2 = nn.softmax(%p0);
    (%2, %p1)
  };
  %1 = %0(%a, %a);
  %1.0
}
""")
    a = RNG.standard_normal((5, 7)).astype("float32")
    np.testing.assert_allclose(evaluate(mod, [a]), softmax(a), rtol=1e-5)


def test_closure_captures_outer_let_variable() -> None:
    mod = module("""
def @main(%x: Tensor[(3), float32], %y: Tensor[(3), float32]) {
  let %s = nn.softmax(%x);
  let %f = fn (%z: Tensor[(3), float32]) { (%s, %z) };
  %f(%y)
}
""")
    x, y = np.array([1.0, 2.0, 3.0], "float32"), np.array([0.0, 0.0, 1.0], "float32")
    s, z = evaluate(mod, [x, y])
    np.testing.assert_allclose(s, softmax(x), rtol=1e-6)
    np.testing.assert_array_equal(z, y)


def test_if_only_evaluates_the_branch_taken_and_recursion_terminates() -> None:
    # @loop recurses while %c holds; evaluating both branches eagerly would never stop.
    mod = module("""
def @loop(%x: Tensor[(4), float32], %n: int32) -> Tensor[(4), float32] {
  if (greater(%n, 0)) { @loop(nn.softmax(%x), subtract(%n, 1)) } else { %x }
}
def @main(%x: Tensor[(4), float32], %n: int32) { @loop(%x, %n) }
""")
    x = np.array([0.0, 1.0, 2.0, 3.0], "float32")
    expected = x
    for _ in range(3):
        expected = softmax(expected)
    np.testing.assert_allclose(evaluate(mod, {"x": x, "n": np.array(3, "int32")}), expected, rtol=1e-5)
    np.testing.assert_array_equal(evaluate(mod, {"x": x, "n": 0}), x)  # Python int converted


def test_local_recursive_function() -> None:
    mod = module("""
def @main(%x: Tensor[(3), float32]) {
  let %f = fn (%y: Tensor[(3), float32], %k: int32) -> Tensor[(3), float32] {
    if (less(%k, 1)) { %y } else { %f(nn.softmax(%y), subtract(%k, 1)) }
  };
  %f(%x, 2)
}
""")
    x = np.array([1.0, 0.0, -1.0], "float32")
    np.testing.assert_allclose(evaluate(mod, [x]), softmax(softmax(x)), rtol=1e-5)


def test_polymorphic_function_and_function_values() -> None:
    mod = module("""
def @id[A](%x: A) -> A { %x }
def @aux(%x: Tensor[(), int32]) -> Tensor[(), int32] { %x }
def @main(%f: float32) -> (float32, fn (Tensor[(), int32]) -> Tensor[(), int32]) { (@id(%f), @aux) }
""")
    interp = Interpreter(mod)
    value, fn_value = interp.run([np.float32(2.5)])
    assert value == np.float32(2.5)
    assert isinstance(fn_value, Closure)
    np.testing.assert_array_equal(interp.call(fn_value, [np.array(4, "int32")]), 4)


def test_other_entry_function() -> None:
    mod = module("""
def @double(%x: Tensor[(2), float32]) { (%x, %x) }
def @main(%x: Tensor[(2), float32]) { %x }
""")
    out = evaluate(mod, [np.ones(2, "float32")], entry="double")
    assert isinstance(out, tuple) and len(out) == 2


# ------------------------------------------------------------------------------------------------
# Input checking
# ------------------------------------------------------------------------------------------------

SIMPLE = """
def @main(%x: Tensor[(1, 3), float32], %y: Tensor[(?, 3), float32]) { (%x, %y) }
"""


@pytest.mark.parametrize(
    ("inputs", "pattern"),
    [
        ({"x": np.zeros((1, 3), "float32")}, "missing input.*%y"),
        ({"x": np.zeros((1, 3), "float32"), "y": np.zeros((2, 3), "float32"), "z": 1}, "unknown input.*'z'"),
        ([np.zeros((1, 3), "float32")], "takes 2 input"),
        ({"x": np.zeros((1, 4), "float32"), "y": np.zeros((2, 3), "float32")}, r"%x: expected shape \(1, 3\)"),
        ({"x": np.zeros((1, 3), "float64"), "y": np.zeros((2, 3), "float32")}, "expected dtype float32"),
        ({"x": np.zeros((1, 3), "float32"), "y": np.zeros((2, 4), "float32")}, r"%y: expected shape \(\?, 3\)"),
        ({"x": "text", "y": np.zeros((2, 3), "float32")}, "expected an array"),
    ],
)
def test_input_errors(inputs: object, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern) as err:
        evaluate(module(SIMPLE), inputs)  # type: ignore[arg-type]
    assert isinstance(err.value, RelayTuneError) and isinstance(err.value, RelayTypeError)


def test_dynamic_dims_accept_any_size_and_lists_are_converted() -> None:
    x, y = evaluate(module(SIMPLE), {"x": [[1.0, 2.0, 3.0]], "y": np.zeros((5, 3), "float32")})  # type: ignore[misc]
    assert x.dtype == np.float32 and y.shape == (5, 3)


def test_missing_entry_function() -> None:
    with pytest.raises(InputError, match="no function @nope"):
        evaluate(module(SIMPLE), [], entry="nope")


def test_type_errors_surface_before_running() -> None:
    with pytest.raises(RelayTypeError, match=r"nn\.dense"):
        Interpreter(module("""
def @main(%x: Tensor[(2, 3), float32], %w: Tensor[(4, 5), float32]) { nn.dense(%x, %w) }
"""))


# ------------------------------------------------------------------------------------------------
# Oracle self-checks
# ------------------------------------------------------------------------------------------------


def test_reference_disagreeing_with_its_relation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_op("nn.softmax"), "reference", lambda inputs, attrs: inputs[0][:, :1])
    with pytest.raises(ReferenceMismatchError, match=r"nn\.softmax.*shape \(2, 1\)"):
        evaluate(module("def @main(%x: Tensor[(2, 3), float32]) { nn.softmax(%x) }"), [np.zeros((2, 3), "float32")])
    monkeypatch.setattr(get_op("nn.softmax"), "reference", lambda inputs, attrs: inputs[0].astype("float64"))
    with pytest.raises(ReferenceMismatchError, match="dtype float64"):
        evaluate(module("def @main(%x: Tensor[(2, 3), float32]) { nn.softmax(%x) }"), [np.zeros((2, 3), "float32")])


def test_operator_without_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_op("nn.log_softmax"), "reference", None)
    with pytest.raises(UnsupportedError, match=r"nn\.log_softmax.*no numpy reference"):
        evaluate(module("def @main(%x: Tensor[(3), float32]) { nn.log_softmax(%x) }"), [np.zeros(3, "float32")])


# ------------------------------------------------------------------------------------------------
# Scale: deep programs and freeing intermediates
# ------------------------------------------------------------------------------------------------


def test_deep_dataflow_and_let_chains_do_not_recurse() -> None:
    depth = 10_000
    x = Var("x", TensorType((3,)))
    # Alternate dropout (a tuple) and projection: 20,000 nested nodes.
    body: object = x
    for _ in range(depth):
        body = TupleGetItem(Call(op("nn.dropout"), (body,)), 0)
    data = np.array([1.0, 2.0, 3.0], "float32")
    np.testing.assert_array_equal(evaluate(IRModule({"main": Function((x,), body)}), [data]), data)  # type: ignore[arg-type]

    vars_ = [Var(f"v{i}") for i in range(depth)]
    let_body: object = vars_[-1]
    for i in reversed(range(depth)):
        let_body = Let(vars_[i], Call(op("nn.softmax"), (x if i == 0 else vars_[i - 1],)), let_body)  # type: ignore[arg-type]
    out = evaluate(IRModule({"main": Function((x,), let_body)}), [data])  # type: ignore[arg-type]
    assert out.shape == (3,) and np.isfinite(out).all()


def _peak_bytes(mod: IRModule, data: np.ndarray) -> int:
    interp = Interpreter(mod)
    tracemalloc.start()
    try:
        interp.run([data])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("use_lets", [False, True])
def test_intermediates_are_freed_after_their_last_use(use_lets: bool) -> None:
    steps = 40
    size = 1 << 18  # 1 MiB of float32 per activation
    x = Var("x", TensorType((size,)))
    if use_lets:
        vars_ = [Var(f"v{i}") for i in range(steps)]
        body: object = vars_[-1]
        for i in reversed(range(steps)):
            body = Let(vars_[i], Call(op("nn.softmax"), (x if i == 0 else vars_[i - 1],)), body)  # type: ignore[arg-type]
    else:
        body = x
        for _ in range(steps):
            body = Call(op("nn.softmax"), (body,))  # type: ignore[arg-type]
    mod = IRModule({"main": Function((x,), body)})  # type: ignore[arg-type]
    data = np.ones(size, "float32")
    peak = _peak_bytes(mod, data)
    # Holding every activation would need `steps` MiB; a handful (plus softmax temporaries) is expected.
    assert peak < 8 * size * 4, f"peak {peak / 2**20:.1f} MiB"


def test_shared_value_is_kept_until_its_last_consumer() -> None:
    # %0 feeds the first and the last call; freeing it early would lose it.
    mod = module("""
def @main(%x: Tensor[(4), float32]) {
  %0 = nn.softmax(%x);
  %1 = nn.softmax(%0);
  %2 = nn.softmax(%1);
  (%2, %0)
}
""")
    x = np.arange(4, dtype="float32")
    last, first = evaluate(mod, [x])
    np.testing.assert_allclose(first, softmax(x), rtol=1e-6)
    np.testing.assert_allclose(last, softmax(softmax(softmax(x))), rtol=1e-6)


def test_interpreter_types_untyped_modules_itself() -> None:
    y = Var("y")
    fn = Function((y,), Call(op("nn.softmax"), (y,)))
    x = Var("x", TensorType((3,)))
    mod = IRModule({"main": Function((x,), Call(fn, (x,)))})
    out = evaluate(mod, [np.zeros(3, "float32")])
    np.testing.assert_allclose(out, np.full(3, 1 / 3), rtol=1e-6)


def test_a_program_too_large_for_memory_is_a_clear_error() -> None:
    """Well typed, but its padded pooling input needs 512 GiB: one RelayTuneError naming the operator."""
    import subprocess
    import sys

    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "import numpy as np\n"
        "from relay_tune.errors import RelayTuneError\n"
        "from relay_tune.interpreter import evaluate\n"
        "from relay_tune.text import parse_module\n"
        "mod = parse_module('''#[version = \"0.0.5\"]\n"
        "def @main(%x: Tensor[(1, 8, 6, 6), float32]) {\n"
        "  nn.avg_pool2d(%x, pool_size=[3, 2147483648], padding=[1, 2147483648, 1, 1])\n"
        "}''')\n"
        "try:\n"
        "    evaluate(mod, [np.ones((1, 8, 6, 6), 'float32')])\n"
        "except RelayTuneError as err:\n"
        "    print('ERROR', err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ERROR `nn.avg_pool2d`" in done.stdout and "ran out of memory" in done.stdout
