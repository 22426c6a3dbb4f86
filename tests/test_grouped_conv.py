"""Grouped (not depthwise) NCHW convolutions: the `group_conv2d_nchw` family (search_space.families.group_conv).

Every kernel is compiled and compared with the reference interpreter on random non-zero inputs: groups 2, 3, 4 and
8, channel counts that are not multiples of the vector width, 1x1 and 3x3 kernels, strides 1 and 2, a bias+relu
epilogue; the default config and random configs of the space. Also: the default channel tile stays inside one
group, and a whole ShuffleNet-style block compiles to the interpreter's result.
"""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import evaluate
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space import Config
from search_space.families.common import inner_factor

HOST = resolve_target("llvm -num-cores=2")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")  # for default configs inspected, never run
RNG = np.random.default_rng(5)


def grouped_task(cin: int, cout: int, groups: int, size: tuple[int, int], kernel: int = 1, stride: int = 1,
                 target: object = HOST) -> RelayTuneTask:
    """The fused conv2d+bias+relu task of a grouped convolution with constant weights."""
    height, width = size
    pad = kernel // 2
    source = f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {height}, {width}), float32],
          %w: Tensor[({cout}, {cin // groups}, {kernel}, {kernel}), float32], %b: Tensor[({cout}), float32]) {{
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}],
                                groups={groups}, channels={cout}, kernel_size=[{kernel}, {kernel}]), %b))
}}"""
    mod = infer_types(parse_module(source))
    weights = {"w": (RNG.standard_normal((cout, cin // groups, kernel, kernel))).astype("float32"),
               "b": RNG.standard_normal(cout).astype("float32")}
    tasks = [t for t in tasks_from_module(infer_types(bind_params(mod, weights)), target, layout_planning=False)
             if t.family != "injective"]
    assert len(tasks) == 1 and tasks[0].family == "group_conv2d_nchw", [t.family for t in tasks]
    return tasks[0]


def check(task: RelayTuneTask, config: Config) -> None:
    task.space.validate(config)
    inputs = [(RNG.standard_normal(spec.shape) + 0.1).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None
    got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
    np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4, err_msg=f"{task.description} {config}")


SHAPES = [  # (C_in, C_out, groups, (H, W), kernel, stride): ShuffleNet v1's shapes and odd ones
    (24, 36, 3, (14, 14), 1, 1), (68, 68, 4, (7, 7), 1, 1), (30, 18, 2, (9, 13), 1, 1), (40, 56, 8, (11, 5), 1, 1),
    (12, 20, 4, (13, 13), 3, 1), (18, 27, 3, (10, 9), 3, 2), (16, 24, 8, (15, 15), 1, 2), (42, 30, 2, (27, 27), 1, 1),
]


@pytest.mark.parametrize(("cin", "cout", "groups", "size", "kernel", "stride"), SHAPES)
def test_default_kernel_matches_the_interpreter(cin: int, cout: int, groups: int, size: tuple[int, int],
                                                kernel: int, stride: int) -> None:
    task = grouped_task(cin, cout, groups, size, kernel, stride)
    config = task.default_config()
    assert (cout // groups) % inner_factor(config, "tile_c") == 0, config
    check(task, config)


@pytest.mark.parametrize(("cin", "cout", "groups", "size", "kernel", "stride"), SHAPES[::2])
def test_random_configs_match_the_interpreter(cin: int, cout: int, groups: int, size: tuple[int, int],
                                              kernel: int, stride: int) -> None:
    task = grouped_task(cin, cout, groups, size, kernel, stride)
    rng = np.random.default_rng(cin * cout)
    for _ in range(3):
        config = task.space.sample(rng)
        assert (cout // groups) % inner_factor(config, "tile_c") == 0, config
        check(task, config)


@pytest.mark.parametrize("target", [HOST, AVX512], ids=["host", "avx512"])
def test_default_channel_tiles_never_cross_a_group(target: object) -> None:
    for cin, cout, groups, size, kernel, stride in SHAPES:
        task = grouped_task(cin, cout, groups, size, kernel, stride, target=target)
        config = task.default_config()
        task.space.validate(config)
        assert (cout // groups) % inner_factor(config, "tile_c") == 0, (task.description, config)
        across = next(t for t in range(2, 9) if (cout // groups) % t)
        assert not task.space.is_valid(config.replace(tile_c=(-(-cout // across), across)))


SHUFFLE_BLOCK = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 36, 11, 9), float32], %w1: Tensor[(36, 12, 1, 1), float32],
          %wd: Tensor[(36, 1, 3, 3), float32],
          %w2: Tensor[(36, 12, 1, 1), float32]) {
  %0 = nn.relu(nn.conv2d(%x, %w1, groups=3, channels=36, kernel_size=[1, 1]));
  %1 = reshape(%0, newshape=[1, 3, 12, 11, 9]);
  %2 = transpose(%1, axes=[0, 2, 1, 3, 4]);
  %3 = reshape(%2, newshape=[1, 36, 11, 9]);
  %4 = nn.conv2d(%3, %wd, padding=[1, 1, 1, 1], groups=36, channels=36, kernel_size=[3, 3]);
  %5 = nn.conv2d(%4, %w2, groups=3, channels=36, kernel_size=[1, 1]);
  nn.relu(add(%5, %x))
}"""


def test_shufflenet_block_compiles_to_the_interpreters_result() -> None:
    mod = infer_types(parse_module(SHUFFLE_BLOCK))
    params = {"w1": RNG.standard_normal((36, 12, 1, 1)).astype("float32"),
              "wd": RNG.standard_normal((36, 1, 3, 3)).astype("float32"),
              "w2": RNG.standard_normal((36, 12, 1, 1)).astype("float32")}
    model = relay_tune.build(mod, target=HOST, params=params)
    x = RNG.standard_normal((1, 36, 11, 9)).astype("float32")
    expected = evaluate(mod, {"x": x, **params})
    got = model.run(x=x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-4, atol=1e-4)
