"""Grouped (not depthwise) NCHW convolutions: the `group_conv2d_nchw` family (search_space.families.group_conv).

Every kernel is compiled and compared with the reference interpreter on random non-zero inputs: groups 2, 3, 4 and
8, channel counts that are not multiples of the vector width, 1x1 and 3x3 kernels, strides 1 and 2, a bias+relu
epilogue; the default config and random configs of the space. Also: the default channel tile stays inside one
group; a channel shuffle (reshape, transpose, reshape) feeding a padded depthwise convolution fuses into it, so
no shuffle kernel is left in the plan, and the fused kernel matches the interpreter under random configs; a stem
feeding grouped convolutions is not blocked; a whole ShuffleNet-style block compiles to the interpreter's result.
"""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import evaluate
from relay_tune.passes.fuse_ops import is_channel_shuffle, is_channel_shuffle_into_padded_depthwise
from relay_tune.passes.plan_layouts import plan_function
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


def test_channel_shuffle_fuses_into_the_depthwise_convolution_and_its_kernel_disappears() -> None:
    mod = infer_types(parse_module(SHUFFLE_BLOCK))
    params = {"w1": RNG.standard_normal((36, 12, 1, 1)).astype("float32"),
              "wd": RNG.standard_normal((36, 1, 3, 3)).astype("float32"),
              "w2": RNG.standard_normal((36, 12, 1, 1)).astype("float32")}
    tasks = tasks_from_module(infer_types(bind_params(mod, params)), HOST)
    descriptions = [t.description for t in tasks]
    assert not any(d.startswith("reshape+transpose+reshape ") for d in descriptions), descriptions
    fused = [t for t in tasks if t.description.startswith("reshape+transpose+reshape+conv2d")]
    assert len(fused) == 1 and fused[0].family == "depthwise_conv2d_nchw", descriptions
    assert sum(t.family == "group_conv2d_nchw" for t in tasks) == 2, descriptions
    model = relay_tune.build(mod, target=HOST, params=params)
    assert not any(t.description.startswith("reshape+transpose+reshape ") for t in model.plan.tasks)


SHUFFLED_DEPTHWISE = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, {c}, {h}, {w}), float32], %wd: Tensor[({c}, 1, 3, 3), float32]) {{
  %1 = reshape(%x, newshape=[1, {g}, {og}, {h}, {w}]);
  %2 = transpose(%1, axes=[0, 2, 1, 3, 4]);
  %3 = reshape(%2, newshape=[1, {c}, {h}, {w}]);
  nn.conv2d(%3, %wd, strides=[{s}, {s}], padding=[1, 1, 1, 1], groups={c}, channels={c}, kernel_size=[3, 3])
}}"""


@pytest.mark.parametrize(("channels", "groups", "size", "stride"), [(36, 3, (11, 9), 1), (40, 8, (14, 14), 2),
                                                                    (20, 4, (7, 13), 1)])
def test_fused_shuffle_and_depthwise_configs_match_the_interpreter(channels: int, groups: int,
                                                                   size: tuple[int, int], stride: int) -> None:
    height, width = size
    source = SHUFFLED_DEPTHWISE.format(c=channels, g=groups, og=channels // groups, h=height, w=width, s=stride)
    weight = RNG.standard_normal((channels, 1, 3, 3)).astype("float32")
    mod = infer_types(bind_params(infer_types(parse_module(source)), {"wd": weight}))
    tasks = tasks_from_module(mod, HOST)
    assert len(tasks) == 1 and tasks[0].family == "depthwise_conv2d_nchw", [t.description for t in tasks]
    task = tasks[0]
    check(task, task.default_config())
    rng = np.random.default_rng(channels)
    for _ in range(4):
        check(task, task.space.sample(rng))


def test_only_channel_permutations_count_as_shuffles() -> None:
    def first_arg_of_conv(source: str) -> tuple[object, object]:
        mod = infer_types(parse_module(source))
        conv = mod["main"].body
        return conv.args[0], conv

    shuffle, conv = first_arg_of_conv(SHUFFLED_DEPTHWISE.format(c=12, g=3, og=4, h=5, w=6, s=1))
    assert is_channel_shuffle(shuffle) and is_channel_shuffle_into_padded_depthwise(shuffle, conv)
    # rows and columns swapped (a square map keeps the shape): not a channel permutation
    spatial, conv = first_arg_of_conv("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 12, 5, 5), float32], %wd: Tensor[(12, 1, 3, 3), float32]) {
  nn.conv2d(transpose(%x, axes=[0, 1, 3, 2]), %wd, padding=[1, 1, 1, 1], groups=12, channels=12, kernel_size=[3, 3])
}""")
    assert not is_channel_shuffle(spatial) and not is_channel_shuffle_into_padded_depthwise(spatial, conv)
    # a reshape that moves half of each plane into another channel
    mixed, _ = first_arg_of_conv("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 12, 4, 6), float32], %wd: Tensor[(12, 1, 3, 3), float32]) {
  %1 = reshape(%x, newshape=[1, 12, 2, 12]);
  %2 = transpose(%1, axes=[0, 2, 1, 3]);
  nn.conv2d(reshape(%2, newshape=[1, 12, 4, 6]), %wd, padding=[1, 1, 1, 1], groups=12, channels=12,
            kernel_size=[3, 3])
}""")
    assert not is_channel_shuffle(mixed)


def test_a_stem_that_feeds_grouped_convolutions_stays_nchw() -> None:
    mod = infer_types(parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 3, 32, 32), float32], %w0: Tensor[(24, 3, 3, 3), float32],
          %w1: Tensor[(24, 8, 1, 1), float32]) {
  %0 = nn.relu(nn.conv2d(%x, %w0, strides=[2, 2], padding=[1, 1, 1, 1], channels=24, kernel_size=[3, 3]));
  %1 = nn.max_pool2d(%0, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1]);
  nn.relu(nn.conv2d(%1, %w1, groups=3, channels=24, kernel_size=[1, 1]))
}"""))
    planned = plan_function(mod["main"], block=8)
    assert planned is mod["main"]  # nothing blocked: no layout_transform into the grouped convolution


def test_the_experiment_times_grouped_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.__main__ import main

    assert main(["grouped-conv", "--kernels", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("reduction") == 5 and "differs" not in out
