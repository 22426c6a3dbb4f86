"""GPU schedule spaces: the knobs of `search_space.gpu_template` per operator family, with the launch limits
as constraints, so that impossible configs are rejected before anything is built.

    space = gpu_space(prim, "sm_90")          # prim: relay_tune.kernel.compute.primitive_compute(func)
    params = config_to_params(prim, config)   # -> MatmulParams / ConvParams / FlatParams

Families and knobs:

- matmul with shared-memory staging: `tile_m` / `tile_n` split the output rows / columns into (blocks, threads,
  per-thread) with exact divisors (the schedule needs tiles that divide the output); `tile_k` is the reduction
  step staged per barrier, `vector` the width of the cooperative global loads, `unroll_k` unrolls the step.
  Constraints: threads per block in [16, 1024]; shared memory (both operand tiles) within the architecture's
  limit (227 KiB on sm_90, 48 KiB where unknown); an estimated register count (accumulators, operands and
  addressing) within 255 per thread and 64 K per block; `vector` dividing `tile_k` and the reduction length.
- matmul without divisor tilings ("direct"): `tile_m` / `tile_n` any sizes (tails are guarded), no shared memory.
- conv: `tile_c` / `tile_w` split output axis 1 (channels in NCHW) and axis 3 (columns) into (blocks, threads,
  per-thread); threads per block in [1, 1024], per-thread tile at most 64 accumulators.
- flat: `threads` per block and `work` elements per thread.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import max_shared_bytes
from relay_tune.kernel.schedule import Schedule
from search_space.config import Config, InvalidConfigError
from search_space.gpu_template import (
    ConvParams,
    FlatParams,
    MatmulParams,
    anchor_stage,
    default_params,
    family_of,
    gpu_schedule,
    matmul_dims,
)
from search_space.knobs import BoolKnob, ChoiceKnob, Knob, SplitKnob
from search_space.space import Constraint, Space

__all__ = [
    "MAX_REGISTERS_PER_THREAD",
    "MAX_THREADS_PER_BLOCK",
    "REGISTERS_PER_BLOCK",
    "config_to_params",
    "default_config",
    "steps_of_prim",
    "estimate_registers",
    "gpu_space",
]

MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_THREAD = 255
REGISTERS_PER_BLOCK = 65536
_REGISTER_OVERHEAD = 24  # indices, addresses and loop counters besides the tile (measured with ptxas: 16-30)


def estimate_registers(thread_m: int, thread_n: int) -> int:
    """Registers of one matmul thread: its accumulator tile, one operand column and row, and overhead."""
    return thread_m * thread_n + thread_m + thread_n + _REGISTER_OVERHEAD


def _family(prim: Any) -> tuple[str, Any]:

    family = family_of(prim)
    anchor = anchor_stage(Schedule(prim.outputs), prim)
    if family == "matmul":
        dims = matmul_dims(anchor)
        return family, dims
    if family == "conv":
        return family, anchor.shape
    return family, None


def _itemsize(prim: Any) -> int:
    dtype = prim.outputs[0].dtype
    digits = "".join(c for c in dtype if c.isdigit())
    return max(1, int(digits) // 8) if digits else 4


def _tile(config: Config, name: str) -> tuple[int, int]:
    """(threads, per-thread) of a 3-level split value (blocks, threads, per-thread)."""
    value = config[name]
    return int(value[1]), int(value[2])  # type: ignore[index]


# -- constraints (module-level functions: spaces travel to worker processes) --------------------------------------


def _threads_ok(config: Config, low: int) -> bool:
    ty, _ = _tile(config, "tile_m")
    tx, _ = _tile(config, "tile_n")
    return low <= ty * tx <= MAX_THREADS_PER_BLOCK


def _divides_output(config: Config, m: int, n: int) -> bool:
    ty, tm = _tile(config, "tile_m")
    tx, tn = _tile(config, "tile_n")
    return m % (ty * tm) == 0 and n % (tx * tn) == 0


def _shared_fits(config: Config, limit: int, itemsize: int) -> bool:
    ty, tm = _tile(config, "tile_m")
    tx, tn = _tile(config, "tile_n")
    bk = int(config["tile_k"])  # type: ignore[arg-type]
    return (ty * tm + tx * tn) * bk * itemsize <= limit


def _registers_ok(config: Config) -> bool:
    ty, tm = _tile(config, "tile_m")
    tx, tn = _tile(config, "tile_n")
    regs = estimate_registers(tm, tn)
    return regs <= MAX_REGISTERS_PER_THREAD and regs * ty * tx <= REGISTERS_PER_BLOCK


def _vector_ok(config: Config, k: int) -> bool:
    vector = int(config["vector"])  # type: ignore[arg-type]
    bk = int(config["tile_k"])  # type: ignore[arg-type]
    return bk % vector == 0 and k % vector == 0


def _conv_ok(config: Config) -> bool:
    tc, pc = _tile(config, "tile_c")
    tw, pw = _tile(config, "tile_w")
    return 1 <= tc * tw <= MAX_THREADS_PER_BLOCK and pc * pw <= 64


# -- spaces ----------------------------------------------------------------------------------------------------------


def gpu_space(prim: Any, arch: str = "sm_90") -> Space:
    """The search space of a fused function's GPU schedule (see the module docstring)."""

    family, dims = _family(prim)
    if family == "matmul":
        _, m, n, k = dims
        if getattr(default_params(prim), "shared", False):  # the shapes admit divisor tilings
            # the default's reduction step (16 where nothing divides) is always a choice
            k_choices = sorted({c for c in (4, 8, 16, 32, 64) if c <= k and k % c == 0}
                               | {getattr(default_params(prim), "block_k", 16)})
            knobs: list[Knob] = [
                ChoiceKnob("family", ["matmul"]),
                SplitKnob("tile_m", m, levels=3, policy="factors", max_factor=64),
                SplitKnob("tile_n", n, levels=3, policy="factors", max_factor=128),
                ChoiceKnob("tile_k", k_choices),
                ChoiceKnob("vector", [1, 2, 4]),
                BoolKnob("unroll_k"),
            ]
            constraints = [
                # 16 at least: the default takes half-warp blocks where the output has no larger divisor tiling
                Constraint("threads per block in [16, 1024]", functools.partial(_threads_ok, low=16)),
                Constraint("tiles divide the output", functools.partial(_divides_output, m=m, n=n)),
                Constraint("shared memory fits", functools.partial(
                    _shared_fits, limit=max_shared_bytes(arch), itemsize=_itemsize(prim))),
                Constraint("registers fit", _registers_ok),
                Constraint("vector width divides the reduction", functools.partial(_vector_ok, k=k)),
            ]
            return Space(knobs, constraints)
        knobs = [
            ChoiceKnob("family", ["matmul_direct"]),
            SplitKnob("tile_m", m, levels=3, policy="verbose", max_factor=64),
            SplitKnob("tile_n", n, levels=3, policy="verbose", max_factor=128),
        ]
        return Space(knobs, [Constraint("threads per block in [1, 1024]", functools.partial(_threads_ok, low=1)),
                             Constraint("registers fit", _registers_ok)])
    if family == "conv":
        _, c, _, w = dims
        knobs = [
            ChoiceKnob("family", ["conv"]),
            SplitKnob("tile_c", c, levels=3, policy="verbose", max_factor=64),
            SplitKnob("tile_w", w, levels=3, policy="verbose", max_factor=64),
        ]
        return Space(knobs, [Constraint("threads per block and tile size", _conv_ok)])
    return Space([ChoiceKnob("family", ["flat"]), ChoiceKnob("threads", [32, 64, 128, 256, 512, 1024]),
                  ChoiceKnob("work", [1, 2, 4])])


