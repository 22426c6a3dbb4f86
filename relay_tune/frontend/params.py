"""Parameter files: the values behind `meta[relay.Constant][i]`, stored beside a `.relay` file.

A model imported from ONNX is written as readable Relay text (`model.relay`) in which every weight is a
`meta[relay.Constant][i]` reference, plus `model.params.npz` holding those values: an ordinary numpy
`.npz` archive with one array per constant, named `const_0`, `const_1`, ... in meta order. It is read
with `allow_pickle=False`, so a parameter file can never run code.

This module only needs numpy, so the text loader can use it without importing ONNX.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from relay_tune.errors import RelayTuneError

PARAMS_SUFFIX = ".params.npz"
_KEY = re.compile(r"const_(\d+)")


class ParamsFileError(RelayTuneError):
    """A parameter file that cannot be read or does not follow the `const_i` naming."""


def params_path(relay_path: str | Path) -> Path:
    """`model.relay` -> `model.params.npz` (same folder)."""
    path = Path(relay_path)
    return path.with_name(path.stem + PARAMS_SUFFIX)


def param_key(index: int) -> str:
    return f"const_{index}"


def params_dict(constants: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """`{"const_0": constants[0], ...}`: the meta-ordered constants under their file keys."""
    return {param_key(i): np.asarray(c) for i, c in enumerate(constants)}


def save_params(path: str | Path, constants: Sequence[np.ndarray]) -> Path:
    """Write `constants` (meta order) as an uncompressed `.npz`; returns the path written."""
    path = Path(path)
    # np.savez appends `.npz` to names that lack it; write through a file object to keep the name as given.
    with path.open("wb") as handle:
        np.savez(handle, **params_dict(constants))
    return path


def load_params(path: str | Path) -> list[np.ndarray]:
    """The constants of a parameter file, in meta order (`const_0` first).

    The keys must be exactly `const_0 .. const_{n-1}`; anything else (a missing index, a stray array,
    an object array that would need pickle) is a `ParamsFileError` naming the file.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise ParamsFileError(f"{path}: cannot read parameter file: {err}") from None
    indices: dict[int, np.ndarray] = {}
    for name, array in arrays.items():
        match = _KEY.fullmatch(name)
        if match is None:
            raise ParamsFileError(f"{path}: unexpected array {name!r} (parameter files hold const_0, const_1, ...)")
        indices[int(match.group(1))] = array
    missing = sorted(set(range(len(indices))) - set(indices))
    if missing:
        raise ParamsFileError(f"{path}: {param_key(missing[0])} is missing ({len(indices)} arrays present)")
    return [indices[i] for i in range(len(indices))]
