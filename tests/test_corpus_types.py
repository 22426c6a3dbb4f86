"""Whole programs end to end: every program of the Relay corpus (when it is beside the checkout) and of the model
zoo type-checks, agrees with its own type annotations, and runs in the reference interpreter (with synthesized
constants) to finite outputs of the inferred types. Programs written here check what the corpus's small programs
check, so that a clone of the project alone runs every test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from model_sources import (
    CORPUS_EXPRESSIONS,
    CORPUS_MODULES,
    FUSED_ZOO_MODEL,
    INLINE_EXPRESSION,
    ZOO_FILES,
    ZOO_PREFIX,
    corpus_case,
    corpus_cases,
    every_corpus_file,
    module_files,
    zoo_module,
)

from relay_tune.interpreter import Interpreter, evaluate
from relay_tune.ir import (
    ANY,
    Call,
    Constant,
    Expr,
    Function,
    FuncType,
    IRModule,
    TensorType,
    TupleType,
    Type,
    post_order,
    rewrite,
)
from relay_tune.ir.expr import Op
from relay_tune.testing import zoo
from relay_tune.text import parse_expr, parse_module, parse_module_with_annotations
from relay_tune.text.loader import load_constants_sidecar, sidecar_path
from relay_tune.type_infer import infer_expr, infer_types

# A bare expression (TVM `parse_expr`), not a module.
EXPRESSIONS = [*every_corpus_file(CORPUS_EXPRESSIONS), "inline"]

# Signatures that pin the whole-model results (inputs -> outputs) down exactly.
EXPECTED_MAIN = {
    "tvm_menagerie_mnist.relay": ((TensorType((1, 1, 28, 28)),), TensorType((1, 10))),
    "tvm_menagerie_resnet50.relay": ((TensorType((1, 3, 224, 224)),), TensorType((1, 1000))),
    "tvm_menagerie_mobilenet.relay": ((TensorType((1, 3, 224, 224)),), TensorType((1, 1000))),
    "tvm_menagerie_resnext50_32x4d.relay": ((TensorType((1, 64, 56, 56)),), TensorType((1, 2048, 7, 7))),
    "tvm_aot_int8_conv.relay": (
        (TensorType((1, 3, 64, 64), "uint8"), TensorType((3, 3, 5, 5), "int8")), TensorType((1, 3, 60, 60), "int32")
    ),
    "tvm_dfpattern_partitioned.relay": (
        (TensorType((16, 16, 32, 32), "float16"), TensorType((32, 16, 3, 3), "float16"), TensorType((32,))),
        TensorType((16, 32, 32, 32)),
    ),
}

# Integer inputs are indices into tables of this many rows.
INDEX_RANGE = {"tvm_menagerie_gpt2.relay": 50257, "tvm_op_level1_take_slice.relay": 2016}
DYNAMIC_DIM = 5


def read_module(path: Path) -> tuple[IRModule, list[tuple[Expr, Type]]]:
    sidecar = sidecar_path(path)
    constants = load_constants_sidecar(sidecar) if sidecar.is_file() else None
    return parse_module_with_annotations(path.read_text(), path.name, constants)


def read_expression(program: Callable[[str], Path], name: str) -> Expr:
    return parse_expr(INLINE_EXPRESSION if name == "inline" else program(name).read_text(), name)


def _assert_complete(root: Expr) -> None:
    for node in post_order(root):
        if isinstance(node, Op):
            continue
        assert node.has_type(), f"untyped node {node!r}"
        if isinstance(node, Function):
            ty = node.checked_type
            assert isinstance(ty, FuncType)
            # Every function now carries its signature, and it is exactly what inference found.
            assert node.ret_type == ty.ret_type == node.body.checked_type
            assert [p.type_annotation for p in node.params] == list(ty.arg_types)


@pytest.mark.parametrize("name", module_files())
def test_module_types_agree_with_annotations(program: Callable[[str], Path], name: str) -> None:
    mod, annotations = read_module(program(name))
    declared_returns = {fname: f.ret_type for fname, f in mod.items()}
    typed = infer_types(mod)
    for fname, func in typed.items():
        _assert_complete(func)
        if declared_returns[fname] is not None:
            assert func.body.checked_type == declared_returns[fname]
    for expr, ty in annotations:
        assert expr.checked_type == ty, f"{expr!r}: inferred {expr.checked_type}, annotated {ty}"
    if name in EXPECTED_MAIN:
        params, ret = EXPECTED_MAIN[name]
        assert typed.main.checked_type == FuncType(params, ret)
    if name.startswith(ZOO_PREFIX):
        assert annotations  # zoo files are printed with their types
        assert typed.main.checked_type == zoo_module(name).main.checked_type


@pytest.mark.parametrize(
    "name", [*corpus_cases("tvm_aot_fused_nchwc.relay"), f"{ZOO_PREFIX}{FUSED_ZOO_MODEL}_fused.relay"]
)
def test_fused_dump_has_type_comments_and_they_all_match(program: Callable[[str], Path], name: str) -> None:
    _, annotations = read_module(program(name))
    assert len(annotations) >= 8  # the agreement itself is checked above; this guards the premise


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_expression_file_types(program: Callable[[str], Path], name: str) -> None:
    typed = infer_expr(read_expression(program, name))
    assert isinstance(typed, Function)
    _assert_complete(typed)
    one = TensorType((1,))
    assert typed.checked_type == FuncType((one,) * 4, TupleType((one, TupleType((one,) * 4))))


# ------------------------------------------------------------------------------------------------
# Running the corpus
# ------------------------------------------------------------------------------------------------


def sane_batch_norm_statistics(mod: IRModule) -> IRModule:
    """Random constants make some moving variances negative (NaN after sqrt); use |var| + 0.5."""

    def fix(_orig: Expr, new: Expr) -> Expr:
        if isinstance(new, Call) and isinstance(new.op, Op) and new.op.name == "nn.batch_norm":
            var = new.args[4]
            if isinstance(var, Constant):
                positive = Constant((np.abs(var.data.astype(np.float32)) + 0.5).astype(var.data.dtype))
                return Call(new.op, (*new.args[:4], positive), new.attrs, new.span)
        return new

    return mod.map_functions(lambda _name, f: rewrite(f, fix))  # type: ignore[return-value]


def random_value(ty: Type, rng: np.random.Generator, index_range: int) -> object:
    if isinstance(ty, TupleType):
        return tuple(random_value(f, rng, index_range) for f in ty.fields)
    assert isinstance(ty, TensorType)
    shape = tuple(DYNAMIC_DIM if d is ANY else d for d in ty.shape)
    dtype = np.dtype(ty.dtype)
    if dtype.kind in "iu":
        return rng.integers(0, index_range, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.standard_normal(shape).astype(dtype)


def assert_matches(value: object, ty: Type) -> None:
    if isinstance(ty, TupleType):
        assert isinstance(value, tuple) and len(value) == len(ty.fields)
        for v, t in zip(value, ty.fields):
            assert_matches(v, t)
        return
    if isinstance(ty, FuncType):
        return
    assert isinstance(ty, TensorType) and isinstance(value, np.ndarray)
    assert str(value.dtype) == ty.dtype
    assert value.ndim == ty.ndim and all(d is ANY or d == s for d, s in zip(ty.shape, value.shape))
    if value.dtype.kind == "f":
        assert np.isfinite(value).all()


def run_module(mod: IRModule, name: str, seed: int = 0) -> tuple[Interpreter, list[object], object]:
    interp = Interpreter(sane_batch_norm_statistics(mod))
    rng = np.random.default_rng(seed)
    inputs = [random_value(p.checked_type, rng, INDEX_RANGE.get(name, 4)) for p in interp.mod.main.params]
    out = interp.run(inputs)
    assert_matches(out, interp.mod.main.body.checked_type)
    return interp, inputs, out


def run_program(path: Path, seed: int = 0) -> tuple[Interpreter, list[object], object]:
    mod, _ = read_module(path)
    return run_module(mod, path.name, seed)


def run_text(text: str, seed: int = 0) -> tuple[Interpreter, list[object], object]:
    return run_module(parse_module(text), "inline", seed)


WHOLE_MODELS = [
    "tvm_menagerie_mnist.relay",
    "tvm_menagerie_resnet50.relay",
    "tvm_menagerie_mobilenet.relay",
    "tvm_menagerie_resnext50_32x4d.relay",
    "tvm_menagerie_resnet50_16.relay",
    "tvm_menagerie_gpt2_extract.relay",
    "tvm_menagerie_gpt2_16_for_cutlass_extract.relay",
    "tvm_menagerie_batch_norm_extract.relay",
]
SMALL_MODULES = [n for n in CORPUS_MODULES if n not in WHOLE_MODELS and n != "tvm_menagerie_gpt2.relay"]


@pytest.mark.parametrize("name", [*corpus_cases(*WHOLE_MODELS), *every_corpus_file(SMALL_MODULES), *ZOO_FILES])
def test_interpreter_runs_program(program: Callable[[str], Path], name: str) -> None:
    run_program(program(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*corpus_cases("tvm_menagerie_gpt2.relay"), "zoo:bert_layer"])
def test_interpreter_runs_a_whole_transformer(program: Callable[[str], Path], name: str) -> None:
    if name.startswith("zoo:"):  # one BERT-base layer at its real size
        _, _, out = run_module(zoo.full("bert_layer"), name)
        assert isinstance(out, np.ndarray) and out.shape == (1, 128, 768)
        return
    _, _, out = run_program(program(name))
    assert isinstance(out, tuple) and len(out) == 13
    assert out[0].shape == (1, 50, 32, 768)


@pytest.mark.parametrize("name", [*corpus_cases("tvm_menagerie_mnist.relay"), f"{ZOO_PREFIX}resnet18.relay"])
def test_model_output_depends_on_the_input(program: Callable[[str], Path], name: str) -> None:
    _, _, first = run_program(program(name), seed=1)
    _, _, second = run_program(program(name), seed=2)
    assert not np.allclose(first, second)


# --- cross-checks between corpus programs and independent formulations ---------------------------


PLAIN_CONV = """#[version = "0.0.5"]
def @main(%data: Tensor[(1, 4, 4, 4), float32], %weight: Tensor[(4, 4, 3, 3), float32]) {
  nn.conv2d(%data, %weight, padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3])
}
"""
# The same convolution through blocked layouts, written here: NCHW -> NCHW2c, OIHW -> OIHW2i2o, back to NCHW.
BLOCKED_CONV = """#[version = "0.0.5"]
def @main(%data: Tensor[(1, 4, 4, 4), float32], %weight: Tensor[(4, 4, 3, 3), float32]) {
  %0 = layout_transform(%data, src_layout="NCHW", dst_layout="NCHW2c");
  %1 = layout_transform(%weight, src_layout="OIHW", dst_layout="OIHW2i2o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3], data_layout="NCHW2c",
    kernel_layout="OIHW2i2o", out_layout="NCHW2c");
  layout_transform(%2, src_layout="NCHW2c", dst_layout="NCHW")
}
"""


@pytest.mark.parametrize("source", [*corpus_cases("tvm_aot_fused_nchwc.relay"), "inline"])
def test_nchwc_pipeline_equals_plain_conv2d(program: Callable[[str], Path], source: str) -> None:
    if source == "inline":
        _, (data, weight), out = run_text(BLOCKED_CONV)
    else:
        _, (data, weight), out = run_program(program(source))
    np.testing.assert_allclose(out, evaluate(parse_module(PLAIN_CONV), [data, weight]), rtol=1e-5, atol=1e-5)


# A partitioned program written here: a composite function (as pattern partitioning makes them) inside a function
# for an external compiler, against the same operators inline.
PARTITIONED = """#[version = "0.0.5"]
def @offloaded(%a: Tensor[(1, 4, 6, 6), float32], %b: Tensor[(6, 4, 3, 3), float32], %c: Tensor[(6), float32],
    Compiler="example_codegen", Primitive=1, Inline=1, global_symbol="offloaded_0") -> Tensor[(1, 6, 6, 6), float32] {
  %0 = fn (%x: Tensor[(1, 4, 6, 6), float32], %w: Tensor[(6, 4, 3, 3), float32], %bias: Tensor[(6), float32],
      PartitionedFromPattern="nn.conv2d_nn.bias_add_nn.relu_", Composite="example.conv2d_bias_relu") {
    %1 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=6, kernel_size=[3, 3]);
    nn.relu(nn.bias_add(%1, %bias))
  };
  %0(%a, %b, %c)
}
def @main(%data: Tensor[(1, 4, 6, 6), float32], %weight: Tensor[(6, 4, 3, 3), float32],
    %bias: Tensor[(6), float32]) {
  @offloaded(%data, %weight, %bias)
}
"""
UNPARTITIONED = """#[version = "0.0.5"]
def @main(%data: Tensor[(1, 4, 6, 6), float32], %weight: Tensor[(6, 4, 3, 3), float32],
    %bias: Tensor[(6), float32]) {
  %0 = nn.conv2d(%data, %weight, padding=[1, 1, 1, 1], channels=6, kernel_size=[3, 3]);
  nn.relu(nn.bias_add(%0, %bias))
}
"""


@pytest.mark.parametrize("source", [*corpus_cases("tvm_dfpattern_partitioned.relay"), "inline"])
def test_partitioned_pattern_equals_unpartitioned_program(program: Callable[[str], Path], source: str) -> None:
    if source == "inline":
        _, inputs, partitioned = run_text(PARTITIONED)
        mod = parse_module(UNPARTITIONED)
    else:
        _, inputs, partitioned = run_program(program(source))
        mod, _ = read_module(program("tvm_dfpattern_nhwc_conv.relay"))
    np.testing.assert_allclose(evaluate(mod, inputs), partitioned, rtol=1e-5, atol=1e-5)


# Small programs written here, each checking one feature of the language (as the corpus's small programs do).
POLYMORPHIC = """#[version = "0.0.5"]
def @pick[A, B](%first: A, %second: B) -> A { %first }
def @main(%f: Tensor[(2, 3), float32], %i: int32) -> Tensor[(2, 3), float32] { @pick(%f, %i) }
"""
ANY_DIMS = """#[version = "0.0.5"]
def @main(%x: Tensor[(?, 3), float32]) -> Tensor[(?, 3), float32] { negative(copy(%x)) }
"""
GLOBAL_CALLS = """#[version = "0.0.5"]
def @double(%v: Tensor[(5), float32], Inline=1) -> Tensor[(5), float32] { add(%v, %v) }
def @main(%x: Tensor[(5), float32], %y: Tensor[(5), float32]) {
  %0 = fn (%p: Tensor[(5), float32], Composite="example.abs_relu") { nn.relu(abs(%p)) };
  subtract(@double(%0(%x)), %y)
}
"""


@pytest.mark.parametrize("source", [*corpus_case("corpus", "tvm_lower_te_primitive.relay"), "inline"])
def test_small_programs_compute_what_they_say(program: Callable[[str], Path], source: str) -> None:
    if source == "inline":
        _, (f, _i), out = run_text(POLYMORPHIC)
        np.testing.assert_array_equal(out, f)
        _, (x,), out = run_text(ANY_DIMS)
        assert out.shape == (DYNAMIC_DIM, 3)
        np.testing.assert_array_equal(out, -x)
        _, (x, y), out = run_text(GLOBAL_CALLS)
        np.testing.assert_allclose(out, 2 * np.abs(x) - y, rtol=1e-6)
        return
    _, (a,), out = run_program(program("tvm_lower_te_primitive.relay"))
    np.testing.assert_allclose(out, a + a)
    _, (x, y), out = run_program(program("tvm_target_hooks_infix.relay"))
    np.testing.assert_allclose(out, (x + y) * 2, rtol=1e-6)
    _, (x,), out = run_program(program("tvm_composite_partition.relay"))
    relu = lambda v: np.maximum(v, 0)
    np.testing.assert_allclose(out, np.abs(relu(relu(relu(x)) + relu(np.abs(x)))), rtol=1e-6)
    _, (f,), out = run_program(program("tvm_type_infer_polymorphic.relay"))
    np.testing.assert_array_equal(out, f)
    _, (x,), out = run_program(program("tvm_dyn_any_dims.relay"))
    assert out.shape == (DYNAMIC_DIM, 3)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_expression_file_computes_its_gradient(program: Callable[[str], Path], name: str) -> None:
    expr = read_expression(program, name)
    x, y, z, w = (np.array([v], dtype="float32") for v in (1.5, -2.0, 0.25, 3.0))
    value, (dx, dy, dz, dw) = evaluate(IRModule({"main": infer_expr(expr)}), [x, y, z, w])  # type: ignore[misc]
    np.testing.assert_allclose(value, (x + y) * (z + w))
    np.testing.assert_allclose(dx, z + w)
    np.testing.assert_allclose(dy, z + w)
    np.testing.assert_allclose(dz, x + y)
    np.testing.assert_allclose(dw, x + y)
