"""NVPTX code generation: launch planning, thread bindings, shared memory, math, every operator through the
default GPU schedules, the zoo models, the GPU search spaces, and ptxas acceptance (skipped without ptxas).

Without a GPU, kernels are checked for GPU semantics on the emulated device (threads as coroutines that meet at
barriers, per-thread local and per-block shared memory), against the reference interpreter."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import llvmlite.ir as ir
import numpy as np
import pytest

from relay_tune.codegen import nvptx
from relay_tune.codegen.nvptx import (
    STATIC_SHARED_LIMIT,
    CompileError,
    Float64Math,
    assemble_ptx,
    build_ptx,
    emit_llvm_ir,
    find_ptxas,
    plan_kernels,
)
from relay_tune.compile.primitive import lower_primitive
from relay_tune.errors import UnsupportedError
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
    Var,
    free_vars,
    op,
    post_order,
)
from relay_tune.kernel import tir
from relay_tune.kernel.compute import primitive_compute
from relay_tune.kernel.recurrent import FIXED_KERNELS
from relay_tune.op.registry import all_ops, get_op
from relay_tune.runtime.cuda import EmulatedDevice, run_function
from relay_tune.target import Target
from relay_tune.type_infer import infer_types
from search_space import Config
from search_space.gpu import config_to_params, default_config, gpu_space
from search_space.gpu_template import (
    FlatParams,
    MatmulParams,
    default_gpu_schedule,
    default_params,
    family_of,
    gpu_schedule,
)

CUDA = Target.parse("cuda -arch=sm_90")
PTXAS = find_ptxas()
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas (CUDA toolkit) is not installed")
RNG = np.random.default_rng(7)


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def var(name: str, *shape: int, dtype: str = "float32") -> Var:
    return Var(name, TensorType(shape, dtype))


def primitive(params: Sequence[Var], body: Expr) -> tuple[Function, IRModule]:
    mod = infer_types(IRModule({"main": Function(tuple(params), body)}))
    if any(isinstance(n, Call) and n.op_name in ("nn.batch_norm", "nn.dropout") for n in post_order(body)):
        # inference-only operators have no kernel of their own: the pass pipeline rewrites them first
        from relay_tune.passes import SimplifyInference

        mod = infer_types(SimplifyInference()(mod))
    return mod["main"].with_attrs(Primitive=1), mod


def inputs_for(params: Sequence[Var]) -> list[np.ndarray]:
    out = []
    for p in params:
        ty = p.type_annotation
        assert isinstance(ty, TensorType)
        shape = tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]
        if ty.dtype == "bool":
            out.append(RNG.random(shape) < 0.5)
        elif ty.dtype.startswith("int"):
            out.append(RNG.integers(0, 3, shape).astype(ty.dtype))
        else:
            out.append((RNG.random(shape) * 1.6 + 0.2).astype(ty.dtype))  # positive: log/sqrt/pow are defined
    return out


def lower_gpu(func: Function, name: str, params: object = None) -> tuple[tir.PrimFunc, object]:
    prim = primitive_compute(func)
    steps = default_gpu_schedule(prim, CUDA) if params is None else gpu_schedule(prim, params)  # type: ignore[arg-type]
    return lower_primitive(func, CUDA, steps, name=name, prim=prim)


def emulate(func: Function, mod: IRModule, name: str, params: object = None, rtol: float = 2e-4) -> str:
    """Lower with the GPU schedule, compile to PTX, run on the emulated device, compare with the interpreter."""
    primfunc, packing = lower_gpu(func, name, params)
    module = build_ptx([primfunc], CUDA)
    inputs = inputs_for(func.params)
    want = evaluate(mod, inputs)
    wants = want if isinstance(want, tuple) else (want,)
    args = packing.kernel_arguments(inputs, [np.empty(s, d) for s, d in zip(packing.output_shapes,  # type: ignore
                                                                            packing.output_dtypes)])  # type: ignore
    n_out = len(packing.output_shapes)  # type: ignore[attr-defined]
    device = EmulatedDevice()
    got = run_function(device, device.load(module), name, args[: len(args) - n_out])
    by_index = {p.index: g for p, g in zip([p for p in packing.params if p.role == "output"], got)}  # type: ignore
    for i, w in enumerate(wants):
        np.testing.assert_allclose(by_index[i], np.asarray(w), rtol=rtol, atol=rtol, err_msg=name)
    return module.ptx


def tiled_matmul(m: int, n: int, k: int, bm: int = 32, bn: int = 32, bk: int = 8, tm: int = 4, tn: int = 4,
                 barriers: bool = True) -> tir.PrimFunc:
    """C = A @ B with shared-memory tiles filled by all threads of a block between barriers."""
    a, b, c = tir.Buffer("A", (m, k)), tir.Buffer("B", (k, n)), tir.Buffer("C", (m, n))
    a_s = tir.Buffer("As", (bm, bk), scope=tir.Scope.SHARED)
    b_s = tir.Buffer("Bs", (bk, bn), scope=tir.Scope.SHARED)
    acc = tir.Buffer("acc", (tm, tn), scope=tir.Scope.LOCAL)
    ty_n, tx_n = bm // tm, bn // tn
    by, bx, ty, tx = (tir.LoopVar(v) for v in ("by", "bx", "ty", "tx"))

    def fill(buf: tir.Buffer, src: tir.Buffer, rows: int, cols: int, r0: tir.PrimExpr, c0: tir.PrimExpr) -> tir.Stmt:
        f, t1, t2 = tir.LoopVar("f"), tir.LoopVar("t1"), tir.LoopVar("t2")
        lin = f * (ty_n * tx_n) + t1 * tx_n + t2
        store = tir.Store(buf, (lin // cols, lin % cols), src[r0 + lin // cols, c0 + lin % cols])
        inner = tir.For(t2, tx_n, store, tir.ForKind.THREAD_BINDING, "threadIdx.x")
        return tir.For(f, rows * cols // (ty_n * tx_n), tir.For(t1, ty_n, inner, tir.ForKind.THREAD_BINDING,
                                                                   "threadIdx.y"))

    ko, kk, i, j, i0, j0, i1, j1 = (tir.LoopVar(v) for v in ("ko", "kk", "i", "j", "i0", "j0", "i1", "j1"))
    init = tir.For(i0, tm, tir.For(j0, tn, tir.Store(acc, (i0, j0), tir.FloatImm(0.0)), tir.ForKind.UNROLLED),
                   tir.ForKind.UNROLLED)
    update = tir.Store(acc, (i, j), acc[i, j] + a_s[ty * tm + i, kk] * b_s[kk, tx * tn + j])
    inner = tir.For(kk, bk, tir.For(i, tm, tir.For(j, tn, update, tir.ForKind.UNROLLED), tir.ForKind.UNROLLED))
    fills = [fill(a_s, a, bm, bk, by * bm, ko * bk), fill(b_s, b, bk, bn, ko * bk, bx * bn)]
    steps = [tir.Barrier(), *fills, tir.Barrier(), inner] if barriers else [*fills, inner]
    loop_k = tir.For(ko, k // bk, tir.seq(*steps))
    write = tir.For(i1, tm, tir.For(j1, tn, tir.Store(c, (by * bm + ty * tm + i1, bx * bn + tx * tn + j1),
                                                      acc[i1, j1]), tir.ForKind.VECTORIZED), tir.ForKind.UNROLLED)
    body: tir.Stmt = tir.Allocate(a_s, tir.Allocate(b_s, tir.Allocate(acc, tir.seq(init, loop_k, write))))
    for v, extent, tag in ((tx, tx_n, "threadIdx.x"), (ty, ty_n, "threadIdx.y"), (bx, n // bn, "blockIdx.x"),
                           (by, m // bm, "blockIdx.y")):
        body = tir.For(v, extent, body, tir.ForKind.THREAD_BINDING, tag)
    return tir.PrimFunc("matmul", (a, b, c), body)


def ptx_ops(ptx: str) -> set[str]:
    return set(re.findall(r"^\s+([a-z][a-z0-9_.]*)", ptx, re.M))


# ---------------------------------------------------------------------------------------------------
# hand-built kernels
# ---------------------------------------------------------------------------------------------------


def test_tiled_matmul_ptx_uses_threads_shared_memory_barriers_and_vectors() -> None:
    func = tiled_matmul(64, 64, 32)
    module = build_ptx([func], CUDA)
    ptx = module.ptx
    assert ".visible .entry matmul(" in ptx
    assert ".target sm_90" in ptx
    for register in ("%tid.x", "%tid.y", "%ctaid.x", "%ctaid.y"):
        assert register in ptx
    ops = ptx_ops(ptx)
    assert "bar.sync" in ops
    assert {"st.shared.b32", "ld.shared.b32"} <= ops or any(o.startswith("ld.shared") for o in ops)
    assert any(o.startswith("ld.global.nc") for o in ops), "inputs should be read through the read-only cache"
    assert "st.global.v4.b32" in ops, "the vectorized 4-wide store should be one 128-bit store"
    assert any(o.startswith("fma.rn.f32") for o in ops)
    (plan,) = module.functions
    (kernel,) = plan.kernels
    assert kernel.launch.grid == (2, 2, 1) and kernel.launch.block == (8, 8, 1)
    assert kernel.static_shared_bytes == (32 * 8 + 8 * 32) * 4


def test_tiled_matmul_runs_correctly_on_the_emulated_gpu() -> None:
    func = tiled_matmul(64, 64, 32)
    device = EmulatedDevice()
    loaded = device.load(build_ptx([func], CUDA))
    a = RNG.standard_normal((64, 32)).astype("float32")
    b = RNG.standard_normal((32, 64)).astype("float32")
    (c,) = run_function(device, loaded, "matmul", [a, b])
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_emulator_exposes_missing_barriers() -> None:
    func = tiled_matmul(64, 64, 32, barriers=False)
    device = EmulatedDevice()
    loaded = device.load(build_ptx([func], CUDA))
    a = RNG.standard_normal((64, 32)).astype("float32")
    b = RNG.standard_normal((32, 64)).astype("float32")
    (c,) = run_function(device, loaded, "matmul", [a, b])
    assert not np.allclose(c, a @ b, equal_nan=False)


def test_llvm_ir_conventions() -> None:
    text = emit_llvm_ir([tiled_matmul(64, 64, 32)], CUDA)
    assert 'target triple = "nvptx64-nvidia-cuda"' in text
    assert "ptx_kernel" in text
    assert "addrspace(1)" in text and "addrspace(3)" in text
    assert "llvm.nvvm.read.ptx.sreg.tid.x" in text and "llvm.nvvm.barrier0" in text
    assert "noalias" in text


def _flat_kernel(n: int, threads: int, extent: int, second_extent: int | None = None) -> tir.PrimFunc:
    """out[i] = x[i] * 2 over blocks x threads, optionally followed by a second nest on fewer threads."""
    x, out = tir.Buffer("x", (n,)), tir.Buffer("out", (n,))
    b, t = tir.LoopVar("b"), tir.LoopVar("t")
    idx = b * threads + t
    store = tir.IfThenElse(idx < n, tir.Store(out, (idx,), x[idx] * 2.0))
    nest: tir.Stmt = tir.For(b, -(-n // threads), tir.For(t, extent, store, tir.ForKind.THREAD_BINDING,
                                                          "threadIdx.x"), tir.ForKind.THREAD_BINDING, "blockIdx.x")
    return tir.PrimFunc("flat", (x, out), nest)


def test_shorter_thread_bindings_are_guarded_and_reused_indices_do_not_grow_the_block() -> None:
    x, out = tir.Buffer("x", (64,)), tir.Buffer("out", (64,))
    t, u = tir.LoopVar("t"), tir.LoopVar("u")
    inner = tir.For(u, 16, tir.Store(out, (u,), x[u] + 1.0), tir.ForKind.THREAD_BINDING, "threadIdx.x")
    body = tir.For(t, 64, tir.seq(tir.Store(out, (t,), x[t]), inner), tir.ForKind.THREAD_BINDING, "threadIdx.x")
    func = tir.PrimFunc("guarded", (x, out), body)
    module = build_ptx([func], CUDA)
    assert module.functions[0].kernels[0].launch.block == (64, 1, 1)
    device = EmulatedDevice(reverse=False)  # forward order: the inner store (threads 0..15) runs last per thread
    xs = np.arange(64, dtype="float32")
    (got,) = run_function(device, device.load(module), "guarded", [xs])
    np.testing.assert_array_equal(got, np.concatenate([xs[:16] + 1, xs[16:]]))


def test_nested_binding_longer_than_its_enclosing_binding_is_rejected() -> None:
    x, out = tir.Buffer("x", (64,)), tir.Buffer("out", (64,))
    t, u = tir.LoopVar("t"), tir.LoopVar("u")
    inner = tir.For(u, 64, tir.Store(out, (u,), x[u]), tir.ForKind.THREAD_BINDING, "threadIdx.x")
    func = tir.PrimFunc("bad", (x, out), tir.For(t, 32, inner, tir.ForKind.THREAD_BINDING, "threadIdx.x"))
    with pytest.raises(CompileError, match=r"enclosing loop bound to threadIdx\.x"):
        build_ptx([func], CUDA)


def test_too_many_threads_per_block_is_rejected() -> None:
    with pytest.raises(CompileError, match="block dimension x = 2048 exceeds"):
        plan_kernels(_flat_kernel(4096, 2048, 2048))
    x, out = tir.Buffer("x", (64, 64)), tir.Buffer("out", (64, 64))
    i, j = tir.LoopVar("i"), tir.LoopVar("j")
    body = tir.For(i, 64, tir.For(j, 32, tir.Store(out, (i, j), x[i, j]), tir.ForKind.THREAD_BINDING, "threadIdx.x"),
                   tir.ForKind.THREAD_BINDING, "threadIdx.y")
    with pytest.raises(CompileError, match="2048 threads per block"):
        plan_kernels(tir.PrimFunc("big", (x, out), body))


def test_barrier_under_thread_dependent_condition_is_rejected() -> None:
    x, out = tir.Buffer("x", (64,)), tir.Buffer("out", (64,))
    t = tir.LoopVar("t")
    body = tir.For(t, 64, tir.IfThenElse(t < 32, tir.seq(tir.Barrier(), tir.Store(out, (t,), x[t]))),
                   tir.ForKind.THREAD_BINDING, "threadIdx.x")
    with pytest.raises(CompileError, match="barrier"):
        build_ptx([tir.PrimFunc("diverge", (x, out), body)], CUDA)


def test_cpu_parallel_loops_are_rejected_on_gpus() -> None:
    x, out = tir.Buffer("x", (64,)), tir.Buffer("out", (64,))
    i = tir.LoopVar("i")
    func = tir.PrimFunc("par", (x, out), tir.For(i, 64, tir.Store(out, (i,), x[i]), tir.ForKind.PARALLEL))
    with pytest.raises(CompileError, match="blockIdx/threadIdx"):
        build_ptx([func], CUDA)


def test_root_intermediates_become_workspaces_and_separate_kernels() -> None:
    x, out = tir.Buffer("x", (256,)), tir.Buffer("out", (256,))
    mid = tir.Buffer("mid", (256,))
    b1, t1, b2, t2 = (tir.LoopVar(v) for v in ("b1", "t1", "b2", "t2"))

    def nest(b: tir.LoopVar, t: tir.LoopVar, store: tir.Stmt) -> tir.Stmt:
        return tir.For(b, 4, tir.For(t, 64, store, tir.ForKind.THREAD_BINDING, "threadIdx.x"),
                       tir.ForKind.THREAD_BINDING, "blockIdx.x")

    i1, i2 = b1 * 64 + t1, b2 * 64 + t2
    first = nest(b1, t1, tir.Store(mid, (i1,), x[i1] * 3.0))
    # every element of the second nest reads an element another block wrote
    second = nest(b2, t2, tir.Store(out, (i2,), mid[255 - i2] + 1.0))
    func = tir.PrimFunc("two", (x, out), tir.Allocate(mid, tir.seq(first, second)))
    _, plan = plan_kernels(func)
    assert [k.name for k in plan.kernels] == ["two_k0", "two_k1"]
    assert [w.name for w in plan.workspaces] == ["mid"]
    assert plan.kernels[0].args == (0, 2) and plan.kernels[1].args == (1, 2)
    device = EmulatedDevice()
    xs = np.arange(256, dtype="float32")
    (got,) = run_function(device, device.load(build_ptx([func], CUDA)), "two", [xs])
    np.testing.assert_allclose(got, xs[::-1] * 3 + 1)


def _shared_copy(elements: int) -> tir.PrimFunc:
    x, out = tir.Buffer("x", (elements,)), tir.Buffer("out", (elements,))
    s = tir.Buffer("s", (elements,), scope=tir.Scope.SHARED)
    t, f, g = tir.LoopVar("t"), tir.LoopVar("f"), tir.LoopVar("g")
    per = elements // 256
    fill = tir.For(f, per, tir.Store(s, (f * 256 + t,), x[f * 256 + t]))
    drain = tir.For(g, per, tir.Store(out, (g * 256 + t,), s[elements - 1 - (g * 256 + t)]))
    body = tir.For(t, 256, tir.Allocate(s, tir.seq(fill, tir.Barrier(), drain)), tir.ForKind.THREAD_BINDING,
                   "threadIdx.x")
    return tir.PrimFunc("shared_copy", (x, out), body)


def test_large_shared_buffers_use_dynamic_shared_memory() -> None:
    elements = 24 * 1024  # 96 KiB: over the 48 KiB of static shared memory
    module = build_ptx([_shared_copy(elements)], CUDA)
    (kernel,) = module.functions[0].kernels
    assert kernel.launch.dynamic_shared_bytes == elements * 4 > STATIC_SHARED_LIMIT
    assert kernel.static_shared_bytes == 0
    assert ".extern .shared" in module.ptx
    device = EmulatedDevice()
    xs = np.arange(elements, dtype="float32")
    (got,) = run_function(device, device.load(module), "shared_copy", [xs])
    np.testing.assert_array_equal(got, xs[::-1])
    with pytest.raises(CompileError, match="shared memory"):
        build_ptx([_shared_copy(elements)], "sm_75")  # 64 KiB per block there


def test_unknown_architecture_and_cpu_target_are_refused() -> None:
    with pytest.raises(UnsupportedError, match="unknown CUDA architecture"):
        build_ptx([tiled_matmul(64, 64, 32)], "sm_999")
    with pytest.raises(UnsupportedError, match="cuda target"):
        build_ptx([tiled_matmul(64, 64, 32)], Target.parse("llvm"))


def test_kernel_names_become_valid_ptx_identifiers() -> None:
    func = tiled_matmul(64, 64, 32)
    renamed = tir.PrimFunc("fused.dense-relu", func.params, func.body)
    module = build_ptx([renamed], CUDA)
    assert module.functions[0].kernels[0].name == "fused_dense_relu"
    assert ".entry fused_dense_relu(" in module.ptx


# ---------------------------------------------------------------------------------------------------
# math
# ---------------------------------------------------------------------------------------------------


def _cpu_math(name: str, values: np.ndarray, second: np.ndarray | None = None) -> np.ndarray:
    """Run Float64Math's IR on the CPU (it uses only generic LLVM instructions) for exact checking."""
    import ctypes

    import llvmlite.binding as llvm

    from relay_tune.codegen.llvm import ensure_llvm_initialized

    ensure_llvm_initialized()
    f64 = ir.DoubleType()
    module = ir.Module("math")
    module.triple = llvm.get_process_triple()
    nargs = 1 if second is None else 2
    fn = ir.Function(module, ir.FunctionType(f64, [f64] * nargs), "f")
    builder = ir.IRBuilder(fn.append_basic_block())
    declared: dict[str, ir.Function] = {}

    def intrinsic(base: str, typ: ir.Type, count: int = 1) -> ir.Function:
        key = f"{base}.f64"
        if key not in declared:
            declared[key] = ir.Function(module, ir.FunctionType(typ, [typ] * count), key)
        return declared[key]

    maths = Float64Math(builder, intrinsic)
    builder.ret(getattr(maths, name)(*fn.args))
    parsed = llvm.parse_assembly(str(module))
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(parsed, machine)
    engine.finalize_object()
    cfunc = ctypes.CFUNCTYPE(*([ctypes.c_double] * (nargs + 1)))(engine.get_function_address("f"))
    if second is None:
        result = np.array([cfunc(float(v)) for v in values])
    else:
        result = np.array([cfunc(float(a), float(b)) for a, b in zip(values, second)])
    del engine
    return result


