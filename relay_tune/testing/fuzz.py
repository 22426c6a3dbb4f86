"""A seeded, mutation-based fuzz campaign over the whole front half of the compiler.

    python -m experiments fuzz --inputs 100000 --jobs 2          # the full campaign (nice -n 10 it on shared hosts)
    python -m experiments fuzz --inputs 2000 --seed 7 --kinds text-char,registry

Every input goes through parse -> type inference -> the graph passes, and (where small) the reference interpreter
before and after the passes, and now and then an LLVM build whose output is compared with the interpreter.
Input kinds:

- text-char:  printed seed programs with character edits (deleted, inserted, swapped, duplicated, truncated);
- text-token: the same with token edits: tokens deleted, duplicated, swapped in from a table of Relay tokens, and
  numbers replaced by absurd values (0, -1, 2**31, 2**40, 10**20) -- attribute values a hand or a tool got wrong;
- registry:   random programs built from the operator registry: each step calls a random operator on values
  defined so far with its default attributes, some perturbed; ill-typed steps must fail with a RelayTypeError;
- onnx:       random ONNX graphs of supported operators (run by onnxruntime as the oracle where it is installed),
  plus corrupted serialized models;
- log:        tuning-log lines with edits, read by the log parser.

Seeds: relay_tune/examples/*.relay, the small programs of ../shared/relay_corpus when that folder exists, a few
programs written here, and printed registry programs. What counts as a defect:

- crash: any exception that is not a `RelayTuneError` (from parsing, type inference, the passes, the importers or
  the log reader), and a MemoryError or a timeout (absurd attribute values must not allocate or loop);
- no location: a ParseError without line and column, or a type error of a parsed program without a source span;
- wrong result: the optimised program, or the compiled model, disagrees with the reference interpreter.

Each worker process caps its address space (RLIMIT_AS) so that an allocation "as long as the attribute says" is a
MemoryError (a defect) rather than a machine that swaps. `run_campaign` returns the counts and the defects, each
with its reproducer; the command line (`python -m experiments fuzz`) prints them and writes them to a JSON file.
The test suite's slice is `tests/test_fuzz_campaign.py`.
"""

from __future__ import annotations

import math
import multiprocessing
import re
import resource
import signal
import tempfile
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import relay_tune
from relay_tune.errors import ParseError, RelayTuneError, RelayTypeError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Function, IRModule, Tuple, TupleGetItem, Var, const, op, post_order
from relay_tune.ir.types import TensorType, TupleType
from relay_tune.op.registry import all_ops
from relay_tune.passes import optimize
from relay_tune.records.log_format import LogEvent, LogFormatError, TuningRecord, parse_line
from relay_tune.text import load_module, parse_module, print_module
from relay_tune.type_infer import infer_types
from search_space import Config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# the shared corpus beside the repository, when there is one
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "relay_corpus"
HEADER = '#[version = "0.0.5"]\n'
KINDS = ("text-char", "text-token", "registry", "onnx", "log")
DEFAULT_MIX = {"text-char": 0.28, "text-token": 0.32, "registry": 0.25, "onnx": 0.10, "log": 0.05}
# Corpus programs small enough to parse thousands of times (the large ones take a second each).
CORPUS_MAX_BYTES = 12_000
MEMORY_LIMIT = 3 << 30  # bytes of address space per worker
INPUT_TIMEOUT_S = 60  # generous: the campaign runs niced on a shared machine
INTERPRET_MAX_ELEMENTS = 200_000  # run the interpreter only on programs whose tensors are this small

WRITTEN_SEEDS = [
    """def @main(%x: Tensor[(1, 4, 8, 8), float32], %w: Tensor[(6, 4, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=6, kernel_size=[3, 3]);
  %1 = nn.max_pool2d(%0, pool_size=[2, 2], strides=[2, 2]);
  %2 = reshape(%1, newshape=[1, -1]);
  %3 = nn.softmax(%2, axis=1);
  (%3, sum(%1, axis=[2, 3], keepdims=True))
}
""",
    """def @main(%a: Tensor[(2, 3, 5), float32], %b: Tensor[(5, 4), float32]) {
  %0 = transpose(%a, axes=[1, 0, 2]);
  %1 = reshape(%0, newshape=[6, 5]);
  %2 = nn.dense(%1, transpose(%b, axes=[1, 0]));
  %3 = split(%2, indices_or_sections=2, axis=1);
  %4 = concatenate((%3.0, %3.1, %3.0), axis=1);
  %5 = strided_slice(%4, begin=[1, 0], end=[5, 6], strides=[2, 1]);
  mean(%5, axis=[0], keepdims=False)
}
""",
    """def @main(%x: Tensor[(4, 6), float32], %i: Tensor[(3,), int32]) {
  %0 = take(%x, %i, axis=1, mode="clip");
  %1 = expand_dims(%0, axis=0, num_newaxis=2);
  %2 = squeeze(%1, axis=[0]);
  %3 = broadcast_to(%2, shape=[2, 1, 3]);
  %4 = nn.batch_flatten(%3);
  %5 = clip(%4, a_min=-0.5f, a_max=0.5f);
  %6 = cast(%5, dtype="float64");
  max(%6, axis=[1])
}
""",
    """def @main(%x: Tensor[(1, 8, 6, 6), float32], %g: Tensor[(8,), float32], %b: Tensor[(8,), float32],
          %m: Tensor[(8,), float32], %v: Tensor[(8,), float32]) {
  %0 = nn.batch_norm(%x, %g, %b, %m, %v, epsilon=1e-05f);
  %1 = nn.relu(%0.0);
  %2 = nn.avg_pool2d(%1, pool_size=[3, 3], strides=[1, 1], padding=[1, 1, 1, 1]);
  %3 = nn.global_avg_pool2d(%2);
  %4 = nn.pad(%3, 0f, pad_width=[[0, 0], [0, 0], [1, 1], [1, 1]]);
  %5 = nn.upsampling(%4, scale_h=2f, scale_w=2f);
  multiply(%5, 2f)
}
""",
]

