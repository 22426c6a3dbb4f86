"""The task protocol: what the tuner needs from one tunable workload, and what a build hands to the runner.

A `TuneTask` is one distinct fused workload (e.g. a dense + bias + relu with fixed shapes) on one target. The
tuner never looks inside it: it asks for the search space, builds configs into `BuildArtifact`s, and checks the
kernel's outputs against the task's numpy `reference`.

Tasks travel to builder worker processes, so they must be picklable (module-level classes; no lambdas).

Kernel calling convention for artifacts: a C-ABI function `kernel_name(void *arg0, void *arg1, ...)` taking one
pointer per `KernelArg`, in order, returning `void` (or `int32`, 0 meaning success, when `returns_status`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from search_space import Config, InvalidConfigError, Space

__all__ = [
    "ArgRole",
    "BuildArtifact",
    "InvalidConfigError",
    "KernelArg",
    "LayoutStep",
    "TensorSpec",
    "TuneTask",
    "apply_layout",
]

ArgRole = Literal["input", "output", "scratch"]
CodeFormat = Literal["elf-object", "shared-library"]


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    # Test inputs of this tensor must be non-negative (the domain of a variance under a square root, say).
    nonnegative: bool = False
    # Test floats of this tensor are scaled by this (recurrent weights at a trained layer's scale: at +-1 a layer of
    # hundreds of units is chaotic, and float rounding that differs from the reference's grows over the steps).
    scale: float = 1.0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class LayoutStep:
    """One numpy step of a layout change between a logical tensor and a kernel buffer.

    op: "pad" (arg: ((before, after), ...) per axis), "reshape" (arg: new shape), "transpose" (arg: axes),
    "slice" (arg: stop per axis; keeps [0, stop)), "astype" (arg: (dtype,)).
    """

    op: Literal["pad", "reshape", "transpose", "slice", "astype"]
    arg: tuple[Any, ...]


def apply_layout(array: np.ndarray, steps: Sequence[LayoutStep]) -> np.ndarray:
    """Apply layout steps in order; the result is C-contiguous, with the steps' shape (0-d stays 0-d)."""
    out = np.asarray(array)  # a numpy scalar (a 0-d reference value) as a 0-d array
    for step in steps:
        if step.op == "pad":
            out = np.pad(out, [tuple(p) for p in step.arg])
        elif step.op == "reshape":
            out = out.reshape(step.arg)
        elif step.op == "transpose":
            out = out.transpose(step.arg)
        elif step.op == "slice":
            out = out[tuple(slice(0, stop) for stop in step.arg)]
        elif step.op == "astype":
            out = out.astype(step.arg[0])
        else:
            raise ValueError(f"unknown layout step {step.op!r}")
    # not np.ascontiguousarray: it returns at least one dimension, and a scalar's kernel argument is 0-d
    return out if out.flags.c_contiguous else np.ascontiguousarray(out)


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument.

    `role` "input": logical input `index`, transformed by `layout` (e.g. weight pre-packing, done ahead of time
    and not timed). "output": logical output `index`; `layout` maps the kernel buffer back to the logical
    layout for checking. "scratch": a workspace buffer, zero-filled.
    """

    spec: TensorSpec
    role: ArgRole
    index: int = 0
    layout: tuple[LayoutStep, ...] = ()


@dataclass(frozen=True)
class BuildArtifact:
    """A compiled candidate kernel: picklable plain data, loadable in any process.

    `code` holds relocatable object code ("elf-object", e.g. llvmlite's `TargetMachine.emit_object`) or a
    shared library image ("shared-library"). `requires_libraries` names shared libraries whose symbols the code
    uses (e.g. "libgomp.so.1" for OpenMP); the loader makes them visible first. `repeat_symbol`, when set, names
    a companion `void f(void **args, int64 n)` that calls the kernel n times back to back; timing loops then run
    without Python between calls.

    `prologue` names kernels of the same code that run before the kernel on every call, as the model runs them:
    (symbol, logical input index, kernel argument position) packs that input, a weight the model receives at run
    time, into the layout the kernel reads (argument `position`). The runner times prologue and kernel together,
    so a schedule that packs a run-time weight pays for the packing in its measurement.
    """

    code: bytes
    code_format: CodeFormat
    kernel_name: str
    args: tuple[KernelArg, ...]
    returns_status: bool = False
    requires_libraries: tuple[str, ...] = ()
    repeat_symbol: str | None = None
    info: dict[str, Any] = field(default_factory=dict, compare=False)
    prologue: tuple[tuple[str, int, int], ...] = ()


@runtime_checkable
class TuneTask(Protocol):
    """One tunable workload. Implementations are plain picklable objects (dataclasses work well).

    key: stable workload key (structural, name-independent); description: human-readable summary;
    flops: floating-point operations of one kernel call; weight: occurrences in the model;
    target: target string; space: the schedule search space. Optional: `weight_inputs`, the logical inputs that
    are model constants (weights), which a runner measuring with cold weights rotates through copies.
    """

    key: str
    description: str
    flops: float
    weight: int
    target: str
    space: Space

    def build(self, config: Config) -> BuildArtifact:
        """Compile one config. Raise `InvalidConfigError` to reject it; any other exception is a compile error."""
        ...

    def default_config(self) -> Config:
        """The hand-written fallback schedule (used when nothing is tuned, and as the speedup baseline)."""
        ...

    def input_specs(self) -> Sequence[TensorSpec]:
        """Shapes and dtypes of the logical inputs, in order."""
        ...

    def reference(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray] | None:
        """Expected logical outputs for `inputs` (numpy), or None to skip the correctness check."""
        ...