@pytest.mark.parametrize(
    ("name", "reference", "values"),
    [
        ("exp", np.exp, np.concatenate([np.linspace(-745, 709, 2001), [0.0, -1e-300, 1e-8, np.inf, -np.inf]])),
        ("log", np.log, np.concatenate([np.geomspace(1e-310, 1e308, 2001), [1.0, 0.0, np.inf]])),
        ("tanh", np.tanh, np.linspace(-30, 30, 2001)),
        ("erf", np.vectorize(math.erf), np.linspace(-7, 7, 2001)),
        ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), np.linspace(-40, 40, 801)),
    ],
)
def test_float64_math_is_accurate(name: str, reference: object, values: np.ndarray) -> None:
    got = _cpu_math(name, values)
    with np.errstate(all="ignore"):
        want = reference(values)  # type: ignore[operator]
    np.testing.assert_allclose(got, want, rtol=4e-15, atol=1e-300)


def test_float64_math_special_values() -> None:
    assert math.isnan(_cpu_math("exp", np.array([np.nan]))[0])
    assert math.isnan(_cpu_math("log", np.array([-1.0]))[0])
    assert _cpu_math("log", np.array([0.0]))[0] == -np.inf
    assert _cpu_math("erf", np.array([np.inf]))[0] == 1.0