ABSURD_NUMBERS = ["0", "-1", "-7", "65536", "2147483648", "1099511627776", "100000000000000000000", "-2147483649",
                  "1e30f", "-1e30f", "1e-45f", "3.5e+38f", "0f", "-0f"]
TOKENS = [
    "(", ")", "{", "}", "[", "]", ",", ";", ":", ".", "=", "->", "%0", "%1", "%x", "@main", "fn", "let", "if",
    "else", "free_var", "meta[relay.Constant][0]", "meta[relay.Constant][99]", "Tensor[(1, ?), float32]",
    "float32", "int64", "bool", "float16", "axis=", "newshape=", "axes=", "keepdims=True", "pool_size=[99999, 1]",
    "channels=1000000", "kernel_size=[65536, 65536]", "num_newaxis=1000000000", "reps=[100000, 100000]",
    "indices_or_sections=100000", "newshape=[-1, -1]", "newshape=[0, 4294967296]", "axis=1000000", "axis=-1000000",
    "strides=[0, 0]", "dilation=[0, 0]", "groups=0", "padding=[-5, -5, -5, -5]", "units=1000000000000",
    "scale_h=1e+30f", "dtype=\"int1024\"", "nn.relu", "add", "reshape", "transpose", "nn.conv2d", "sum", "take",
    "True", "False", "None", "?", "-", "\n", " ", "é", "\x00",
]


# ---------------------------------------------------------------------------------------------------------------
# outcomes
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    stage: str  # how far the input got: parse, types, passes, interpret, build, ok (or "rejected at X")
    defect: str | None = None  # crash / no-location / wrong-result / memory / timeout
    detail: str = ""
    reproducer: str | bytes | None = None


