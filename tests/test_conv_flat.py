"""Flat mode of the conv2d_nchw template: a 1x1 stride-1 convolution on a narrow map as the matrix product
W[C_out, C_in] x X[C_in, H*W], positions tiled by `tile_p` across row ends (search_space.families.conv2d_nchw).

Every kernel is compiled and compared with the reference interpreter: odd maps (7x7, 13x13, 27x27, 5x3), channel
counts that are not multiples of the vector width, bias+relu and residual-add epilogues, the default config and
random flat configs of the space (tails of every length). Also: which maps the default rule makes flat, the
constraints that keep flat configs apart from the other modes, and configs logged before flat mode existed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space import Config
from search_space.cpu import with_later_knobs
from search_space.decode import config_to_steps
from search_space.families.common import vector_registers
from search_space.families.conv2d_nchw import MAX_FLAT_TILES

HOST = resolve_target("llvm -num-cores=2")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")  # for default configs inspected, never run
RNG = np.random.default_rng(11)


def pointwise_task(cin: int, height: int, cout: int, width: int | None = None, residual: bool = False,
                   target: object = HOST) -> RelayTuneTask:
    """The fused conv2d+bias(+residual add)+relu task of a 1x1 convolution with constant weights."""
    width = width or height
    shape = f"(1, {cout}, {height}, {width})"
    body = f"nn.bias_add(nn.conv2d(%x, %w, channels={cout}, kernel_size=[1, 1]), %b)"
    if residual:
        body = f"add({body}, %r)"
    extra = f", %r: Tensor[{shape}, float32]" if residual else ""
    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {height}, {width}), float32], %w: Tensor[({cout}, {cin}, 1, 1), float32],
          %b: Tensor[({cout}), float32]{extra}) {{
  nn.relu({body})
}}"""
    mod = infer_types(parse_module(source))
    weights = {"w": (RNG.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype("float32"),
               "b": RNG.standard_normal(cout).astype("float32")}
    # layout planning off: channel counts that are multiples of the target's vector (24 on AVX2) would be blocked
    # (NCHW8c) and leave this template
    tasks = [t for t in tasks_from_module(infer_types(bind_params(mod, weights)), target, layout_planning=False)
             if t.family != "injective"]
    assert len(tasks) == 1 and tasks[0].family == "conv2d_nchw"
    return tasks[0]


def flat(config: Config) -> int:
    value = config.get("tile_p")
    assert isinstance(value, tuple)
    return int(value[-1])


def flat_config(task: RelayTuneTask, positions: int = 32) -> Config:
    """The default config, made flat where the default rule keeps row mode (maps of at most four vectors, or wide
    rows on a narrow vector): tiles of `positions`, or more where that needs too many tiles, and as many channels
    per tile as the registers then hold."""
    config = task.default_config()
    if flat(config) > 1:
        return config
    dims, lanes = task.workload.dims, task.workload.lanes
    total = dims["h"] * dims["w"]
    vp = min(positions, total)
    while -(-total // vp) > MAX_FLAT_TILES:
        vp += lanes
    channels = min(int(config["tile_c"][-1]),  # type: ignore[index]
                   task.workload.accumulator_budget // vector_registers(vp, lanes))
    return config.replace(tile_p=(-(-total // vp), vp), tile_h=(dims["h"], 1), tile_w=(1, dims["w"]),
                          tile_c=(-(-dims["c"] // channels), channels), row_vector=False, order="ch",
                          parallel=min(int(config["parallel"]), 1))  # type: ignore[arg-type]


def check(task: RelayTuneTask, config: Config) -> None:
    task.space.validate(config)
    inputs = [RNG.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None
    got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
    np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4, err_msg=f"{task.description} {config}")


SHAPES = [  # (C_in, H, C_out, W): the narrow maps of SqueezeNet, ResNet-50 and MobileNet v2, odd channel counts
    (64, 13, 24, None), (37, 7, 20, None), (24, 27, 10, None), (9, 14, 52, None), (16, 5, 40, 3), (20, 9, 36, 11),
]


@pytest.mark.parametrize(("cin", "height", "cout", "width"), SHAPES)
@pytest.mark.parametrize("residual", [False, True], ids=["bias_relu", "residual"])
def test_default_flat_kernel_matches_the_interpreter(cin: int, height: int, cout: int, width: int | None,
                                                     residual: bool) -> None:
    task = pointwise_task(cin, height, cout, width, residual)
    lanes = task.workload.lanes
    # maps of more than four vectors, narrower than two: flat by default
    if (width or height) < 2 * lanes and height * (width or height) > 4 * lanes:
        assert flat(task.default_config()) > 1, f"{task.description}: {task.default_config()}"
    check(task, flat_config(task))


@pytest.mark.parametrize(("cin", "height", "cout", "width"), SHAPES[:3])
def test_random_flat_configs_match_the_interpreter(cin: int, height: int, cout: int, width: int | None) -> None:
    task = pointwise_task(cin, height, cout, width, residual=True)
    rng = np.random.default_rng(cin * height)
    configs: list[Config] = []
    for _ in range(4000):
        config = task.space.sample(rng)
        if flat(config) > 1 and config not in configs:
            configs.append(config)
        if len(configs) == 4:
            break
    assert len(configs) == 4
    for config in configs:
        check(task, config)


def test_flat_tiles_of_every_tail_length() -> None:
    """169 positions in tiles of 8..64: the last tile holds 1 to 63 positions (a peeled, shorter vector)."""
    task = pointwise_task(20, 13, 12)
    default = task.default_config()
    for vp in (8, 16, 24, 40, 48, 56, 64):
        config = default.replace(tile_p=(-(-169 // vp), vp), tile_c=(3, 4))
        if task.space.is_valid(config):
            check(task, config)


def test_default_rule_keeps_wide_maps_out_of_flat_mode() -> None:
    wide = pointwise_task(16, 56, 24)  # 56-column rows fill vectors already
    assert flat(wide.default_config()) == 1
    side = math.isqrt(4 * HOST.vector_lanes() - 1)  # 7x7 (AVX-512), 5x5 (AVX2): row mode covers it in one tile
    small = pointwise_task(64, side, 24)
    assert flat(small.default_config()) == 1 and small.default_config()["row_vector"]
    one_core = pointwise_task(64, 13, 24, target=resolve_target("llvm -num-cores=1"))
    assert flat(one_core.default_config()) > 1
    # channel blocks are the parallel loop: at least one per core (512 input channels: work above the threshold)
    few = pointwise_task(512, 9, 8, target=resolve_target("llvm -num-cores=4"))
    config = few.default_config()
    assert flat(config) > 1 and int(config["tile_c"][0]) >= 4  # type: ignore[index]


def test_flat_configs_do_not_duplicate_other_modes() -> None:
    task = pointwise_task(64, 13, 24)
    config = task.default_config()
    for change in ({"row_vector": True}, {"tile_h": (7, 2)}, {"tile_w": (2, 8)}, {"order": "hc"},
                   {"parallel": 2}, {"tile_p": (1, 169)}):
        assert not task.space.is_valid(config.replace(**change)), change
    # at most MAX_FLAT_TILES unrolled tiles: 27x27 = 729 positions in tiles of 16 are 46
    wide = pointwise_task(16, 27, 24)
    wide.space.validate(flat_config(wide, positions=48))
    assert not wide.space.is_valid(flat_config(wide, positions=48).replace(tile_p=(46, 16)))
    assert -(-729 // 16) > MAX_FLAT_TILES


def test_configs_logged_before_flat_mode_still_build() -> None:
    """A pointwise config without `tile_p` (logged before flat mode) decodes to the schedule it described."""
    task = pointwise_task(64, 13, 24)
    lanes = task.workload.lanes
    channels = min(int(task.default_config()["tile_c"][-1]),  # type: ignore[index]
                   task.workload.accumulator_budget // vector_registers(13, lanes))  # a 13-column row per channel
    logged = task.default_config().replace(tile_p=(169, 1), order="hc", row_vector=True, parallel=2,
                                           tile_c=(-(-24 // channels), channels))
    task.space.validate(logged)
    old = Config({name: value for name, value in logged.items() if name != "tile_p"})
    assert not task.space.is_valid(old)
    assert with_later_knobs(task.workload, old) == logged
    steps = config_to_steps(task.func, old, task.target_info)
    assert [s.to_json() for s in steps] == [s.to_json() for s in task.steps(logged)]


def conv3x3_task(cin: int, size: int, cout: int, target: object = HOST) -> RelayTuneTask:
    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {size}, {size}), float32], %w: Tensor[({cout}, {cin}, 3, 3), float32],
          %b: Tensor[({cout}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels={cout}, kernel_size=[3, 3]), %b))
}}"""
    weights = {"w": (RNG.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype("float32"),
               "b": RNG.standard_normal(cout).astype("float32")}
    mod = infer_types(bind_params(infer_types(parse_module(source)), weights))
    return next(t for t in tasks_from_module(mod, target) if t.family != "injective")


def test_default_tiles_of_odd_3x3_maps() -> None:
    """13 columns (prime) in balanced pieces of 7 and 6, not 13 tiles of one column; 55 columns in tiles of 48 and
    a tail of 7 (16 + 4 + 2 + 1 registers per channel for a tail of 23 would spill). The tile sizes are those of
    an AVX-512 target (16 lanes, 32 registers); on the host the kernels are checked with the host's own defaults."""
    narrow = conv3x3_task(12, 13, 40, target=AVX512)
    assert narrow.family == "conv2d_nchw_cl" and narrow.default_config()["tile_w"] == (2, 7)
    wide = conv3x3_task(5, 55, 12, target=AVX512)  # fewer output channels than a vector: the sums stay NCHW
    assert wide.family == "conv2d_nchw" and wide.default_config()["tile_w"] == (2, 48)
    for cin, size, cout in ((12, 13, 40), (5, 55, 12)):
        task = conv3x3_task(cin, size, cout)
        pieces, width = task.default_config()["tile_w"]  # type: ignore[misc]
        if task.family == "conv2d_nchw_cl":  # balanced pieces, more than one column each
            assert width > 1 and pieces * width - size < pieces, task.default_config()
        check(task, task.default_config())