def test_pow_follows_c_semantics() -> None:
    x = np.array([2.0, 2.0, -2.0, -2.0, -2.0, 0.0, 0.0, 1.0, 5.5, 0.3])
    y = np.array([10.0, -0.5, 3.0, 2.0, 0.5, 2.0, -1.0, np.nan, 0.0, 7.25])
    with np.errstate(all="ignore"):
        want = np.power(x, y)
    np.testing.assert_allclose(_cpu_math("pow", x, y), want, rtol=1e-14, equal_nan=True)


def test_transcendentals_compile_without_library_calls() -> None:
    x = var("x", 4, 8, dtype="float64")
    y = var("y", 4, 8)
    body = Tuple([call("erf", call("tanh", call("log", call("exp", x)))), call("power", y, call("sigmoid", y))])
    func, _ = primitive([x, y], body)
    primfunc, _ = lower_gpu(func, "math")
    ptx = build_ptx([primfunc], CUDA).ptx
    assert "call" not in ptx_ops(ptx) and ".extern .func" not in ptx


# ---------------------------------------------------------------------------------------------------
# every registered operator through the default GPU schedules
# ---------------------------------------------------------------------------------------------------


def _op_case(name: str) -> tuple[list[Var], Expr]:
    x = var("x", 2, 3, 8, 8)
    y = var("y", 2, 3, 8, 8)
    unary = {"abs", "ceil", "copy", "erf", "exp", "floor", "log", "negative", "round", "rsqrt", "sigmoid", "sqrt",
             "tanh", "nn.relu", "ones_like", "zeros_like", "nn.batch_flatten", *CPU_ONLY_OPS}
    binary = {"add", "divide", "equal", "greater", "greater_equal", "less", "less_equal", "maximum", "minimum",
              "multiply", "not_equal", "subtract", "power"}
    if name in unary:
        return [x], call(name, x)
    if name in binary:
        return [x, y], call(name, x, y)
    if name in ("max", "min", "mean", "sum", "prod"):
        return [x], call(name, x, axis=(1, 3), keepdims=True)
    v = var("v", 6, 10)
    cases: dict[str, tuple[list[Var], Expr]] = {
        "broadcast_to": ([var("b", 3, 1)], call("broadcast_to", var("b", 3, 1), shape=(2, 3, 4))),
        "cast": ([x], call("cast", x, dtype="int32")),
        "reinterpret": ([x], call("reinterpret", x, dtype="int32")),
        "nn.contrib_conv2d_NCHWc_int8": (
            [var("q", 1, 2, 6, 6, 4, dtype="uint8"), var("qw", 2, 2, 3, 3, 1, 8, 4, dtype="int8")],
            call("nn.contrib_conv2d_NCHWc_int8", var("q", 1, 2, 6, 6, 4, dtype="uint8"),
                 var("qw", 2, 2, 3, 3, 1, 8, 4, dtype="int8"), padding=(1, 1, 1, 1), pad_value=3)),
        "nn.lstm_sequence": (
            [var("xp", 3, 1, 2, 16), var("rp", 2, 1, 4, 16), var("h0", 2, 1, 4), var("c0", 2, 1, 4)],
            call("nn.lstm_sequence", var("xp", 3, 1, 2, 16), var("rp", 2, 1, 4, 16), var("h0", 2, 1, 4),
                 var("c0", 2, 1, 4), hidden=4, reverse=(False, True))),
        "nn.lstm_sequence_int8": (
            [var("xq", 3, 1, 2, 16), var("rq", 2, 1, 2, 16, 2, dtype="int8"), var("rs", 2, 16),
             var("rn", 2, 16, dtype="int32"), var("hq", 2, 1, 4), var("cq", 2, 1, 4)],
            call("nn.lstm_sequence_int8", var("xq", 3, 1, 2, 16), var("rq", 2, 1, 2, 16, 2, dtype="int8"),
                 var("rs", 2, 16), var("rn", 2, 16, dtype="int32"), var("hq", 2, 1, 4), var("cq", 2, 1, 4),
                 hidden=4, reverse=(False, True))),
        "min_max": ([x], call("min_max", x)),
        "nn.contrib_conv2d_NCHWc_bf16": (
            [var("bd", 1, 2, 6, 6, 4, dtype="bfloat16"), var("bw", 2, 2, 3, 3, 2, 4, 2, dtype="bfloat16")],
            call("nn.contrib_conv2d_NCHWc_bf16", var("bd", 1, 2, 6, 6, 4, dtype="bfloat16"),
                 var("bw", 2, 2, 3, 3, 2, 4, 2, dtype="bfloat16"), padding=(1, 1, 1, 1))),
        "clip": ([x], call("clip", x, a_min=0.5, a_max=1.2)),
        "collapse_sum_like": ([x, var("s", 3, 1, 8)], call("collapse_sum_like", x, var("s", 3, 1, 8))),
        "concatenate": ([x, y], call("concatenate", Tuple([x, y]), axis=1)),
        "expand_dims": ([v], call("expand_dims", v, axis=1, num_newaxis=2)),
        "layout_transform": ([x], call("layout_transform", x, src_layout="NCHW", dst_layout="NHWC")),
        "nn.winograd_input_transform": ([x], call("nn.winograd_input_transform", x, tile_size=2,
                                                  padding=(1, 1, 1, 1))),
        "nn.winograd_output_transform": ([var("m", 16, 16, 3)], call("nn.winograd_output_transform",
                                                                    var("m", 16, 16, 3), tile_size=2, out_height=7,
                                                                    out_width=7)),
        "nn.avg_pool2d": ([x], call("nn.avg_pool2d", x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1))),
        "nn.max_pool2d": ([x], call("nn.max_pool2d", x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1))),
        "nn.global_avg_pool2d": ([x], call("nn.global_avg_pool2d", x)),
        "nn.global_max_pool2d": ([x], call("nn.global_max_pool2d", x)),
        "nn.batch_matmul": ([var("a", 2, 16, 8), var("w", 2, 32, 8)],
                            call("nn.batch_matmul", var("a", 2, 16, 8), var("w", 2, 32, 8), transpose_b=True)),
        "nn.batch_norm": ([], TupleGetItem(call("nn.batch_norm", x, var("g", 3), var("be", 3), var("mu", 3),
                                                var("s2", 3)), 0)),
        "nn.dropout": ([], TupleGetItem(call("nn.dropout", x), 0)),
        "nn.bias_add": ([x, var("b", 3)], call("nn.bias_add", x, var("b", 3))),
        "nn.conv1d": ([var("d", 1, 4, 16), var("w", 8, 4, 3)],
                      call("nn.conv1d", var("d", 1, 4, 16), var("w", 8, 4, 3), padding=(1, 1))),
        "nn.conv1d_transpose": ([var("d", 1, 4, 9), var("w", 4, 6, 3)],
                                call("nn.conv1d_transpose", var("d", 1, 4, 9), var("w", 4, 6, 3), strides=(2,))),
        "nn.conv2d": ([x, var("w", 16, 3, 3, 3)], call("nn.conv2d", x, var("w", 16, 3, 3, 3), padding=(1, 1))),
        "nn.contrib_conv2d_NCHWc": ([var("d", 1, 2, 6, 6, 4), var("w", 2, 2, 3, 3, 4, 4)],
                                    call("nn.contrib_conv2d_NCHWc", var("d", 1, 2, 6, 6, 4), var("w", 2, 2, 3, 3, 4, 4),
                                         padding=(1, 1), data_layout="NCHW4c", kernel_layout="OIHW4i4o",
                                         out_layout="NCHW4c", channels=8, kernel_size=(3, 3))),
        "nn.conv2d_transpose": ([var("d", 1, 4, 5, 5), var("w", 4, 6, 3, 3)],
                                call("nn.conv2d_transpose", var("d", 1, 4, 5, 5), var("w", 4, 6, 3, 3),
                                     strides=(2, 2), padding=(1, 1))),
        "nn.conv3d": ([var("d", 1, 2, 5, 5, 5), var("w", 4, 2, 3, 3, 3)],
                      call("nn.conv3d", var("d", 1, 2, 5, 5, 5), var("w", 4, 2, 3, 3, 3), padding=(1, 1, 1))),
        "nn.dense": ([var("a", 16, 32), var("w", 64, 32)], call("nn.dense", var("a", 16, 32), var("w", 64, 32))),
        "nn.layer_norm": ([v, var("g", 10), var("be", 10)], call("nn.layer_norm", v, var("g", 10), var("be", 10))),
        "nn.leaky_relu": ([x], call("nn.leaky_relu", x, alpha=0.1)),
        "nn.log_softmax": ([v], call("nn.log_softmax", v)),
        "nn.softmax": ([v], call("nn.softmax", v, axis=1)),
        "nn.lrn": ([x], call("nn.lrn", x, size=3)),
        "nn.pad": ([x], call("nn.pad", x, Constant(np.array(0.5, "float32")),
                             pad_width=((0, 0), (0, 1), (2, 1), (1, 1)))),
        "nn.upsampling": ([x], call("nn.upsampling", x, scale_h=2.0, scale_w=2.0)),
        "image.resize1d": ([var("r", 1, 6, 10)], call("image.resize1d", var("r", 1, 6, 10), size=(7,), method="cubic")),
        "image.resize2d": ([x], call("image.resize2d", x, size=(5, 13), method="linear", antialias=True)),
        "image.resize3d": ([var("r", 1, 2, 3, 4, 5)],
                           call("image.resize3d", var("r", 1, 2, 3, 4, 5), size=(6, 2, 7), method="nearest_neighbor",
                                rounding_method="round_prefer_ceil")),
        "image.grid_sample": ([x, var("g", 2, 5, 7, 2)],
                              call("image.grid_sample", x, var("g", 2, 5, 7, 2), method="bicubic",
                                   padding_mode="reflection")),
        "nn.depth_to_space": ([var("d", 1, 12, 3, 5)], call("nn.depth_to_space", var("d", 1, 12, 3, 5), block_size=2,
                                                           mode="CRD")),
        "nn.space_to_depth": ([x], call("nn.space_to_depth", x, block_size=4)),
        "arange": ([], call("arange", start=2.5, stop=-3.0, step=-0.5)),
        "one_hot": ([var("i", 4, 5, dtype="int32")],
                    call("one_hot", var("i", 4, 5, dtype="int32"), Constant(np.array(2.0, "float32")),
                         Constant(np.array(-1.0, "float32")), depth=3, axis=1)),
        "trilu": ([x], call("trilu", x, k=1, upper=False)),
        "cumsum": ([v], call("cumsum", v, axis=1, exclusive=True)),
        "cumprod": ([v], call("cumprod", v, axis=1, reverse=True)),
        **{op: ([var("p", 6, 10, dtype="int32"), var("q", 10, dtype="int32")],
                call(op, var("p", 6, 10, dtype="int32"), var("q", 10, dtype="int32")))
           for op in ("bitwise_and", "bitwise_or", "bitwise_xor")},
        "signal.window": ([], call("signal.window", kind="hamming", size=12)),
        "signal.dft": ([var("s", 3, 10, 2)], call("signal.dft", var("s", 3, 10, 2), axis=1, length=10)),
        "reshape": ([x], call("reshape", x, newshape=(6, -1))),
        "split": ([v], call("split", v, indices_or_sections=2, axis=1)),
        "squeeze": ([var("q", 3, 1, 4)], call("squeeze", var("q", 3, 1, 4), axis=(1,))),
        "stack": ([v, var("u", 6, 10)], call("stack", Tuple([v, var("u", 6, 10)]), axis=1)),
        "strided_slice": ([x], call("strided_slice", x, begin=(0, 1, 1, 0), end=(2, 3, 8, 8), strides=(1, 1, 2, 3))),
        "take": ([v, var("i", 4, dtype="int32")], call("take", v, var("i", 4, dtype="int32"), axis=0)),
        "transpose": ([x], call("transpose", x, axes=(0, 2, 3, 1))),
        "where": ([var("c", 3, 8, 8, dtype="bool"), x, y], call("where", var("c", 3, 8, 8, dtype="bool"), x, y)),
    }
    _, body = cases[name]
    # the cases build fresh Vars for the list and the body: the body's free variables are the parameters
    return list(free_vars(body)), body


