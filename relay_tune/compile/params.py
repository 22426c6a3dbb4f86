"""Weights as constants: binding entry-function inputs to values, and reading them from `.npz` files."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError
from relay_tune.ir import Constant, Expr, Function, IRModule, TensorType, Var, substitute


def bind_params(mod: IRModule, params: Mapping[str, Any], entry: str = "main") -> IRModule:
    """Replace entry-function parameters named in `params` by constants (weights become foldable and packable).

    A weight that is an input is packed into the layout its kernel's schedule reads by a packing kernel on every
    run; bound as a constant, it is packed once, at build time, and the packing kernel disappears."""
    if not params:
        return mod
    func = mod[entry]
    by_name = {p.name_hint: p for p in func.params}
    unknown = [n for n in params if n not in by_name]
    if unknown:
        raise RelayTuneError(
            f"params name unknown input(s) {', '.join(map(repr, unknown))}; the inputs of @{entry} are "
            + ", ".join(f"%{n}" for n in by_name)
        )
    mapping: dict[Var, Expr] = {}
    for name, value in params.items():
        param = by_name[name]
        ty = param.checked_type if param.has_type() else param.type_annotation
        array = np.asarray(value)
        if isinstance(ty, TensorType):
            if str(array.dtype) != ty.dtype:
                raise RelayTuneError(f"param {name!r}: expected dtype {ty.dtype} ({ty}), got {array.dtype}")
            if ty.is_static and ty.static_shape != array.shape:
                raise RelayTuneError(f"param {name!r}: expected shape {ty.shape} ({ty}), got {array.shape}")
        mapping[param] = Constant(array)
    body = substitute(func.body, mapping)
    new_params = tuple(p for p in func.params if p not in mapping)
    new_func = Function(new_params, body, func.ret_type, func.attrs, func.type_params)
    return mod.with_function(entry, new_func)


def read_params(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Values for entry-function inputs from an `.npz` file, keyed by input name (read without pickling), for
    `bind_params` (`relay-tune ... --params weights.npz`)."""
    if not os.path.isfile(path):
        raise RelayTuneError(f"params file {os.fspath(path)}: no such file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: np.asarray(archive[name]) for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise RelayTuneError(f"params file {os.fspath(path)}: not a readable .npz archive ({err})") from None
