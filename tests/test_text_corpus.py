"""Every program of the Relay corpus (when it is beside the checkout) and of the model zoo parses, and printing
then re-parsing gives the same program."""

from __future__ import annotations

import json
import re
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

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, post_order, structural_equal
from relay_tune.testing import zoo
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

# Loading these synthesises hundreds of megabytes of random weights; the cheap-constant round trip covers them.
SLOW_TO_LOAD = {"tvm_menagerie_gpt2.relay"}
FUSED_ZOO_FILE = f"{ZOO_PREFIX}{FUSED_ZOO_MODEL}_fused.relay"


def cheap_constants(relay_file: Path) -> list[np.ndarray] | None:
    """Constants with the sidecar's shapes/dtypes as read-only broadcast views (no memory, no copying)."""
    sidecar = sidecar_path(relay_file)
    if not sidecar.is_file():
        return None
    entries = json.loads(sidecar.read_text())["relay.Constant"]
    return [np.broadcast_to(np.array(0.5).astype(e["dtype"]), tuple(e["shape"])) for e in entries]


@pytest.mark.parametrize("name", module_files())
def test_module_round_trip(program: Callable[[str], Path], name: str) -> None:
    path = program(name)
    constants = cheap_constants(path)
    mod = parse_module(path.read_text(), str(path), constants)
    assert isinstance(mod, IRModule) and "main" in mod
    printed_constants: list[np.ndarray] = []
    text = print_module(mod, constants_out=printed_constants)
    again = parse_module(text, "printed", printed_constants)
    assert again == mod
    assert print_module(again, constants_out=[]) == text


@pytest.mark.parametrize("name", [*every_corpus_file(CORPUS_EXPRESSIONS), "inline"])
def test_expression_round_trip(program: Callable[[str], Path], name: str) -> None:
    expr = parse_expr(INLINE_EXPRESSION if name == "inline" else program(name).read_text(), name)
    assert isinstance(expr, Function) and len(expr.params) == 4
    text = print_expr(expr)
    assert structural_equal(parse_expr(text), expr, map_free_vars=True)
    assert print_expr(parse_expr(text)) == text


@pytest.mark.parametrize(
    "name",
    every_corpus_file([
        pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_LOAD else n
        for n in CORPUS_MODULES
        if n.startswith("tvm_menagerie")
    ]) + ZOO_FILES,
)
def test_load_module_synthesises_sidecar_constants(program: Callable[[str], Path], name: str) -> None:
    path = program(name)
    mod = load_module(path, consts=sidecar_path(path), seed=7)
    expected = json.loads(sidecar_path(path).read_text())["relay.Constant"]
    constants = [n for n in all_nodes(mod) if isinstance(n, Constant) and n.data.ndim > 0]
    found = {(c.data.shape, str(c.data.dtype)) for c in constants}
    assert found == {(tuple(e["shape"]), e["dtype"]) for e in expected}
    # the same program as with any other values of those shapes
    assert len(constants) == len(expected)
    assert all(np.isfinite(c.data).all() for c in constants if c.data.dtype.kind == "f")
    assert print_module(mod) == print_module(parse_module(path.read_text(), str(path), cheap_constants(path)))


@pytest.mark.parametrize("name", ZOO_FILES)
def test_zoo_file_loads_back_exactly(program: Callable[[str], Path], name: str) -> None:
    """With its parameter file beside it, a printed zoo model loads back as the very module that was printed."""
    assert load_module(program(name)) == zoo_module(name)