OP_NAMES = sorted(o.name for o in all_ops())
# Operators whose math comes from the C library: NVPTX has none, and says so by name.
CPU_ONLY_OPS = {"sin", "cos", "tan", "asin", "acos", "atan"}
# Operators built on those: the C library function they use.
CPU_ONLY_USERS = {"signal.window": "cos", "signal.dft": "cos"}
# Operators lowered by a hand-written CPU loop kernel (`relay_tune.kernel.recurrent.FIXED_KERNELS`) with no
# tensor-expression compute: no GPU kernel (min_max has both: the GPU builds its compute).
CPU_LOOP_KERNELS = {name for name in FIXED_KERNELS if get_op(name).compute is None}


def test_the_operator_table_covers_every_registered_operator() -> None:
    for name in OP_NAMES:
        _op_case(name)


@pytest.mark.parametrize("name", OP_NAMES)
def test_every_operator_runs_correctly_with_its_default_gpu_schedule(name: str) -> None:
    params, body = _op_case(name)
    func, mod = primitive(params, body)
    if name in CPU_ONLY_OPS or name in CPU_ONLY_USERS:
        with pytest.raises(CompileError, match=f"{CPU_ONLY_USERS.get(name, name)} is not available on NVPTX"):
            emulate(func, mod, re.sub(r"\W", "_", name))
        return
    if name in CPU_LOOP_KERNELS:
        with pytest.raises(UnsupportedError, match=f"operator {name} has no tensor-expression compute"):
            emulate(func, mod, re.sub(r"\W", "_", name))
        return
    emulate(func, mod, re.sub(r"\W", "_", name))


