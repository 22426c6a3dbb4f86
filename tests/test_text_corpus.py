"""Every program of the Relay corpus parses, and printing then re-parsing gives the same program."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, post_order, structural_equal
from relay_tune.text import (
    load_constants_sidecar,
    load_module,
    parse_expr,
    parse_module,
    parse_module_with_annotations,
    print_expr,
    print_module,
)
from relay_tune.text.loader import sidecar_path

MODULE_FILES = [
    "tvm_aot_fused_nchwc.relay",
    "tvm_aot_int8_conv.relay",
    "tvm_autoquant_bias_conv.relay",
    "tvm_autoquant_two_conv.relay",
    "tvm_composite_partition.relay",
    "tvm_dfpattern_nhwc_conv.relay",
    "tvm_dfpattern_partitioned.relay",
    "tvm_dyn_any_dims.relay",
    "tvm_eta_expand_fn_type.relay",
    "tvm_lower_te_primitive.relay",
    "tvm_menagerie_batch_norm_extract.relay",
    "tvm_menagerie_gpt2.relay",
    "tvm_menagerie_gpt2_16_for_cutlass_extract.relay",
    "tvm_menagerie_gpt2_extract.relay",
    "tvm_menagerie_mnist.relay",
    "tvm_menagerie_mobilenet.relay",
    "tvm_menagerie_resnet50.relay",
    "tvm_menagerie_resnet50_16.relay",
    "tvm_menagerie_resnext50_32x4d.relay",
    "tvm_op_level1_take_slice.relay",
    "tvm_target_hooks_infix.relay",
    "tvm_type_infer_polymorphic.relay",
]
EXPRESSION_FILES = ["tvm_expr_grad_let_tuple.relay"]
# Files deliberately not covered, with the reason. Every corpus file is currently in scope.
OUT_OF_SCOPE: dict[str, str] = {}
# Loading these synthesises hundreds of megabytes of random weights; the cheap-constant round trip covers them.
SLOW_TO_LOAD = {"tvm_menagerie_gpt2.relay"}


def cheap_constants(relay_file: Path) -> list[np.ndarray] | None:
    """Constants with the sidecar's shapes/dtypes as read-only broadcast views (no memory, no copying)."""
    sidecar = sidecar_path(relay_file)
    if not sidecar.is_file():
        return None
    entries = json.loads(sidecar.read_text())["relay.Constant"]
    return [np.broadcast_to(np.array(0.5).astype(e["dtype"]), tuple(e["shape"])) for e in entries]


def test_every_corpus_file_is_covered(corpus_dir: Path) -> None:
    present = {p.name for p in corpus_dir.glob("*.relay")}
    assert present == set(MODULE_FILES) | set(EXPRESSION_FILES) | set(OUT_OF_SCOPE)


@pytest.mark.parametrize("name", MODULE_FILES)
def test_module_round_trip(corpus_dir: Path, name: str) -> None:
    path = corpus_dir / name
    constants = cheap_constants(path)
    mod = parse_module(path.read_text(), str(path), constants)
    assert isinstance(mod, IRModule) and "main" in mod
    printed_constants: list[np.ndarray] = []
    text = print_module(mod, constants_out=printed_constants)
    again = parse_module(text, "printed", printed_constants)
    assert again == mod
    assert print_module(again, constants_out=[]) == text


@pytest.mark.parametrize("name", EXPRESSION_FILES)
def test_expression_round_trip(corpus_dir: Path, name: str) -> None:
    expr = parse_expr((corpus_dir / name).read_text(), name)
    assert isinstance(expr, Function) and len(expr.params) == 4
    text = print_expr(expr)
    assert structural_equal(parse_expr(text), expr, map_free_vars=True)
    assert print_expr(parse_expr(text)) == text


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_LOAD else n
        for n in MODULE_FILES
        if n.startswith("tvm_menagerie")
    ],
)
def test_load_module_synthesises_sidecar_constants(corpus_dir: Path, name: str) -> None:
    path = corpus_dir / name
    mod = load_module(path, seed=7)
    expected = json.loads(sidecar_path(path).read_text())["relay.Constant"]
    constants = [n for n in all_nodes(mod) if isinstance(n, Constant) and n.data.ndim > 0]
    found = {(c.data.shape, str(c.data.dtype)) for c in constants}
    assert found == {(tuple(e["shape"]), e["dtype"]) for e in expected}
    # the same program as with any other values of those shapes
    assert len(constants) == len(expected)
    assert all(np.isfinite(c.data).all() for c in constants if c.data.dtype.kind == "f")
    assert print_module(mod) == print_module(parse_module(path.read_text(), str(path), cheap_constants(path)))


def test_fused_dump_annotations(corpus_dir: Path) -> None:
    path = corpus_dir / "tvm_aot_fused_nchwc.relay"
    text = path.read_text()
    mod, annotations = parse_module_with_annotations(text, str(path))
    assert mod == parse_module(text, str(path))
    assert len(annotations) == text.count("/* ty=") == 8
    for expr, ty in annotations:
        assert isinstance(expr, Call) and isinstance(ty, TensorType) and ty.dtype == "float32"
    final_call, final_type = annotations[-1]
    assert final_call is mod["main"].body and final_type == TensorType((1, 4, 4, 4), "float32")
    conv = [e for e, _ in annotations if isinstance(e, Call) and e.op_name == "nn.contrib_conv2d_NCHWc"]
    assert len(conv) == 1 and conv[0].attrs["data_layout"] == "NCHW4c"


def test_function_attributes_from_dumps(corpus_dir: Path) -> None:
    fused = parse_module((corpus_dir / "tvm_aot_fused_nchwc.relay").read_text())
    assert dict(fused["main"].attrs) == {"src_layout": "OIHW", "dst_layout": "OIHW4i4o"}
    hooks = parse_module((corpus_dir / "tvm_target_hooks_infix.relay").read_text())
    target = hooks["replace_add_with_subtract"]
    assert target.attrs["Compiler"] == "example_target_hook" and target.attrs["Inline"] == 1
    body = hooks["main"].body
    assert isinstance(body, Call) and body.op_name == "multiply"


def test_resnet50_parses_well_under_a_second(corpus_dir: Path) -> None:
    path = corpus_dir / "tvm_menagerie_resnet50.relay"
    constants = load_constants_sidecar(sidecar_path(path))
    text = path.read_text()
    start = time.perf_counter()
    mod = parse_module(text, str(path), constants)
    elapsed = time.perf_counter() - start
    print(f"parse tvm_menagerie_resnet50.relay with {len(constants)} constants: {elapsed * 1000:.1f} ms")
    assert elapsed < 1.0
    calls = [n for n in all_nodes(mod) if isinstance(n, Call)]
    operator_uses = re.findall(r"(?<![@\w.])[a-z_][a-z0-9_.]*\(", text)
    assert len(calls) == len(operator_uses) == 175


def all_nodes(mod: IRModule) -> list[Expr]:
    return [n for f in mod.values() for n in post_order(f)]
