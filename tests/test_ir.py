"""IR core: immutability, structural equality/hashing, alpha-equivalence, deep programs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from relay_tune.ir import (
    Call,
    Constant,
    Function,
    IRModule,
    Let,
    TensorType,
    Tuple,
    TupleGetItem,
    Var,
    const,
    free_vars,
    op,
    post_order,
    rewrite,
    structural_equal,
)

T = TensorType((2, 3), "float32")


def test_nodes_are_immutable() -> None:
    x = Var("x", T)
    call = Call(op("add"), (x, x))
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.args = ()  # type: ignore[misc]
    c = const(np.ones((2, 2), "float32"))
    with pytest.raises(ValueError):
        c.data[0, 0] = 3.0


def test_a_constant_copies_a_writable_array_unless_it_adopts_it() -> None:
    source = np.arange(6, dtype="float32").reshape(2, 3)
    copied = Constant(source)
    source[0, 0] = 7.0  # the caller's array stays writable and the constant does not see the write
    assert copied.data[0, 0] == 0.0 and not np.shares_memory(copied.data, source)
    fresh = np.arange(6, dtype="float32")
    adopted = Constant.adopt(fresh)
    assert adopted.data is fresh and not fresh.flags.writeable  # handed over: no copy, and nobody writes it now
    with pytest.raises(ValueError):
        fresh[0] = 3.0


def test_structural_equality_and_hash() -> None:
    x = Var("x", T)
    a = Call(op("add"), (x, const(1.0)))
    b = Call(op("add"), (x, const(1.0)))
    assert a == b and hash(a) == hash(b)
    assert a != Call(op("add"), (x, const(2.0)))
    assert a != Call(op("subtract"), (x, const(1.0)))
    assert Var("x", T) != Var("x", T)  # free variables compare by identity


def test_alpha_equivalence_of_functions() -> None:
    x, y = Var("x", T), Var("y", T)
    f = Function((x,), Call(op("nn.relu"), (x,)))
    g = Function((y,), Call(op("nn.relu"), (y,)))
    assert f == g and hash(f) == hash(g)
    h = Function((y,), Call(op("nn.relu"), (x,)))  # body uses a free var, not the parameter
    assert f != h
    v1, v2 = Var("a"), Var("b")
    l1 = Let(v1, const(1.0), Tuple((v1, v1)))
    l2 = Let(v2, const(1.0), Tuple((v2, v2)))
    assert l1 == l2
    assert structural_equal(Call(op("add"), (Var("p", T), Var("q", T))),
                            Call(op("add"), (Var("r", T), Var("s", T))), map_free_vars=True)


def test_constants_compare_by_value_dtype_shape() -> None:
    assert const(np.arange(6, dtype="float32").reshape(2, 3)) == const(np.arange(6, dtype="float32").reshape(2, 3))
    assert const(np.zeros(3, "float32")) != const(np.zeros(3, "float16"))
    assert const(np.zeros(3, "float32")) != const(np.zeros((3, 1), "float32"))


def test_deep_programs_do_not_recurse() -> None:
    x = Var("x", T)
    body: object = x
    for _ in range(20000):
        body = Call(op("nn.relu"), (body,))
    other: object = x
    for _ in range(20000):
        other = Call(op("nn.relu"), (other,))
    assert body == other
    assert len(post_order(body)) == 20002  # 20000 calls, x and the shared op node
    # a 10,000-deep let chain
    chain = x
    for i in range(10000):
        v = Var(f"v{i}")
        chain = Let(v, Call(op("add"), (x, const(float(i)))), chain)
    assert free_vars(chain) == [x]
    assert rewrite(chain, lambda _o, n: n) is chain


def test_rewrite_preserves_sharing_and_replaces() -> None:
    x = Var("x", T)
    shared = Call(op("exp"), (x,))
    root = Tuple((shared, shared, TupleGetItem(Tuple((shared,)), 0)))

    def relu_for_exp(orig, new):
        if isinstance(new, Call) and new.op_name == "exp":
            return Call(op("nn.relu"), new.args)
        return new

    out = rewrite(root, relu_for_exp)
    assert isinstance(out, Tuple)
    assert out.fields[0] is out.fields[1]
    assert out.fields[0].op_name == "nn.relu"


def test_module_equality() -> None:
    x, y = Var("x", T), Var("y", T)
    m1 = IRModule({"main": Function((x,), Call(op("nn.relu"), (x,)))})
    m2 = IRModule({"main": Function((y,), Call(op("nn.relu"), (y,)))})
    assert m1 == m2
    assert m1 != m1.with_function("other", m1.main)