@needs_ptxas
def test_ptxas_accepts_every_operator() -> None:
    funcs = []
    for name in sorted(set(OP_NAMES) - CPU_ONLY_OPS - set(CPU_ONLY_USERS) - CPU_LOOP_KERNELS):
        params, body = _op_case(name)
        func, _ = primitive(params, body)
        primfunc, _ = lower_gpu(func, re.sub(r"\W", "_", name))
        funcs.append(primfunc)
    module = build_ptx(funcs, CUDA)
    report = assemble_ptx(module.ptx, "sm_90")
    assert set(report.kernels) == set(module.kernel_names)
    for res in report.kernels.values():
        assert 0 < res.registers <= 255 and res.spill_bytes == 0


# ---------------------------------------------------------------------------------------------------
# schedules and spaces
# ---------------------------------------------------------------------------------------------------


def _dense_func(m: int, n: int, k: int) -> tuple[Function, IRModule]:
    a, w, b = var("a", m, k), var("w", n, k), var("b", n)
    return primitive([a, w, b], call("nn.relu", call("nn.bias_add", call("nn.dense", a, w), b)))


def test_dense_default_is_a_shared_memory_tiling_with_vector_loads() -> None:
    func, mod = _dense_func(64, 128, 64)
    prim = primitive_compute(func)
    params = default_params(prim)
    assert family_of(prim) == "matmul"
    assert isinstance(params, MatmulParams) and params.shared and params.vector == 4
    ptx = emulate(func, mod, "dense")
    ops = ptx_ops(ptx)
    assert "ld.global.nc.v4.b32" in ops and "ld.shared.v4.b32" in ops and "bar.sync" in ops


