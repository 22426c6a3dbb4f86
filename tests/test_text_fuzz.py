"""Fuzzing the text front end: whatever the input, the only error is a ParseError.

Inputs are programs of the corpus (when it is beside the checkout) and of the model zoo with random edits
(characters and tokens deleted, inserted, replaced, slices duplicated, the file truncated), random token soup, and
random bytes. When a mutated program still parses, printing it and parsing the text again must work too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_sources import CORPUS_DIR, INLINE_EXPRESSION, corpus_cases, in_corpus

from relay_tune.errors import ParseError
from relay_tune.ir import Expr, free_vars, structural_equal
from relay_tune.testing import zoo
from relay_tune.text import load_module, parse_expr, parse_module, parse_module_bytes, print_expr, print_module

HEADER = '#[version = "0.0.5"]\n'
# Small and medium corpus files: cheap enough to parse hundreds of times.
FUZZ_FILES = in_corpus(
    "tvm_aot_fused_nchwc.relay",
    "tvm_aot_int8_conv.relay",
    "tvm_autoquant_bias_conv.relay",
    "tvm_composite_partition.relay",
    "tvm_dfpattern_partitioned.relay",
    "tvm_dyn_any_dims.relay",
    "tvm_eta_expand_fn_type.relay",
    "tvm_expr_grad_let_tuple.relay",
    "tvm_lower_te_primitive.relay",
    "tvm_menagerie_gpt2_extract.relay",
    "tvm_menagerie_mnist.relay",
    "tvm_op_level1_take_slice.relay",
    "tvm_target_hooks_infix.relay",
    "tvm_type_infer_polymorphic.relay",
)
# Zoo models printed with their types, and an expression of our own: what is fuzzed in a clone alone.
ZOO_TEXTS = {
    f"zoo_{name}": print_module(zoo.small(name), show_types=True, constants_out=[])
    for name in ["lstm", "dcgan", "inception_block", "densenet_block", "bert_layer", "squeezenet1_1"]
}
ZOO_TEXTS["inline_expression"] = INLINE_EXPRESSION
EXPRESSION_SOURCES = {"tvm_expr_grad_let_tuple.relay", "inline_expression"}
# Every meta[relay.Constant][i] in those files resolves; shapes do not matter to the parser.
CONSTANTS = [np.zeros((1,), "float32")] * 300
TOKENS = [
    "(", ")", "{", "}", "[", "]", ",", ";", ":", ".", "=", "->", "*", "/", "+", "-", "<", "<=", "==", "!=", "?",
    "%0", "%1", "%7", "%x", "%p0", "@main", "@f", "fn", "let", "if", "else", "def", "free_var", "type", "match",
    "ref", "extern", "meta[relay.Constant][0]", "meta[relay.Constant][999]", "meta[tir.SizeVar][0]", "meta[",
    "1", "1f", "1.5", "2i64", "-3", "--4", "inff", "nanf", "1e-05f", "99999999999999999999999", "3.5e+99f16",
    '"', '"NCHW"', "/*", "*/", "//", "#[", "#[metadata]", HEADER, "Tensor", "Tensor[(1, ?), float32]", "float32",
    "int", "_", "A", "nn.conv2d", "add", "nn.relu", "reshape", "newshape=", "axis=", "Primitive=1", "True", "None",
    "\n", " ", "\r", "\t", "é", "\x00", "\ufeff", "\\",
]
FAST = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))


@st.composite
def mutations(draw: st.DrawFn, text: str) -> str:
    """`text` with a few random edits."""
    for _ in range(draw(st.integers(1, 6))):
        pos = draw(st.integers(0, len(text)))
        kind = draw(st.integers(0, 6))
        if kind == 0:
            text = text[:pos] + text[pos + draw(st.integers(1, 20)) :]
        elif kind == 1:
            text = text[:pos] + draw(st.characters()) + text[pos:]
        elif kind == 2:
            text = text[:pos] + draw(st.sampled_from(TOKENS)) + text[pos:]
        elif kind == 3:
            text = text[:pos] + draw(st.sampled_from(TOKENS)) + text[pos + draw(st.integers(1, 8)) :]
        elif kind == 4:
            end = min(len(text), pos + draw(st.integers(1, 40)))
            text = text[:end] + text[pos:end] + text[end:]
        elif kind == 5:
            text = text[:pos]
        else:
            # swap two neighbouring characters
            if 0 < pos < len(text):
                text = text[: pos - 1] + text[pos] + text[pos - 1] + text[pos + 1 :]
    return text


def is_closed(expr: Expr) -> bool:
    return not free_vars(expr)


def check_module_text(text: str) -> None:
    """Parsing fails only with ParseError; a parsed module prints and parses back."""
    try:
        mod = parse_module(text, "fuzz.relay", CONSTANTS)
    except ParseError as err:
        assert err.line >= 1 and err.column >= 1 and "fuzz.relay:" in str(err)
        return
    constants: list[np.ndarray] = []
    printed = print_module(mod, constants_out=constants)
    again = parse_module(printed, "printed.relay", constants)
    if all(is_closed(f) for f in mod.values()):
        assert again == mod, printed


def check_expr_text(text: str) -> None:
    try:
        expr = parse_expr(text, "fuzz.relay", CONSTANTS)
    except ParseError as err:
        assert err.line >= 1 and err.column >= 1
        return
    constants: list[np.ndarray] = []
    printed = print_expr(expr, constants_out=constants)
    assert structural_equal(parse_expr(printed, "printed.relay", constants), expr, map_free_vars=True), printed


def check_text(name: str, text: str) -> None:
    if name in EXPRESSION_SOURCES:
        check_expr_text(text)
    else:
        check_module_text(text)


def source_text(name: str) -> str:
    return ZOO_TEXTS[name] if name in ZOO_TEXTS else (CORPUS_DIR / name).read_text()


def fuzz_programs(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from([*FUZZ_FILES, *ZOO_TEXTS]), label="file")
    text = data.draw(mutations(source_text(name)), label="mutated")
    check_text(name, text)


def fuzz_tokens(data: st.DataObject) -> None:
    pieces = data.draw(st.lists(st.one_of(st.sampled_from(TOKENS), st.characters()), max_size=60))
    text = "".join(pieces)
    check_expr_text(text)
    check_module_text(HEADER + "def @main(%x: float32) {\n" + text + "\n}\n")


def fuzz_bytes(data: st.DataObject, folder: Path) -> None:
    raw = data.draw(st.one_of(st.binary(max_size=400), st.text(max_size=200).map(lambda t: (HEADER + t).encode())))
    try:
        parse_module_bytes(raw, "fuzz.relay", CONSTANTS)
    except ParseError:
        pass
    check_expr_text(raw.decode("latin-1"))
    path = folder / "fuzz.relay"
    path.write_bytes(raw)
    try:
        load_module(path)
    except ParseError:
        pass


# ---------------------------------------------------------------------- fast runs (a few seconds)
@FAST
@given(data=st.data())
def test_mutated_programs(data: st.DataObject) -> None:
    fuzz_programs(data)


@FAST
@given(data=st.data())
def test_random_token_soup(data: st.DataObject) -> None:
    fuzz_tokens(data)


@FAST
@given(data=st.data())
def test_random_bytes(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    fuzz_bytes(data, tmp_path_factory.getbasetemp())


@pytest.mark.parametrize(
    "name", [*corpus_cases("tvm_lower_te_primitive.relay", "tvm_expr_grad_let_tuple.relay"), "inline_expression"]
)
def test_every_truncation(name: str) -> None:
    text = source_text(name)
    for end in range(len(text) + 1):
        check_text(name, text[:end])
    as_bytes = text.encode()
    for end in range(0, len(as_bytes), 7):
        try:
            parse_module_bytes(as_bytes[:end])
        except ParseError:
            pass


def test_module_from_mutation_still_round_trips() -> None:
    # A regression seen while fuzzing: a projection on a literal must not print as a float (`0.0`).
    check_module_text(HEADER + "def @main() { %0 = (0, 1); (0).0 }")
    check_module_text(HEADER + "def @main() { free_var %x: int32; (%x, 1.5f).1 }")


# ---------------------------------------------------------------------- bigger runs
@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_mutated_programs_long(data: st.DataObject) -> None:
    fuzz_programs(data)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_random_token_soup_long(data: st.DataObject) -> None:
    fuzz_tokens(data)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_random_bytes_long(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    fuzz_bytes(data, tmp_path_factory.getbasetemp())
