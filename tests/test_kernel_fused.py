"""Fused primitive functions built into kernels (compute -> default schedule -> LLVM) agree with the interpreter.

Groups come from FuseOps on small programs (conv2d + bias + relu, residual adds, dense + bias and softmax,
reshape/transpose chains, tuple results) and from the model zoo. Also: the kernel API (`lower_primitive`
with replayed or custom steps, packing of weights), no intermediate buffers inside a group, code
generation properties the default schedules rely on, compile time, and errors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from relay_tune.codegen.llvm import emit_llvm_ir
from relay_tune.compile.primitive import build_primitive, kernel_name, lower_primitive
from relay_tune.errors import CompileError, RelayTuneError, UnsupportedError
from relay_tune.interpreter import evaluate
from relay_tune.ir import (
    Call,
    Constant,
    Expr,
    Function,
    IRModule,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
    const,
    op,
)
from relay_tune.kernel import analysis, tir
from relay_tune.kernel.compute import primitive_compute
from relay_tune.kernel.schedule import Schedule, ScheduleError
from relay_tune.op.registry import get_op
from relay_tune.passes import FuseOps, PassConfig, extract_tasks, optimize
from relay_tune.target import Target
from relay_tune.testing import zoo
from relay_tune.type_infer import infer_types
from search_space.defaults import default_steps

RNG = np.random.default_rng(3)


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def var(name: str, *shape: int, dtype: str = "float32") -> Var:
    return Var(name, TensorType(shape, dtype))


def weight(*shape: int) -> Constant:
    return const((RNG.standard_normal(shape) * 0.3).astype("float32"))


def primitive(params: Sequence[Var], body: Expr) -> tuple[Function, IRModule]:
    mod = infer_types(IRModule({"main": Function(tuple(params), body)}))
    return mod["main"].with_attrs(Primitive=1), mod


def random_value(ty: Type) -> np.ndarray | tuple[np.ndarray, ...]:
    if isinstance(ty, TupleType):
        return tuple(random_value(f) for f in ty.fields)  # type: ignore[misc]
    assert isinstance(ty, TensorType)
    shape = tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]
    if ty.dtype.startswith("float"):
        return RNG.standard_normal(shape).astype(ty.dtype)
    return RNG.integers(0, 3, shape).astype(ty.dtype)


def as_tuple(value: object) -> tuple[np.ndarray, ...]:
    return value if isinstance(value, tuple) else (value,)  # type: ignore[return-value]


def check_function(func: Function, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    """Compile a primitive function and compare it with the interpreter on random inputs."""
    inputs = [random_value(p.checked_type if p.has_type() else p.type_annotation) for p in func.params]  # type: ignore[arg-type]
    plain = infer_types(IRModule({"main": Function(func.params, func.body, func.ret_type)}))
    want = evaluate(plain, inputs)
    got = build_primitive(func)(*inputs)
    for g, w in zip(as_tuple(got), as_tuple(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def fused_primitives(params: Sequence[Var], body: Expr) -> list[Function]:
    """FuseOps on a one-function module; the primitive functions it creates, in evaluation order."""
    mod = infer_types(IRModule({"main": Function(tuple(params), body)}))
    fused = FuseOps().run(mod, PassConfig(opt_level=3))
    return [t.func for t in extract_tasks(fused)]


def allocations(func: tir.PrimFunc) -> dict[str, tir.Buffer]:
    return {s.buffer.name: s.buffer for s in analysis.iter_stmts(func.body) if isinstance(s, tir.Allocate)}


# ------------------------------------------------------------------------------------------------
# fused groups from FuseOps
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "depthwise"])
def test_conv2d_bias_relu(layout: str) -> None:
    if layout == "NHWC":
        x = var("x", 1, 13, 11, 6)
        conv = call("nn.conv2d", x, weight(3, 3, 6, 20), padding=(1, 1), data_layout="NHWC", kernel_layout="HWIO")
        bias = call("nn.bias_add", conv, weight(20), axis=3)
    else:
        x = var("x", 1, 12, 13, 11)
        groups = 12 if layout == "depthwise" else 1
        w = weight(12, 1, 3, 3) if groups == 12 else weight(20, 12, 3, 3)
        conv = call("nn.conv2d", x, w, padding=(1, 1), groups=groups, strides=(2, 1))
        bias = call("nn.bias_add", conv, weight(12 if groups == 12 else 20))
    (func,) = fused_primitives([x], call("nn.relu", bias))
    assert [c.op_name for c in primitive_compute(func).calls] == ["nn.conv2d", "nn.bias_add", "nn.relu"]
    check_function(func)
    prim_func, _ = lower_primitive(func)
    # the group has no intermediate buffers: only the convolution's padded input and its accumulator tile
    # (kept channel-innermost, `conv2d.nhwc`, on narrow NCHW maps like this one)
    assert set(allocations(prim_func)) <= {"conv2d.pad", "conv2d.local", "conv2d.nhwc.local"}
    assert any(s.buffer.name == "relu" for s in analysis.iter_stmts(prim_func.body) if isinstance(s, tir.Store))


@pytest.mark.parametrize("geometry", [(64, 14, 3, 1, 1), (32, 7, 3, 1, 1), (24, 20, 3, 2, 1), (40, 15, 1, 2, 0)])
def test_conv2d_on_narrow_maps_accumulates_channel_innermost(geometry: tuple[int, int, int, int, int]) -> None:
    channels, size, k, stride, pad = geometry
    x = var("x", 1, 16, size, size)
    conv = call("nn.conv2d", x, weight(channels, 16, k, k), strides=(stride, stride), padding=(pad, pad))
    (func,) = fused_primitives([x], call("nn.relu", call("nn.bias_add", conv, weight(channels))))
    tags = [t.op.tag for t in primitive_compute(func).calls[0].tensors]
    assert "conv2d_nchw_cl" in tags
    check_function(func)
    prim_func, packing = lower_primitive(func)
    lanes = Target.host().vector_lanes()  # lower_primitive schedules for the host
    assert allocations(prim_func)["conv2d.nhwc.local"].shape[-1] == min(channels, 2 * lanes)  # up to two vectors
    assert packing.packed_inputs == (1,)


def test_conv2d_residual_add_relu() -> None:
    x, skip = var("x", 1, 16, 14, 14), var("skip", 1, 32, 14, 14)
    conv = call("nn.bias_add", call("nn.conv2d", x, weight(32, 16, 1, 1)), weight(32))
    (func,) = fused_primitives([x, skip], call("nn.relu", call("add", conv, skip)))
    assert "add" in [c.op_name for c in primitive_compute(func).calls]
    check_function(func)
    assert set(allocations(lower_primitive(func)[0])) <= {"conv2d.local"}


def test_dense_bias_and_softmax_fuse_separately() -> None:
    x = var("x", 3, 40)
    logits = call("nn.bias_add", call("nn.dense", x, weight(37, 40)), weight(37))
    funcs = fused_primitives([x], call("nn.softmax", logits))
    assert [[c.op_name for c in primitive_compute(f).calls] for f in funcs] == [
        ["nn.dense", "nn.bias_add"], ["nn.softmax"]
    ]
    for func in funcs:
        check_function(func, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(37, 29, 53), (1, 64, 10), (16, 7, 64), (2, 1000, 3)])
def test_dense_bias_relu(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    a, w, b = var("a", m, k), var("w", n, k), var("b", n)
    func, _ = primitive([a, w, b], call("nn.relu", call("nn.bias_add", call("nn.dense", a, w), b)))
    check_function(func)


def test_reshape_transpose_chain() -> None:
    x, y = var("x", 2, 12, 5), var("y", 6, 5, 4)
    r = call("reshape", x, newshape=(4, 6, 5))
    t = call("transpose", r, axes=(1, 2, 0))
    s = call("reshape", call("add", t, y), newshape=(-1, 8))
    funcs = fused_primitives([x, y], call("nn.relu", call("transpose", s)))
    assert len(funcs) == 1
    check_function(funcs[0], rtol=0, atol=0)
    assert allocations(lower_primitive(funcs[0])[0]) == {}


def test_batch_matmul_scale_softmax_like_attention() -> None:
    q, k = var("q", 4, 9, 16), var("k", 4, 11, 16)
    scores = call("multiply", call("nn.batch_matmul", q, k, transpose_b=True), const(np.float32(0.25)))
    funcs = fused_primitives([q, k], call("nn.softmax", scores))
    assert len(funcs) == 2
    for func in funcs:
        check_function(func, rtol=1e-5, atol=1e-5)


def test_pool_and_global_pool_groups() -> None:
    x = var("x", 1, 8, 15, 15)
    pooled = call("nn.max_pool2d", call("nn.relu", x), pool_size=(3, 3), strides=(2, 2), padding=(1, 1))
    mean = call("nn.global_avg_pool2d", call("add", pooled, const(np.float32(1.0))))
    for func in fused_primitives([x], call("nn.batch_flatten", mean)):
        check_function(func)


def test_tuple_results_and_tuple_parameters() -> None:
    x = var("x", 9, 10)
    parts = call("split", call("exp", x), indices_or_sections=(2, 7), axis=0)
    func, _ = primitive([x], Tuple((TupleGetItem(parts, 2), call("nn.relu", TupleGetItem(parts, 0)), x)))
    kernel = build_primitive(func)
    value = RNG.standard_normal((9, 10)).astype("float32")
    got = kernel(value)
    assert isinstance(got, tuple) and len(got) == 3
    np.testing.assert_allclose(got[0], np.exp(value[7:]), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.exp(value[:2]), rtol=1e-6)
    np.testing.assert_array_equal(got[2], value)  # a parameter returned as is gets a copy stage
    pair = Var("pair", TupleType((TensorType((3, 4), "float32"), TensorType((3, 2), "float32"))))
    func, _ = primitive([pair], call("concatenate", pair, axis=1))
    check_function(func, rtol=0, atol=0)


def test_scalar_constants_are_inlined() -> None:
    x = var("x", 5, 7)
    func, _ = primitive([x], call("maximum", call("multiply", x, const(np.float32(3.0))), const(np.float32(0.5))))
    check_function(func)
    prim_func, packing = lower_primitive(func)
    assert [p.name for p in prim_func.params] == ["p0", "maximum"] and packing.packed_inputs == ()


# ------------------------------------------------------------------------------------------------
# the kernel API
# ------------------------------------------------------------------------------------------------


def dense_relu() -> Function:
    a, w = var("a", 8, 16), var("w", 40, 16)
    return primitive([a, w], call("nn.relu", call("nn.dense", a, w)))[0]


def test_dense_weights_are_packed_ahead() -> None:
    func = dense_relu()
    prim_func, packing = lower_primitive(func)
    assert packing.packed_inputs == (1,)
    assert [(p.role, p.index) for p in packing.params] == [("input", 0), ("input", 1), ("output", 0)]
    # panels of two vectors of columns (32 with AVX-512: two panels, the second half empty; 16 with AVX2: three)
    panel = 2 * Target.host().vector_lanes()
    assert prim_func.params[1].shape == (-(-40 // panel), 16, panel)
    kernel = build_primitive(func)
    a, w = RNG.standard_normal((8, 16)).astype("float32"), RNG.standard_normal((40, 16)).astype("float32")
    out = np.empty((8, 40), "float32")
    kernel.run([a, w], [out], packed={1: packing.pack_input(1, w)})  # weights packed once, ahead of time
    np.testing.assert_allclose(out, np.maximum(a @ w.T, 0), rtol=1e-5, atol=1e-5)


def test_default_steps_replay_from_json() -> None:
    func = dense_relu()
    target = Target.host()
    steps = default_steps(primitive_compute(func), target, constants=None)
    as_json = json.loads(json.dumps([s.to_json() for s in steps]))
    replayed, _ = lower_primitive(func, target, as_json, name="k")
    direct, _ = lower_primitive(func, target, name="k")
    assert analysis.structurally_equal(replayed, direct)
    # the same steps from the function itself
    assert default_steps(func, target, constants=None) == steps


def test_custom_steps_replace_the_default() -> None:
    func = dense_relu()
    naive, packing = lower_primitive(func, steps=[])
    # no steps: nothing packed, nothing inlined (the relu reads a root buffer of the product)
    assert packing.packed_inputs == () and "dense" in allocations(naive)
    with pytest.raises(ScheduleError, match="reduction"):
        lower_primitive(func, steps=[{"kind": "compute_inline", "stage": "dense"}])


def test_naive_and_custom_schedules_compute_the_same() -> None:
    func = dense_relu()
    a, w = RNG.standard_normal((8, 16)).astype("float32"), RNG.standard_normal((40, 16)).astype("float32")
    want = np.maximum(a @ w.T, 0)
    prim = primitive_compute(func)
    sch = Schedule(prim.outputs)
    _, j = sch.leaves("relu")
    _, ji = sch.split("relu", j, factor=8)
    sch.vectorize("relu", ji)
    for steps in ([], sch.steps):
        np.testing.assert_allclose(build_primitive(func, schedule_steps=steps)(a, w), want, rtol=1e-5, atol=1e-5)


def test_kernel_names_are_valid_symbols_and_stable() -> None:
    func = dense_relu()
    name = kernel_name(func)
    assert name.startswith("fused_dense_relu_") and name.replace("_", "").isalnum()
    assert kernel_name(dense_relu()) == name  # same workload, same name (parameter names do not matter)


def test_inputs_are_checked() -> None:
    kernel = build_primitive(dense_relu())
    with pytest.raises(RelayTuneError, match="expected float32"):
        kernel(np.zeros((8, 15), "float32"), np.zeros((40, 16), "float32"))
    with pytest.raises(RelayTuneError, match="takes 2 inputs"):
        kernel(np.zeros((8, 16), "float32"))


# ------------------------------------------------------------------------------------------------
# code generation properties the default schedules rely on
# ------------------------------------------------------------------------------------------------


def test_odd_vector_widths_become_power_of_two_chunks() -> None:
    """A 28-wide output row is vectorized as 16 + 8 + 4 lanes; LLVM scalarizes `<28 x float>`. (Two rows: on taller
    maps narrower than two vectors a 1x1 convolution runs in flat mode, positions tiled across row ends.)"""
    x, w = var("x", 1, 8, 2, 28), var("w", 16, 8, 1, 1)
    func, _ = primitive([x, w], call("nn.conv2d", x, w))
    text = emit_llvm_ir([lower_primitive(func)[0]], Target.host())
    assert "<28 x float>" not in text and "<16 x float>" in text and "<4 x float>" in text


def test_flat_elementwise_loops_access_memory_contiguously() -> None:
    """Fused loops over (64, 7, 7) split by the vector width recompose to the flat index: no gathers."""
    x, y = var("x", 1, 64, 7, 7), var("y", 1, 64, 7, 7)
    func, _ = primitive([x, y], call("nn.relu", call("add", x, y)))
    text = emit_llvm_ir([lower_primitive(func)[0]], Target.host())
    assert "masked.gather" not in text and "masked.scatter" not in text


def test_a_resnet_sized_fused_conv2d_compiles() -> None:
    x = var("x", 1, 64, 56, 56)
    conv = call("nn.conv2d", x, weight(64, 64, 3, 3), padding=(1, 1))
    (func,) = fused_primitives([x], call("nn.relu", call("nn.bias_add", conv, weight(64))))
    assert build_primitive(func) is not None


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------


def test_dynamic_shapes_are_rejected() -> None:
    from relay_tune.ir import ANY

    x = Var("x", TensorType((ANY, 4), "float32"))
    func, _ = primitive([x], call("exp", x))
    with pytest.raises(UnsupportedError, match="static shapes"):
        lower_primitive(func)


def test_tensor_constants_inside_a_group_are_rejected() -> None:
    x = var("x", 3)
    func, _ = primitive([x], call("add", x, const(np.ones(3, "float32"))))
    with pytest.raises(UnsupportedError, match="tensor constants are parameters"):
        lower_primitive(func)


def test_untyped_functions_are_rejected() -> None:
    x = Var("x")
    with pytest.raises(CompileError, match="type inference"):
        lower_primitive(Function((x,), call("exp", x)))


# ------------------------------------------------------------------------------------------------
# whole models of the zoo
# ------------------------------------------------------------------------------------------------


def check_model_tasks(mod: IRModule) -> int:
    tasks = extract_tasks(optimize(mod, opt_level=3))
    for task in tasks:
        check_function(task.func, rtol=1e-3, atol=1e-3)
    return len(tasks)


@pytest.mark.parametrize("model", ["squeezenet1_1", "lstm", "bert_layer"])
def test_every_small_model_task_matches_the_interpreter(model: str) -> None:
    assert check_model_tasks(zoo.small(model)) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet50", "mobilenet_v2", "bert_layer"])
def test_every_model_task_matches_the_interpreter(model: str) -> None:
    assert check_model_tasks(zoo.full(model)) >= 10