def test_dense_with_awkward_shapes_uses_the_direct_variant() -> None:
    func, mod = _dense_func(7, 13, 9)
    params = default_params(primitive_compute(func))
    assert isinstance(params, MatmulParams) and not params.shared
    emulate(func, mod, "dense_direct")


def test_softmax_stages_are_separate_kernels() -> None:
    v = var("v", 4, 33)
    func, mod = primitive([v], call("nn.softmax", v))
    primfunc, _ = lower_gpu(func, "softmax")
    _, plan = plan_kernels(primfunc)
    assert len(plan.kernels) >= 2 and plan.workspaces
    emulate(func, mod, "softmax", FlatParams(threads=32, work=2))


def test_gpu_space_constraints_reject_impossible_launches() -> None:
    func, _ = _dense_func(256, 256, 64)
    prim = primitive_compute(func)
    space = gpu_space(prim, "sm_90")
    good = default_config(prim, "sm_90")
    assert space.is_valid(good)
    assert config_to_params(prim, good) == default_params(prim)
    too_many = good.replace(tile_m=(1, 64, 4), tile_n=(4, 32, 2))  # 2048 threads
    assert not space.is_valid(too_many)
    small = Config({**good.to_dict(), "tile_k": 64})
    old_gpu = gpu_space(prim, "sm_50")
    assert old_gpu.is_valid(small)  # (64+64) rows * 64 * 4 bytes = 32 KiB of shared memory: within sm_50's 48 KiB
    # (1+256) rows * 64 * 4 bytes = 64.25 KiB: fits sm_90's shared memory, not sm_50's
    wide = Config({**good.to_dict(), "tile_m": (256, 1, 1), "tile_n": (1, 32, 8), "tile_k": 64, "vector": 1})
    assert space.is_valid(wide)
    assert not old_gpu.is_valid(wide)
    rng = np.random.default_rng(0)
    for _ in range(20):
        config = space.sample(rng)
        p = config_to_params(prim, config)
        assert isinstance(p, MatmulParams) and p.threads <= 1024


