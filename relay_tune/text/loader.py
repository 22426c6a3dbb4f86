"""Loading `.relay` files and synthesising the constants their `.consts.json` sidecars describe.

A sidecar looks like `{"relay.Constant": [{"dtype": "float32", "shape": [8, 1, 5, 5]}, ...]}`:
entry `i` gives the dtype and shape of `meta[relay.Constant][i]`. The values are made up (seeded),
which is all a compiler test needs: floats are normal samples scaled by 0.1, integers are small
non-negative numbers (safe as indices), booleans are coin flips.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from relay_tune.frontend.params import load_params, params_path
from relay_tune.ir import Call, Constant, Expr, Function, rewrite
from relay_tune.ir.module import IRModule
from relay_tune.text.lexer import SourceText
from relay_tune.text.parser import decode_source, parse_module

SIDECAR_SUFFIX = ".consts.json"


def sidecar_path(path: str | Path) -> Path:
    """`model.relay` -> `model.consts.json` (same folder)."""
    path = Path(path)
    return path.with_name(path.stem + SIDECAR_SUFFIX)


def load_constants_sidecar(path: str | Path, seed: int = 0) -> list[np.ndarray]:
    """Constants with the shapes/dtypes listed in a sidecar file, filled with seeded random values."""
    path = Path(path)
    name = str(path)
    source = SourceText(decode_source(path.read_bytes(), name), name)
    try:
        document = json.loads(source.text)
    except json.JSONDecodeError as err:
        raise source.error(f"invalid JSON in constants file: {err.msg}", err.pos) from None
    entries = document.get("relay.Constant") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise source.error('a constants file must be a JSON object with a "relay.Constant" list', 0)
    rng = np.random.default_rng(seed)
    return [_synthesise(entry, i, rng, source) for i, entry in enumerate(entries)]


def _synthesise(entry: Any, index: int, rng: np.random.Generator, source: SourceText) -> np.ndarray:
    where = f'"relay.Constant"[{index}]'
    if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and isinstance(entry.get("shape"), list)):
        raise source.error(f'{where} must be an object with a "dtype" string and a "shape" list', 0)
    shape = entry["shape"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise source.error(f"{where}: the shape must list non-negative integers, got {shape}", 0)
    try:
        dtype = np.dtype(entry["dtype"])
    except TypeError:
        raise source.error(f"{where}: unknown dtype {entry['dtype']!r}", 0) from None
    shape_t = tuple(shape)
    if dtype.kind == "f":
        sample_dtype = np.float64 if dtype == np.float64 else np.float32
        values = rng.standard_normal(shape_t, dtype=sample_dtype)
        values *= 0.1
        return values.astype(dtype, copy=False)
    if dtype.kind in "iu":
        return rng.integers(0, 4, size=shape_t).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape_t) < 0.5
    raise source.error(f"{where}: unsupported constant dtype {dtype}", 0)


def load_module(path: str | Path, consts: str | Path | None = None, seed: int = 0) -> IRModule:
    """Parse a `.relay` module file.

    Constants come from `consts` if given (a `.npz` parameter file holding the values, or a
    `.consts.json` sidecar giving shapes), else from `<stem>.params.npz` next to the file (written by
    `relay-tune import`), else from `<stem>.consts.json` next to it, when those exist. Invalid UTF-8 and
    syntax errors raise ParseError; a missing file raises the usual OSError.
    """
    path = Path(path)
    name = str(path)
    text = decode_source(path.read_bytes(), name)
    constants: list[np.ndarray] | None = None
    if consts is not None:
        constants = load_params(consts) if Path(consts).suffix == ".npz" else load_constants_sidecar(consts, seed)
    elif params_path(path).is_file():
        constants = load_params(params_path(path))
    elif sidecar_path(path).is_file():
        constants = load_constants_sidecar(sidecar_path(path), seed)
    mod = parse_module(text, name, constants)
    synthesised = constants is not None and (
        (consts is not None and Path(consts).suffix != ".npz")
        or (consts is None and not params_path(path).is_file())
    )
    return _positive_variances(mod) if synthesised else mod


def _positive_variances(mod: IRModule) -> IRModule:
    """Make synthesised batch-norm variances positive.

    Random normal samples are fine for weights, but a negative `moving_var` makes
    `sqrt(var + eps)` NaN, and a program full of NaNs tests nothing. Real parameter files are
    never touched.
    """
    fixed: dict[int, Constant] = {}

    def fix(_orig: Expr, new: Expr) -> Expr:
        if isinstance(new, Call) and new.op_name == "nn.batch_norm" and len(new.args) == 5:
            var = new.args[4]
            if isinstance(var, Constant) and var.data.dtype.kind == "f":
                if id(var) not in fixed:
                    fixed[id(var)] = Constant((np.abs(var.data) + 0.5).astype(var.data.dtype))
                return Call(new.op, (*new.args[:4], fixed[id(var)]), new.attrs, new.span)
        return new

    def fixed_function(_name: str, func: Function) -> Function:
        out = rewrite(func, fix)
        assert isinstance(out, Function)  # a rewrite of a function is a function
        return out

    return mod.map_functions(fixed_function)
