"""Input shapes given on the command line (`--shape NAME=D0,D1,...`): checked against a model's inputs and applied.

A model's inputs are described as `InputDims`: per input name its dimensions, each a known size (an int) or the
name of a symbolic one (`"N"`, `"batch"`; `"?"` where the model names none), or None for an input declared without
a shape. ONNX models give their inputs' dims in
the graph; Relay text gives `?` for a dimension the program leaves open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relay_tune.errors import RelayTuneError
from relay_tune.ir.expr import Function, Var
from relay_tune.ir.module import IRModule
from relay_tune.ir.traversal import substitute
from relay_tune.ir.types import TensorType

Dim = int | str
InputDims = dict[str, tuple[Dim, ...] | None]  # None: declared without a shape (not even a rank)

SHAPE_FLAG = "--shape NAME=D0,D1,..."


class InputShapeError(RelayTuneError):
    """A shape given for a model input does not fit the model, or an input's shape is still unknown."""


def format_dims(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def onnx_input_dims(model: Any) -> InputDims:
    """The dims of an `onnx.ModelProto`'s graph inputs (initializers left out): each a known size, else its
    symbolic name, else `?` (some exporters write an open size as -1); None for an input declared without a shape."""
    initializers = {t.name for t in model.graph.initializer}
    dims: InputDims = {}
    for value_info in model.graph.input:
        if value_info.name in initializers or not value_info.type.HasField("tensor_type"):
            continue
        tensor_type = value_info.type.tensor_type
        if not tensor_type.HasField("shape"):
            dims[value_info.name] = None
            continue
        dims[value_info.name] = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
            for d in tensor_type.shape.dim
        )
    return dims


def relay_input_dims(func: Function) -> InputDims:
    """The dims of a Relay function's tensor parameters (`?` for a dimension left open)."""
    return {p.name_hint: tuple(d if isinstance(d, int) else "?" for d in p.type_annotation.shape)
            for p in func.params if isinstance(p.type_annotation, TensorType)}


def unknown_dims(dims: InputDims) -> InputDims:
    """The inputs that still have a dimension of unknown size (or no shape at all)."""
    return {name: shape for name, shape in dims.items()
            if shape is None or not all(isinstance(d, int) for d in shape)}


def check_shapes(dims: InputDims, shapes: Mapping[str, Sequence[int]], model: str) -> None:
    """Raise `InputShapeError` unless each given shape names an input of the model, has its rank and keeps its
    known sizes."""
    for name, shape in shapes.items():
        if name not in dims:
            raise InputShapeError(f"{model}: --shape {name}=...: the model has no input {name!r} "
                                  f"(inputs: {', '.join(dims) or 'none'})")
        known = dims[name]
        if known is None:  # declared without a shape: any shape fits
            continue
        if len(known) != len(shape):
            raise InputShapeError(f"{model}: --shape {name}={','.join(map(str, shape))} gives {len(shape)} "
                                  f"dimension(s); input {name!r} has {len(known)}: {format_dims(known)}")
        conflicts = [i for i, (have, want) in enumerate(zip(known, shape)) if isinstance(have, int) and have != want]
        if conflicts:
            raise InputShapeError(f"{model}: --shape {name}={','.join(map(str, shape))} changes the fixed size of "
                                  f"dimension {conflicts[0]} of input {name!r} {format_dims(known)}")


def require_known_shapes(dims: InputDims, model: str, why: str = "compiling needs every input's shape") -> None:
    """Raise one `InputShapeError` listing every input whose shape is not fully known, and the flag that fixes it;
    `why` says what needs the sizes."""
    unknown = unknown_dims(dims)
    if not unknown:
        return
    listed = "; ".join(f"{name} {'(no shape)' if shape is None else format_dims(shape)}"
                       for name, shape in unknown.items())
    # the example fills each unknown size with 1 (a batch of one, the common case); a rankless input gets the pattern
    example = " ".join(f"--shape {name}=" + ("D0,D1,..." if shape is None else
                                             ",".join(str(d) if isinstance(d, int) else "1" for d in shape))
                       for name, shape in unknown.items())
    raise InputShapeError(f"{model}: {why}; unknown dimensions in: {listed}. Give them "
                          f"with {SHAPE_FLAG} (repeatable), e.g. {example}")


def with_input_shapes(mod: IRModule, shapes: Mapping[str, Sequence[int]]) -> IRModule:
    """`mod` with the given `@main` parameters retyped to these shapes (same dtype); types are inferred anew."""
    if not shapes:
        return mod
    main = mod["main"]
    mapping: dict[Var, Any] = {}
    params = []
    for param in main.params:
        ty = param.type_annotation
        if param.name_hint in shapes and isinstance(ty, TensorType):
            new = Var(param.name_hint, TensorType(tuple(int(d) for d in shapes[param.name_hint]), ty.dtype),
                      param.span)
            mapping[param] = new
            params.append(new)
        else:
            params.append(param)
    # The return type is left to inference: it may name the dimensions fixed here.
    func = Function(tuple(params), substitute(main.body, mapping), None, main.attrs, main.type_params, main.span)
    return mod.with_function("main", func)