def test_sampled_gpu_configs_build_and_run() -> None:
    func, mod = _dense_func(32, 64, 32)
    prim = primitive_compute(func)
    space = gpu_space(prim)
    rng = np.random.default_rng(1)
    for i in range(3):
        emulate(func, mod, f"dense_cfg{i}", config_to_params(prim, space.sample(rng)))


# ---------------------------------------------------------------------------------------------------
# zoo models at their real size: every fused function compiles to PTX that ptxas accepts
# ---------------------------------------------------------------------------------------------------

ZOO_MODELS = ["resnet50", "mobilenet_v2", "bert_layer"]


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_model_compiles_to_ptx(name: str) -> None:
    from relay_tune.passes import optimize
    from relay_tune.passes.extract_tasks import extract_tasks
    from relay_tune.testing import zoo

    mod = zoo.full(name)
    fused = optimize(mod)
    funcs = []
    for i, spec in enumerate(extract_tasks(fused)):
        primfunc, _ = lower_gpu(spec.func, f"k{i}")
        funcs.append(primfunc)
    assert funcs
    module = build_ptx(funcs, CUDA)
    assert len(module.functions) == len(funcs)
    if PTXAS is not None:
        report = assemble_ptx(module.ptx, "sm_90")
        assert set(report.kernels) == set(module.kernel_names)
        assert all(r.registers <= 255 for r in report.kernels.values())
        for kernel in (k for f in module.functions for k in f.kernels):
            nvptx.check_launch_resources(kernel, report[kernel.name], "sm_90")
