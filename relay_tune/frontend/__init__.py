"""Model importers: ONNX -> Relay module, and the parameter files written beside imported models.

    from relay_tune.frontend import from_onnx
    mod, params = from_onnx("model.onnx", shape_overrides={"input": (1, 3, 224, 224)})

The ONNX importer itself (`relay_tune.frontend.onnx`) is loaded on first use, so importing this
package (the text loader does, for parameter files) does not require the `onnx` package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from relay_tune.frontend.params import PARAMS_SUFFIX, ParamsFileError, load_params, params_path, save_params

if TYPE_CHECKING:
    from relay_tune.ir.module import IRModule

__all__ = ["PARAMS_SUFFIX", "ParamsFileError", "from_onnx", "load_onnx", "load_params", "params_path", "save_params"]


def from_onnx(
    model_or_path: Any, shape_overrides: Mapping[str, Sequence[int]] | None = None
) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Import an ONNX model (an `onnx.ModelProto` or a path): `(module, params)`.

    See `relay_tune.frontend.onnx.from_onnx`.
    """
    # optional dependency: relay_tune.frontend.onnx imports onnx (`pip install 'relay-tune[onnx]'`)
    from relay_tune.frontend.onnx import from_onnx as _from_onnx

    if isinstance(model_or_path, str):
        model_or_path = Path(model_or_path)
    return _from_onnx(model_or_path, shape_overrides)


def load_onnx(path: str | Path) -> Any:
    """Read an ONNX file into an `onnx.ModelProto`; a missing or unreadable file is one `RelayTuneError`."""
    # optional dependency: relay_tune.frontend.onnx imports onnx (`pip install 'relay-tune[onnx]'`)
    from relay_tune.frontend.onnx import read_model

    return read_model(Path(path))