@pytest.mark.parametrize("name", [*corpus_cases("tvm_aot_fused_nchwc.relay"), FUSED_ZOO_FILE])
def test_fused_dump_annotations(program: Callable[[str], Path], name: str) -> None:
    path = program(name)
    text = path.read_text()
    constants = cheap_constants(path)
    mod, annotations = parse_module_with_annotations(text, str(path), constants)
    assert mod == parse_module(text, str(path), constants)
    assert len(annotations) == text.count("/* ty=") > 0
    final_call, final_type = annotations[-1]
    assert final_call is mod["main"].body and final_type == mod["main"].ret_type
    if name.startswith(ZOO_PREFIX):
        # every operator call sits in a primitive function, and every call of an operator has its type comment
        primitives = [n for n in all_nodes(mod) if isinstance(n, Function) and n.is_primitive]
        operator_calls = [n for n in all_nodes(mod) if isinstance(n, Call) and n.op_name is not None]
        assert primitives and all(any(e is c for e, _ in annotations) for c in operator_calls)
        return
    assert len(annotations) == 8
    for expr, ty in annotations:
        assert isinstance(expr, Call) and isinstance(ty, TensorType) and ty.dtype == "float32"
    assert final_type == TensorType((1, 4, 4, 4), "float32")
    conv = [e for e, _ in annotations if isinstance(e, Call) and e.op_name == "nn.contrib_conv2d_NCHWc"]
    assert len(conv) == 1 and conv[0].attrs["data_layout"] == "NCHW4c"


# Function attributes on a global function and on a function literal, written for this test.
ATTRIBUTES_PROGRAM = """#[version = "0.0.5"]
def @offloaded(%a: Tensor[(4), float32], %b: Tensor[(4), float32], Compiler="example_codegen", Inline=1,
    global_symbol="offloaded_0") -> Tensor[(4), float32] {
  %0 = fn (%p: Tensor[(4), float32], Composite="example.negate") { negative(%p) };
  %0(subtract(%a, %b))
}
def @main(%x: Tensor[(4), float32], %y: Tensor[(4), float32]) -> Tensor[(4), float32] {
  multiply(@offloaded(%x, %y), 2f)
}
"""


@pytest.mark.parametrize("source", [*corpus_case("corpus", "tvm_target_hooks_infix.relay"), "inline"])
def test_function_attributes_from_dumps(program: Callable[[str], Path], source: str) -> None:
    if source == "inline":
        mod = parse_module(ATTRIBUTES_PROGRAM)
        offloaded = mod["offloaded"]
        assert dict(offloaded.attrs) == {"Compiler": "example_codegen", "Inline": 1, "global_symbol": "offloaded_0"}
        inner = next(n for n in post_order(offloaded.body) if isinstance(n, Function))
        assert dict(inner.attrs) == {"Composite": "example.negate"}
        assert parse_module(print_module(mod)) == mod
        return
    fused = parse_module(program("tvm_aot_fused_nchwc.relay").read_text())
    assert dict(fused["main"].attrs) == {"src_layout": "OIHW", "dst_layout": "OIHW4i4o"}
    hooks = parse_module(program("tvm_target_hooks_infix.relay").read_text())
    target = hooks["replace_add_with_subtract"]
    assert target.attrs["Compiler"] == "example_target_hook" and target.attrs["Inline"] == 1
    body = hooks["main"].body
    assert isinstance(body, Call) and body.op_name == "multiply"


@pytest.mark.parametrize("name", [*corpus_cases("tvm_menagerie_resnet50.relay"), "zoo:resnet50"])
def test_resnet50_parses_with_every_operator_call(program: Callable[[str], Path], name: str) -> None:
    """A whole ResNet-50 (the corpus's, or the zoo's at full size printed to text) parses with every operator call of
    its text."""
    if name.startswith("zoo:"):
        constants: list[np.ndarray] = []
        text = print_module(zoo.full("resnet50"), constants_out=constants)
    else:
        path = program(name)
        constants = load_constants_sidecar(sidecar_path(path))
        text = path.read_text()
    mod = parse_module(text, name, constants)
    calls = [n for n in all_nodes(mod) if isinstance(n, Call)]
    operator_uses = re.findall(r"(?<![@\w.])[a-z_][a-z0-9_.]*\(", text)
    # the corpus's ResNet-50 v2 has 175 operator calls; the zoo's v1 176 (53 convolutions
    # with a batch norm each, 49 ReLUs, 16 adds, 5 more in the stem and the classifier)
    assert len(calls) == len(operator_uses) == (175 if name.startswith("tvm") else 176)


def all_nodes(mod: IRModule) -> list[Expr]:
    return [n for f in mod.values() for n in post_order(f)]
