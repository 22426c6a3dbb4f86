"""The CPU family table (search_space.families): every family is reached by real models, computes its default
without building a space, and that default is a point of its space that the public decoder turns into the same
steps as the task's template."""

from __future__ import annotations

import numpy as np
import pytest

from relay_tune.kernel.compute import primitive_compute
from relay_tune.testing import zoo
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space import Config, InvalidConfigError, space
from search_space.cpu import cpu_space, default_config, family_of
from search_space.decode import config_to_steps
from search_space.families import FAMILIES, FAMILY_TABLE, family_for, family_named

TARGETS = ("llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -num-cores=2", "llvm -num-cores=1")

NHWC = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 9, 10, 6), float32], %w: Tensor[(3, 3, 6, 20), float32]) {
  nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=20, kernel_size=[3, 3], data_layout="NHWC",
            kernel_layout="HWIO")
}"""

GROUPED = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 12, 9, 11), float32], %w: Tensor[(24, 4, 3, 3), float32]) {
  nn.conv2d(%x, %w, padding=[1, 1, 1, 1], groups=3, channels=24, kernel_size=[3, 3])
}"""

INT8 = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 8, 9, 11), uint8]) {
  nn.conv2d(%x, meta[relay.Constant][0], padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3], out_dtype="int32")
}"""


def _tasks() -> list[RelayTuneTask]:
    tasks: list[RelayTuneTask] = []
    for target in TARGETS:
        for name in zoo.MODELS:
            for planning in (False, True):
                tasks += tasks_from_module(zoo.small(name), target, layout_planning=planning)
        tasks += tasks_from_module(infer_types(parse_module(NHWC)), target)
        tasks += tasks_from_module(infer_types(parse_module(GROUPED)), target)
        # an 8-bit convolution (what QuantizedProducts makes of a QDQ model's): the packed int8 family
        weight = np.random.default_rng(0).integers(-127, 128, (16, 8, 3, 3)).astype(np.int8)
        tasks += tasks_from_module(infer_types(parse_module(INT8, constants=[weight])), target)
        # Winograd transforms: a 3x3 convolution on a blocked layout, forced on
        tasks += tasks_from_module(zoo.resnet(18, image=28, width=16, num_classes=10), target, layout_planning=True,
                                   winograd="on")
        # a bf16 build: blocked convolutions and the classifier as bf16 products (`conv2d_nchwc_bf16`)
        tasks += tasks_from_module(zoo.resnet(18, image=28, width=16, num_classes=16), target, layout_planning=True,
                                   precision="bf16-emulated")
    return tasks


@pytest.fixture(scope="module")
def tasks() -> list[RelayTuneTask]:
    return _tasks()


def test_the_table_names_each_family_once() -> None:
    assert len(FAMILIES) == len(set(FAMILIES)) == len(FAMILY_TABLE)
    assert all(family_named(name).name == name for name in FAMILIES)
    assert FAMILY_TABLE[-1].name == "reduction"  # the catch-all is asked last
    with pytest.raises(KeyError):
        family_named("conv3d")


def test_every_family_is_reached_by_the_models(tasks: list[RelayTuneTask]) -> None:
    assert tasks
    assert {task.family for task in tasks} == set(FAMILIES)
    for task in tasks[::5]:
        prim = primitive_compute(task.func)
        assert family_for(prim).name == family_of(prim) == task.family, task.description


def test_defaults_are_points_of_their_space(tasks: list[RelayTuneTask]) -> None:
    assert tasks
    for task in tasks:
        default = task.default_config()
        assert default["family"] == task.family
        cpu_space(task.workload).validate(default)
        assert list(default) == [name for name in task.space.names if name in default], task.description


def test_defaults_are_computed_without_building_a_space(tasks: list[RelayTuneTask],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert tasks
    expected = [task.default_config() for task in tasks]

    def no_space(*args: object, **kwargs: object) -> None:
        raise AssertionError("default_config built a Space")

    monkeypatch.setattr(space.Space, "__init__", no_space)
    assert [default_config(task.workload) for task in tasks] == expected


def test_the_public_decoder_gives_the_template_steps(tasks: list[RelayTuneTask]) -> None:
    assert tasks
    for task in tasks[::7]:
        config = task.default_config()
        decoded = config_to_steps(task.func, config.to_dict(), task.target_info)
        assert decoded == task.steps(config), task.description


def test_a_family_rejects_configs_of_another(tasks: list[RelayTuneTask]) -> None:
    dense = next(task for task in tasks if task.family == "dense")
    family = family_named("conv2d_nchw")
    with pytest.raises(InvalidConfigError, match="does not apply"):
        family.steps(primitive_compute(dense.func), dense.default_config(), dense.target_info)
    with pytest.raises(InvalidConfigError, match="not a complete"):
        family_named("dense").steps(primitive_compute(dense.func), Config({"family": "dense"}), dense.target_info)