def config_to_params(prim: Any, config: Config) -> Any:
    """The `search_space.gpu_template` parameters of a config of `gpu_space(prim)`."""

    family = config.get("family")
    if family == "matmul":
        ty, tm = _tile(config, "tile_m")
        tx, tn = _tile(config, "tile_n")
        return MatmulParams(ty * tm, tx * tn, tm, tn, int(config["tile_k"]), int(config["vector"]),  # type: ignore
                            bool(config["unroll_k"]), True, True)
    if family == "matmul_direct":
        ty, tm = _tile(config, "tile_m")
        tx, tn = _tile(config, "tile_n")
        return MatmulParams(ty * tm, tx * tn, tm, tn, 16, 1, True, False, False)
    if family == "conv":
        tc, pc = _tile(config, "tile_c")
        tw, pw = _tile(config, "tile_w")
        return ConvParams(pc, pw, tc, tw)
    if family == "flat":
        return FlatParams(int(config["threads"]), int(config["work"]))  # type: ignore[arg-type]
    raise InvalidConfigError(f"not a GPU schedule config: {config!r}")


def default_config(prim: Any, arch: str = "sm_90") -> Config:
    """The config of `gpu_space(prim, arch)` that reproduces `default_gpu_schedule` (the untuned baseline), or
    the nearest valid one."""

    space = gpu_space(prim, arch)
    params = default_params(prim)
    family, dims = _family(prim)

    def split(extent: int, threads: int, inner: int) -> tuple[int, int, int]:
        return (-(-extent // (threads * inner)), threads, inner)

    if isinstance(params, MatmulParams) and family == "matmul":
        _, m, n, _ = dims
        ty, tx = params.block_m // params.thread_m, params.block_n // params.thread_n
        values: dict[str, Any] = {"tile_m": split(m, ty, params.thread_m), "tile_n": split(n, tx, params.thread_n)}
        if params.shared and "tile_k" in space.names:
            values.update(family="matmul", tile_k=params.block_k, vector=params.vector, unroll_k=params.unroll_k)
        else:
            values["family"] = "matmul_direct"
    elif isinstance(params, ConvParams):
        _, c, _, w = dims
        values = {"family": "conv", "tile_c": split(c, params.threads_c, params.tile_c),
                  "tile_w": split(w, params.threads_w, params.tile_w)}
    else:
        values = {"family": "flat", "threads": 256, "work": 1}
    config = Config(values)
    if space.is_valid(config):
        return config
    for candidate in space.enumerate() if (space.count_valid(200_000) or 0) > 0 else ():
        return candidate

    return space.sample(np.random.default_rng(0))


def steps_of_prim(prim: Any, config: Config | Any) -> list[Any]:
    """The schedule steps of a config for a fused function's tensor expressions: the family template
    (`search_space.gpu_template.gpu_schedule`) at the config's parameters. The only way GPU schedules are made:
    the default schedule is this at `default_config(prim)`."""

    if not isinstance(config, Config):
        config = Config(dict(config))
    return gpu_schedule(prim, config_to_params(prim, config))