class Defect(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass
class Stats:
    inputs: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    by_stage: Counter[str] = field(default_factory=Counter)
    defects: list[dict[str, Any]] = field(default_factory=list)
    interpreted: int = 0
    built: int = 0
    onnx_checked: int = 0

    def merge(self, other: Stats) -> None:
        self.inputs += other.inputs
        self.by_kind.update(other.by_kind)
        self.by_stage.update(other.by_stage)
        self.defects += other.defects
        self.interpreted += other.interpreted
        self.built += other.built
        self.onnx_checked += other.onnx_checked


class _Timeout(BaseException):  # not an Exception: nothing under test may swallow it
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


# ---------------------------------------------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    name: str
    text: str
    constants: tuple[np.ndarray, ...]


def load_seeds(use_corpus: bool = True) -> list[Seed]:
    """Seed programs printed canonically (so constants resolve through `constants`)."""

    seeds: list[Seed] = []

    def add(name: str, mod: Any) -> None:
        constants: list[np.ndarray] = []
        text = print_module(mod, constants_out=constants)
        seeds.append(Seed(name, text, tuple(constants)))

    for path in sorted(EXAMPLES.glob("*.relay")):
        add(path.name, load_module(path))
    for i, text in enumerate(WRITTEN_SEEDS):
        add(f"written_{i}", parse_module(HEADER + text, f"written_{i}.relay"))
    if use_corpus and CORPUS.is_dir():
        for path in sorted(CORPUS.glob("*.relay")):
            if path.stat().st_size > CORPUS_MAX_BYTES:
                continue
            try:
                mod = load_module(path)
            except RelayTuneError:
                continue
            add(path.name, mod)
    return seeds


# ---------------------------------------------------------------------------------------------------------------
# text mutation
# ---------------------------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"%?[A-Za-z_][\w.]*|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?[a-z0-9]*|\"[^\"]*\"|->|\S", re.ASCII)
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?[a-z0-9]*")


def mutate_chars(text: str, rng: np.random.Generator) -> str:
    for _ in range(int(rng.choice([1, 1, 1, 2, 3, 5]))):  # mostly one edit: more inputs get past the parser
        pos = int(rng.integers(0, len(text) + 1))
        kind = int(rng.integers(0, 6))
        if kind == 0:
            text = text[:pos] + text[pos + int(rng.integers(1, 20)):]
        elif kind == 1:
            text = text[:pos] + chr(int(rng.choice([rng.integers(32, 127), rng.integers(0, 0x3000)]))) + text[pos:]
        elif kind == 2:
            end = min(len(text), pos + int(rng.integers(1, 40)))
            text = text[:end] + text[pos:end] + text[end:]
        elif kind == 3:
            text = text[: max(pos, len(text) // 2)]
        elif kind == 4 and 0 < pos < len(text):
            text = text[: pos - 1] + text[pos] + text[pos - 1] + text[pos + 1:]
        else:
            text = text[:pos] + str(rng.choice(list("()[]{},;:=%@.-0123456789"))) + text[pos:]
    return text


def mutate_tokens(text: str, rng: np.random.Generator) -> str:
    tokens = [(m.start(), m.end()) for m in _TOKEN_RE.finditer(text)]
    if not tokens:
        return text + str(rng.choice(TOKENS))
    numbers = _numbers(text, tokens)
    for _ in range(int(rng.choice([1, 1, 2, 3]))):
        kind = int(rng.integers(0, 8))
        if kind <= 4 and numbers:  # the edit that finds absurd attribute values: a number replaced
            s, e = numbers[int(rng.integers(0, len(numbers)))]
            whole = text[s:e].lstrip("-").isdigit()  # an integer stays an integer: more inputs reach the types
            pool = [n for n in ABSURD_NUMBERS if n.lstrip("-").isdigit() == whole] if rng.random() < 0.9 \
                else ABSURD_NUMBERS
            text = text[:s] + str(rng.choice(pool)) + text[e:]
        elif kind == 2:
            s, e = tokens[int(rng.integers(0, len(tokens)))]
            text = text[:s] + text[e:]
        elif kind == 3:
            s, e = tokens[int(rng.integers(0, len(tokens)))]
            text = text[:s] + str(rng.choice(TOKENS)) + text[e:]
        else:
            s, e = tokens[int(rng.integers(0, len(tokens)))]
            text = text[:e] + " " + text[s:e] + text[e:]
        tokens = [(m.start(), m.end()) for m in _TOKEN_RE.finditer(text)] or [(0, 0)]
        numbers = _numbers(text, tokens)
    return text


def _numbers(text: str, tokens: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Number tokens that are values (attributes, shapes, literals), not parts of %0, .1 or meta[...][3]."""
    return [(s, e) for s, e in tokens if _NUMBER_RE.fullmatch(text[s:e]) and (s == 0 or text[s - 1] not in "%.[")]


# ---------------------------------------------------------------------------------------------------------------
# the pipeline every Relay program goes through
# ---------------------------------------------------------------------------------------------------------------


def _static_tensor_params(func: Any) -> list[tuple[str, tuple[int, ...], str]] | None:

    out = []
    for p in func.params:
        ty = p.checked_type if p.has_type() else p.type_annotation
        if not isinstance(ty, TensorType) or not all(isinstance(d, int) for d in ty.shape):
            return None
        out.append((p.name_hint, tuple(int(d) for d in ty.shape), str(ty.dtype)))
    return out


def random_values(params: Sequence[tuple[str, tuple[int, ...], str]], rng: np.random.Generator) -> dict[str, Any]:
    values = {}
    for name, shape, dtype in params:
        kind = np.dtype(dtype).kind
        if kind == "f":
            values[name] = rng.uniform(-2, 2, size=shape).astype(dtype)
        elif kind == "b":
            values[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            values[name] = rng.integers(0, 3, size=shape).astype(dtype)
    return values


def _flat(value: Any) -> list[np.ndarray]:
    if isinstance(value, tuple | list):
        return [a for v in value for a in _flat(v)]
    return [np.asarray(value)]


def same_results(expected: Any, got: Any, rtol: float = 1e-3, atol: float = 1e-4) -> str | None:
    a, b = _flat(expected), _flat(got)
    if len(a) != len(b):
        return f"{len(a)} outputs expected, got {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            return f"output {i}: shape {x.shape} expected, got {y.shape}"
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            # Where the reference is NaN (say clip or max of a NaN from power(-x, 0.5)) compiled code may pick
            # either operand, as LLVM's minnum/maxnum do; those positions are not compared.
            yf = np.where(np.isnan(xf), np.nan, yf)
            scale = max(1.0, float(np.nanmax(np.abs(xf), initial=0.0)) if np.isfinite(xf).any() else 1.0)
            if not np.allclose(xf, yf, rtol=rtol, atol=atol * scale, equal_nan=True):
                where = np.argwhere(~np.isclose(xf, yf, rtol=rtol, atol=atol * scale, equal_nan=True))[0]
                return f"output {i} differs at {tuple(where)}: {xf[tuple(where)]} expected, got {yf[tuple(where)]}"
        elif not np.array_equal(x, y):
            return f"output {i} differs"
    return None


def _has_location(err: RelayTuneError) -> bool:
    if isinstance(err, ParseError):
        return err.line >= 1 and err.column >= 1
    if isinstance(err, RelayTypeError):
        return err.span is not None
    return bool(re.search(r":\d+:\d+", str(err)))


def run_pipeline(mod: Any, rng: np.random.Generator, stats: Stats, from_text: bool, build_now: bool,
                 deep: bool = True) -> Outcome:
    """Type inference -> passes -> interpreter before and after -> (build_now) LLVM build vs the interpreter.
    `deep=False` stops after type inference (the fast slice the test suite runs)."""

    try:
        typed = infer_types(mod)
    except RelayTuneError as err:
        if from_text and isinstance(err, RelayTypeError) and not _has_location(err):
            raise Defect("no-location", f"type error without a source location: {err}") from err
        return Outcome("rejected at types")
    if not deep:
        return Outcome("types")
    try:
        fused = optimize(typed)
    except RelayTuneError:
        return Outcome("rejected at passes")
    if "main" not in typed:
        return Outcome("passes")  # no @main, only other functions: nothing to run
    params = _static_tensor_params(typed["main"])
    if params is None or not _small(typed["main"]) or not _tensors_only(typed["main"].body.checked_type):
        return Outcome("passes")
    inputs = random_values(params, rng)
    try:
        expected = evaluate(typed, dict(inputs))
    except (RelayTuneError, ArithmeticError, IndexError, ValueError):
        return Outcome("passes")  # the reference cannot run these random inputs: nothing to compare
    stats.interpreted += 1
    try:
        got = evaluate(fused, dict(inputs))
    except Exception as err:
        raise Defect("wrong-result", f"the optimised program fails where the original runs: {err!r}") from err
    problem = same_results(expected, got)
    if problem is not None:
        raise Defect("wrong-result", f"optimised program: {problem}")
    if not build_now:
        return Outcome("interpret")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = relay_tune.build(typed, target="llvm -num-cores=1", jobs=1)
    except RelayTuneError:
        return Outcome("rejected at build")
    stats.built += 1
    problem = same_results(expected, model.run(**inputs))
    if problem is not None:
        raise Defect("wrong-result", f"compiled model: {problem}")
    return Outcome("build")


def _tensors_only(ty: Any) -> bool:
    """Results the comparison understands: tensors and tuples of them (not functions or references)."""

    if isinstance(ty, TupleType):
        return all(_tensors_only(f) for f in ty.fields)
    return isinstance(ty, TensorType)


def _small(func: Any) -> bool:

    def elements(ty: Any) -> int:
        if isinstance(ty, TensorType):  # zero dimensions count as one: an empty tensor may still be walked
            return math.prod(max(int(d), 1) for d in ty.shape) if all(isinstance(d, int) for d in ty.shape) \
                else 10**9
        if isinstance(ty, TupleType):
            return sum(elements(f) for f in ty.fields)
        return 0

    total = 0
    for node in post_order(func.body):
        if node.has_type():
            total += elements(node.checked_type)
            if total > INTERPRET_MAX_ELEMENTS:
                return False
    return True


def fuzz_text(seed: Seed, text: str, rng: np.random.Generator, stats: Stats, deep: bool = True) -> Outcome:

    try:
        mod = parse_module(text, "fuzz.relay", list(seed.constants))
    except ParseError as err:
        if not _has_location(err):
            raise Defect("no-location", f"parse error without line/column: {err}") from err
        return Outcome("rejected at parse")
    except RelayTuneError as err:
        raise Defect("no-location", f"parser raised {type(err).__name__}, not a ParseError: {err}") from err
    outcome = run_pipeline(mod, rng, stats, from_text=True, build_now=False, deep=deep)
    if outcome.stage in ("types", "passes", "interpret"):
        constants: list[np.ndarray] = []
        printed = print_module(mod, constants_out=constants)
        try:
            parse_module(printed, "printed.relay", constants)
        except ParseError as err:
            raise Defect("crash", f"a parsed program does not parse back after printing: {err}") from err
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# random programs from the operator registry
# ---------------------------------------------------------------------------------------------------------------

SHAPES = [(4,), (2, 3), (1, 4, 6, 6), (2, 4, 5), (1, 3, 4, 4), (6, 4), (3, 1), (1,), ()]
DTYPES = ["float32", "float32", "float32", "int32", "float64", "bool", "int64", "float16"]
SKIP_OPS = {"debug", "device_copy", "annotation.stop_fusion"}


def _perturb(value: Any, rng: np.random.Generator) -> Any:
    """A nearby or absurd value of the same kind as an attribute's default."""
    if isinstance(value, bool) or value is None:
        return bool(rng.integers(0, 2)) if value is not None else int(rng.integers(-2, 4))
    if isinstance(value, int):
        return int(rng.choice([0, 1, 2, 3, -1, -2, value + 1, 2**31, 2**40, -(2**33), 10**20]))
    if isinstance(value, float):
        return float(rng.choice([0.0, 0.5, 2.0, -1.0, 1e30, 1e-30, float(value) * 2]))
    if isinstance(value, tuple | list):
        length = int(rng.choice([len(value), 0, 1, 2, 4, 3]))
        base = list(value) or [1]
        return [_perturb(base[i % len(base)], rng) if rng.random() < 0.3 else int(rng.choice([1, 2, 0, -1]))
                for i in range(length)]
    if isinstance(value, str):
        return str(rng.choice([value, "NCHW", "NHWC", "OIHW", "float32", "int8", "", "clip", "wrap", "zzz"]))
    return value


def random_program(rng: np.random.Generator, steps: int) -> Any:
    """A random module: `steps` operator calls on parameters and earlier results (ill-typed steps dropped)."""

    ops = [o for o in all_ops() if o.type_relation is not None and o.name not in SKIP_OPS]
    params = []
    for i in range(int(rng.integers(1, 4))):
        shape = SHAPES[int(rng.integers(0, len(SHAPES) - 1))]
        dtype = "float32" if rng.random() < 0.75 else str(rng.choice(DTYPES))
        params.append(Var(f"p{i}", TensorType(shape, dtype)))
    values: list[Any] = list(params)  # untyped expressions of tensor type

    def type_of(expr: Any) -> Any:
        return infer_types(IRModule({"main": Function(tuple(params), expr)}))["main"].body.checked_type

    for _ in range(steps):
        opdef = ops[int(rng.integers(0, len(ops)))]
        arity = opdef.num_inputs if opdef.num_inputs is not None else int(rng.integers(1, 4))
        args: list[Any] = []
        for _ in range(arity):
            if rng.random() < 0.85:
                args.append(values[int(rng.integers(0, len(values)))])
            else:
                shape = SHAPES[int(rng.integers(0, 3))]
                args.append(const(np.asarray(rng.uniform(-1, 1, size=shape), "float32")))
        if opdef.num_inputs is None and rng.random() < 0.7:  # variadic operators (concatenate...) take a tuple
            args = [Tuple(tuple(args))]
        given: dict[str, Any] = {}
        for key, default in opdef.attr_defaults.items():
            if key in opdef.required_attrs or rng.random() < 0.35:
                given[key] = _perturb(default, rng)
        try:
            node: Any = Call(op(opdef.name), tuple(args), opdef.make_attrs(given))
            ty = type_of(node)
        except RelayTuneError:
            continue  # an ill-typed step: rejected cleanly, as it must be
        except (Exception, RecursionError) as err:
            arg_types = [type_of(a) if not isinstance(a, Tuple) else "tuple" for a in args]
            raise Defect("crash", f"type inference of {opdef.name}{tuple(map(str, arg_types))} with {given}: "
                         f"{type(err).__name__}: {err}") from err
        if isinstance(ty, TupleType):
            if not ty.fields:
                continue
            index = int(rng.integers(0, len(ty.fields)))
            node, ty = TupleGetItem(node, index), ty.fields[index]
        if isinstance(ty, TensorType):
            values.append(node)
    body = values[-1]
    if rng.random() < 0.2 and len(values) > len(params) + 1:
        body = Tuple((values[-1], values[-2]))
    return IRModule({"main": Function(tuple(params), body)})


def fuzz_registry(rng: np.random.Generator, stats: Stats, build_now: bool, deep: bool = True) -> Outcome:

    mod: IRModule = random_program(rng, int(rng.integers(1, 7)))
    outcome = run_pipeline(mod, rng, stats, from_text=False, build_now=build_now, deep=deep)
    if outcome.stage in ("types", "passes", "interpret", "build"):
        constants: list[np.ndarray] = []
        printed = print_module(mod, constants_out=constants)
        try:
            parse_module(printed, "printed.relay", constants)
        except ParseError as err:
            raise Defect("crash", f"a generated program does not parse back after printing: {err}\n{printed}") \
                from err
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# random ONNX graphs
# ---------------------------------------------------------------------------------------------------------------


def random_onnx(rng: np.random.Generator) -> tuple[Any, dict[str, np.ndarray], bool]:
    """A random chain of ONNX operators on one NCHW input: (model, inputs, whether attributes were perturbed)."""
    from onnx import TensorProto, helper, numpy_helper

    c, h, w = int(rng.integers(1, 5)), int(rng.integers(3, 9)), int(rng.integers(3, 9))
    shape = [1, c, h, w]
    nodes: list[Any] = []
    inits: list[Any] = []
    perturbed = False
    current = "x"
    counter = iter(range(10_000))

    def fresh(prefix: str) -> str:
        return f"{prefix}{next(counter)}"

    def weight(values: np.ndarray) -> str:
        name = fresh("w")
        inits.append(numpy_helper.from_array(values.astype(np.float32), name))
        return name

    def int_tensor(values: Sequence[int]) -> str:
        name = fresh("i")
        inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def absurd(value: int) -> int:
        nonlocal perturbed
        if rng.random() < 0.08:
            perturbed = True
            return int(rng.choice([0, -1, 2**31, 10**12, -(10**9), value * 1000]))
        return value

    for _ in range(int(rng.integers(1, 6))):
        out = fresh("t")
        rank = len(shape)
        choice = int(rng.integers(0, 14))
        if choice == 0:
            nodes.append(helper.make_node(str(rng.choice(["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp"])),
                                          [current], [out]))
        elif choice == 1:
            other = weight(rng.uniform(-1, 1, size=shape[-1:] if rng.random() < 0.5 else shape))
            nodes.append(helper.make_node(str(rng.choice(["Add", "Mul", "Sub", "Max", "Min"])), [current, other],
                                          [out]))
        elif choice == 2 and rank == 4:
            k = int(rng.choice([1, 3]))
            cout = int(rng.integers(1, 5))
            wname = weight(rng.uniform(-1, 1, size=(cout, shape[1], k, k)))
            pad = k // 2
            nodes.append(helper.make_node("Conv", [current, wname], [out], kernel_shape=[absurd(k), k],
                                          pads=[pad] * 4, strides=[1, 1]))
            shape = [1, cout, shape[2], shape[3]]
        elif choice == 3 and rank == 4 and shape[2] >= 2 and shape[3] >= 2:
            op_type = str(rng.choice(["MaxPool", "AveragePool"]))
            nodes.append(helper.make_node(op_type, [current], [out], kernel_shape=[2, absurd(2)], strides=[2, 2]))
            shape = [shape[0], shape[1], shape[2] // 2, shape[3] // 2]
        elif choice == 4 and rank == 4:
            nodes.append(helper.make_node("GlobalAveragePool", [current], [out]))
            shape = [shape[0], shape[1], 1, 1]
        elif choice == 5:
            nodes.append(helper.make_node("Flatten", [current], [out], axis=absurd(1)))
            shape = [shape[0], math.prod(shape[1:])]
        elif choice == 6:
            axis = absurd(int(rng.integers(-rank, rank)))
            nodes.append(helper.make_node("Softmax", [current], [out], axis=axis))
        elif choice == 7:
            perm = [int(i) for i in rng.permutation(rank)]
            shape = [shape[i] for i in perm]
            if rng.random() < 0.05:
                perm[0], perturbed = 10**6, True
            nodes.append(helper.make_node("Transpose", [current], [out], perm=perm))
        elif choice == 8:
            target = [shape[0], -1] if rng.random() < 0.7 else [absurd(math.prod(shape))]
            nodes.append(helper.make_node("Reshape", [current, int_tensor(target)], [out]))
            shape = [shape[0], math.prod(shape[1:])] if len(target) == 2 else [math.prod(shape)]
        elif choice == 9 and rank >= 2:
            k = shape[-1]
            n = int(rng.integers(1, 6))
            nodes.append(helper.make_node("MatMul", [current, weight(rng.uniform(-1, 1, size=(k, n)))], [out]))
            shape = [*shape[:-1], n]
        elif choice == 10:
            axes = [absurd(int(rng.integers(0, rank)))]
            op_type = str(rng.choice(["ReduceMean", "ReduceSum", "ReduceMax"]))
            if op_type == "ReduceSum":  # opset 13 takes the axes as an input
                nodes.append(helper.make_node(op_type, [current, int_tensor(axes)], [out], keepdims=1))
            else:
                nodes.append(helper.make_node(op_type, [current], [out], axes=axes, keepdims=1))
            if 0 <= axes[0] < rank:
                shape = [1 if i == axes[0] else d for i, d in enumerate(shape)]
        elif choice == 11:
            axis = int(rng.integers(0, rank))
            nodes.append(helper.make_node("Concat", [current, current], [out], axis=absurd(axis)))
            shape = [d * 2 if i == axis else d for i, d in enumerate(shape)]
        elif choice == 12:
            nodes.append(helper.make_node("Clip", [current, weight(np.float32(-0.5)), weight(np.float32(0.5))],
                                          [out]))
        else:
            axis = int(rng.integers(0, rank))
            start, end = 0, max(1, shape[axis] - 1)
            nodes.append(helper.make_node("Slice", [current, int_tensor([start]), int_tensor([absurd(end)]),
                                                    int_tensor([axis])], [out]))
            shape = [end - start if i == axis else d for i, d in enumerate(shape)]
        current = out
    graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, {"x": rng.uniform(-1, 1, size=(1, c, h, w)).astype(np.float32)}, perturbed


_ORT: Any = None


def fuzz_onnx(rng: np.random.Generator, stats: Stats, scratch: Path, deep: bool = True) -> Outcome:
    # optional dependency: the ONNX importer needs onnx
    from relay_tune.frontend.onnx import from_onnx

    model, inputs, perturbed = random_onnx(rng)
    data = model.SerializeToString()
    if rng.random() < 0.25:  # a corrupted file: bytes flipped, cut or inserted
        raw = bytearray(data)
        for _ in range(int(rng.integers(1, 8))):
            pos = int(rng.integers(0, max(1, len(raw))))
            op = int(rng.integers(0, 3))
            if op == 0 and raw:
                raw[pos % len(raw)] = int(rng.integers(0, 256))
            elif op == 1:
                del raw[pos:]
            else:
                raw[pos:pos] = bytes(rng.integers(0, 256, size=int(rng.integers(1, 9))).astype(np.uint8))
        path = scratch / "fuzz.onnx"
        path.write_bytes(bytes(raw))
        try:
            from_onnx(path)
        except RelayTuneError:
            return Outcome("rejected at import")
        return Outcome("import")
    try:
        mod, _ = from_onnx(model)
    except RelayTuneError:
        return Outcome("rejected at import")
    outcome = run_pipeline(mod, rng, stats, from_text=False, build_now=False, deep=deep)
    if not deep or perturbed or outcome.stage not in ("interpret", "passes"):
        return outcome
    global _ORT
    if _ORT is None:
        try:
            import onnxruntime

            _ORT = onnxruntime
        except ImportError:
            _ORT = False
    if not _ORT:
        return outcome
    try:
        session = _ORT.InferenceSession(data, providers=["CPUExecutionProvider"])
        (want,) = session.run(None, inputs)
    except Exception:
        return outcome  # onnxruntime rejects it too: nothing to compare
    got = evaluate(mod, inputs)
    stats.onnx_checked += 1
    problem = same_results(want, got)
    if problem is not None:
        raise Defect("wrong-result", f"imported ONNX model vs onnxruntime: {problem}")
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# tuning-log lines
# ---------------------------------------------------------------------------------------------------------------


def _log_seed_lines() -> list[str]:

    record = TuningRecord("ab12" * 16, "llvm -mcpu=znver4 -num-cores=2", Config({"tile_x": [4, 8], "unroll": True}),
                          (1.5e-4, 1.6e-4), description="dense 64x64", flops=5e5, host_cpu="znver4", trial=3)
    return [record.to_json(), LogEvent("session_start", "s1", data={"seed": 0}).to_json()]


def fuzz_log(rng: np.random.Generator, stats: Stats) -> Outcome:

    line = str(rng.choice(_log_seed_lines()))
    line = mutate_tokens(line, rng) if rng.random() < 0.6 else mutate_chars(line, rng)
    if rng.random() < 0.1:
        line = "[" * int(rng.integers(1, 100_000)) + line
    try:
        parse_line(line)
    except LogFormatError:
        return Outcome("rejected at log")
    return Outcome("log")


# ---------------------------------------------------------------------------------------------------------------
# the campaign
# ---------------------------------------------------------------------------------------------------------------


def fuzz_one(kind: str, index: int, base_seed: int, seeds: Sequence[Seed], stats: Stats, scratch: Path,
             build_every: int, deep: bool = True) -> None:
    """Run input `index` of `kind` (deterministic in base_seed and index); record its outcome in `stats`."""
    rng = np.random.default_rng([base_seed, KINDS.index(kind), index])
    reproducer: str | bytes | None = None
    stats.inputs += 1
    stats.by_kind[kind] += 1
    try:
        if kind in ("text-char", "text-token"):
            seed = seeds[int(rng.integers(0, len(seeds)))]
            text = (mutate_chars if kind == "text-char" else mutate_tokens)(seed.text, rng)
            reproducer = text
            outcome = fuzz_text(seed, text, rng, stats, deep)
        elif kind == "registry":
            outcome = fuzz_registry(rng, stats, build_now=deep and build_every > 0 and index % build_every == 0,
                                    deep=deep)
        elif kind == "onnx":
            outcome = fuzz_onnx(rng, stats, scratch, deep)
        else:
            outcome = fuzz_log(rng, stats)
        stats.by_stage[f"{kind}: {outcome.stage}"] += 1
        return
    except Defect as err:
        defect, detail = err.kind, err.detail
    except _Timeout:
        defect, detail = "timeout", f"no answer within {INPUT_TIMEOUT_S} s"
    except MemoryError as err:
        tail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-4:])
        defect, detail = "memory", f"MemoryError (an allocation beyond the worker's address-space limit)\n{tail}"
    except RecursionError as err:
        defect, detail = "crash", f"RecursionError: {err}"
    except RelayTuneError as err:
        defect, detail = "crash", f"{type(err).__name__} escaped where it should have been handled: {err}"
    except Exception as err:
        tail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-3:])
        defect, detail = "crash", f"{type(err).__name__}: {err}\n{tail}"
    stats.by_stage[f"{kind}: DEFECT {defect}"] += 1
    entry = {"kind": kind, "index": index, "seed": base_seed, "defect": defect, "detail": detail[:3000]}
    if isinstance(reproducer, str):
        entry["input"] = reproducer[:20000]
    stats.defects.append(entry)


def plan_inputs(total: int, mix: dict[str, float]) -> list[tuple[str, int]]:
    """(kind, index) for `total` inputs in the proportions of `mix`, interleaved."""
    weights = {k: v for k, v in mix.items() if v > 0}
    norm = sum(weights.values())
    counts = {k: round(total * v / norm) for k, v in weights.items()}
    counts[max(counts, key=lambda k: counts[k])] += total - sum(counts.values())
    plan = [(k, i) for k, n in counts.items() for i in range(n)]
    plan.sort(key=lambda item: (item[1] / max(1, counts[item[0]]), item[0]))
    return plan


def _worker(args: tuple[list[tuple[str, int]], int, bool, int, str, bool]) -> Stats:
    plan, base_seed, use_corpus, build_every, scratch, deep = args
    if MEMORY_LIMIT:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.signal(signal.SIGALRM, _on_alarm)
    warnings.simplefilter("ignore")
    seeds = load_seeds(use_corpus)
    stats = Stats()
    folder = Path(scratch)
    folder.mkdir(parents=True, exist_ok=True)
    for kind, index in plan:
        signal.alarm(INPUT_TIMEOUT_S)
        try:
            fuzz_one(kind, index, base_seed, seeds, stats, folder, build_every, deep)
        finally:
            signal.alarm(0)
    return stats


def run_campaign(total: int, seed: int = 0, jobs: int = 1, mix: dict[str, float] | None = None,
                 use_corpus: bool = True, build_every: int = 40, scratch: Path | None = None,
                 progress: Callable[[int], None] | None = None, deep: bool = True) -> Stats:
    """Fuzz `total` inputs over `jobs` worker processes (jobs=0: in this process, no memory limit or alarm).
    `deep=False`: parse and type inference only (plus ONNX import), the fast slice of the test suite. `scratch`:
    a folder for the files inputs are written to (default: a temporary folder)."""
    if scratch is None:
        with tempfile.TemporaryDirectory(prefix="relay-tune-fuzz-") as folder:
            return run_campaign(total, seed, jobs, mix, use_corpus, build_every, Path(folder), progress, deep)
    plan = plan_inputs(total, mix or DEFAULT_MIX)
    if jobs == 0:
        stats = Stats()
        seeds = load_seeds(use_corpus)
        scratch.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for kind, index in plan:
                fuzz_one(kind, index, seed, seeds, stats, scratch, build_every, deep)
        return stats
    chunk = 500
    pieces = [plan[i:i + chunk] for i in range(0, len(plan), chunk)]
    stats = Stats()
    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs, maxtasksperchild=4) as pool:
        work = [(piece, seed, use_corpus, build_every, str(scratch / f"w{i % jobs}"), deep) for i, piece in
                enumerate(pieces)]
        for part in pool.imap_unordered(_worker, work):
            stats.merge(part)
            if progress is not None:
                progress(stats.inputs)
    return stats


def report(stats: Stats, seconds: float) -> str:
    lines = [f"{stats.inputs} inputs in {seconds:.0f} s ({stats.inputs / max(seconds, 1e-9):.0f}/s); "
             f"{stats.interpreted} interpreted before/after the passes, {stats.built} built with LLVM, "
             f"{stats.onnx_checked} ONNX imports checked against onnxruntime; {len(stats.defects)} defects"]
    for kind in KINDS:
        if stats.by_kind[kind]:
            stages = {k.split(": ", 1)[1]: n for k, n in stats.by_stage.items() if k.startswith(kind + ": ")}
            lines.append(f"  {kind:10s} {stats.by_kind[kind]:7d}  " + ", ".join(
                f"{stage} {n}" for stage, n in sorted(stages.items(), key=lambda x: -x[1])))
    for defect in stats.defects[:40]:
        lines.append(f"DEFECT {defect['defect']} [{defect['kind']} #{defect['index']}]: "
                     f"{defect['detail'].splitlines()[0][:300]}")
    return "\n".join(lines)
