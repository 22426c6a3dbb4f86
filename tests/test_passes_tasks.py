"""Task extraction: stable workload keys, occurrences, flops, descriptions and call sites."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, Tuple, Var, const, op
from relay_tune.op.registry import get_op
from relay_tune.passes import optimize
from relay_tune.passes.extract_tasks import (
    TaskSpec,
    call_flops,
    canonical_text,
    extract_tasks,
    format_task_table,
    workload_key,
)
from relay_tune.type_infer import infer_types


def call(name: str, *args: Expr, **attrs: object) -> Call:
    return Call(op(name), args, get_op(name).make_attrs(attrs))


def rand(seed: int, *shape: int) -> Constant:
    return const(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


def conv_block(x: Expr, cin: int, cout: int, seed: int, stride: int = 1) -> Expr:
    conv = call("nn.conv2d", x, rand(seed, cout, cin, 3, 3), strides=(stride, stride), padding=(1, 1),
                channels=cout, kernel_size=(3, 3))
    return call("nn.relu", call("nn.bias_add", conv, rand(seed + 1, cout)))


def network(names: tuple[str, str] = ("x", "y"), seed: int = 0) -> IRModule:
    """Three identical conv blocks (different weights), one strided block and a dense head."""
    x = Var(names[0], TensorType((1, 8, 16, 16), "float32"))
    h: Expr = x
    for i in range(3):
        h = conv_block(h, 8, 8, seed + 10 * i)
    h = conv_block(h, 8, 16, seed + 100, stride=2)
    flat = call("nn.batch_flatten", call("nn.global_avg_pool2d", h))
    out = call("add", call("nn.dense", flat, rand(seed + 200, 10, 16), units=10), rand(seed + 201, 10))
    return infer_types(IRModule({"main": Function((x,), out)}))


@pytest.fixture(scope="module")
def tasks() -> list[TaskSpec]:
    return extract_tasks(optimize(network()))


def test_one_task_per_distinct_workload_with_counts(tasks: list[TaskSpec]) -> None:
    summary = [(t.description, t.occurrences) for t in tasks]
    assert summary == [
        ("conv2d_nchw+bias+relu 1x8x16x16 * 8x8x3x3 s1 p1", 3),
        ("conv2d_nchw+bias+relu 1x8x16x16 * 16x8x3x3 s2 p1", 1),
        ("global_avg_pool2d 1x16x8x8", 1),
        ("flatten 1x16x1x1", 1),
        ("dense+bias 1x16 * 10x16", 1),
    ]
    assert [t.anchor_op for t in tasks] == ["nn.conv2d", "nn.conv2d", "nn.global_avg_pool2d", "nn.batch_flatten",
                                            "nn.dense"]


def test_call_sites_are_the_calls_of_the_function(tasks: list[TaskSpec]) -> None:
    conv = tasks[0]
    assert len(conv.call_sites) == conv.occurrences == 3
    assert all(isinstance(c.op, Function) and workload_key(c.op) == conv.key for c in conv.call_sites)
    assert len({id(c) for c in conv.call_sites}) == 3


def test_flops(tasks: list[TaskSpec]) -> None:
    conv = tasks[0]
    macs = 1 * 8 * 16 * 16 * 8 * 3 * 3
    epilogue = 2 * (8 * 16 * 16)  # bias_add and relu: one per output element each
    assert conv.flops == 2 * macs + epilogue
    strided = tasks[1]
    assert strided.flops == 2 * (16 * 8 * 8 * 8 * 9) + 2 * (16 * 8 * 8)
    dense = tasks[-1]
    assert dense.flops == 2 * 10 * 16 + 10
    assert dense.total_flops == dense.flops


def test_types_are_recorded(tasks: list[TaskSpec]) -> None:
    conv = tasks[0]
    assert conv.input_types == (
        TensorType((1, 8, 16, 16), "float32"), TensorType((8, 8, 3, 3), "float32"), TensorType((8,), "float32")
    )
    assert conv.output_type == TensorType((1, 8, 16, 16), "float32")


def test_key_ignores_names_and_constant_values(tasks: list[TaskSpec]) -> None:
    other = extract_tasks(optimize(network(names=("data", "z"), seed=5)))
    assert [t.key for t in other] == [t.key for t in tasks]


def test_key_depends_on_shapes_attrs_and_ops() -> None:
    def single(body_fn: object, shape: tuple[int, ...] = (1, 8, 16, 16)) -> str:
        x = Var("x", TensorType(shape, "float32"))
        mod = infer_types(IRModule({"main": Function((x,), body_fn(x))}))  # type: ignore[operator]
        (task,) = extract_tasks(optimize(mod))
        return task.key

    def conv(stride: int, relu: bool = True) -> object:
        def build(x: Expr) -> Expr:
            c = call("nn.conv2d", x, rand(0, 8, 8, 3, 3), strides=(stride, stride), padding=(1, 1))
            return call("nn.relu", c) if relu else c
        return build

    base = single(conv(1))
    assert single(conv(1)) == base
    assert single(conv(2)) != base
    assert single(conv(1, relu=False)) != base
    assert single(conv(1), shape=(2, 8, 16, 16)) != base


def test_scalar_constant_values_are_part_of_the_key() -> None:
    def key(value: float) -> str:
        x = Var("x", TensorType((4,), "float32"))
        mod = infer_types(IRModule({"main": Function((x,), call("multiply", call("exp", x), const(value)))}))
        return extract_tasks(optimize(mod))[0].key

    assert key(2.0) == key(2.0) != key(3.0)


def test_key_is_stable_across_processes(tasks: list[TaskSpec]) -> None:
    # hash randomisation differs per process: the key must not depend on Python's hash()
    code = (
        "import sys; sys.path.insert(0, 'tests');"
        "from test_passes_tasks import network;"
        "from relay_tune.passes import optimize;"
        "from relay_tune.passes.extract_tasks import extract_tasks;"
        "print(extract_tasks(optimize(network()))[0].key)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    repo_root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=repo_root)
    assert out.stdout.strip() == tasks[0].key


def test_canonical_text_renames_parameters(tasks: list[TaskSpec]) -> None:
    text = canonical_text(tasks[0].func)
    assert text.startswith("fn(p0: Tensor[(1, 8, 16, 16), float32], p1: Tensor[(8, 8, 3, 3), float32]")
    assert "nn.conv2d(p0, p1;" in text


def test_task_spec_is_frozen(tasks: list[TaskSpec]) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        tasks[0].occurrences = 4  # type: ignore[misc]


def test_task_table_lists_every_task(tasks: list[TaskSpec]) -> None:
    table = format_task_table(tasks)
    assert len(table.splitlines()) == len(tasks) + 1
    assert "conv2d_nchw+bias+relu 1x8x16x16 * 8x8x3x3 s1 p1" in table


def test_matmul_flops() -> None:
    a = Var("a", TensorType((4, 5, 6), "float32"))
    b = Var("b", TensorType((4, 7, 6), "float32"))
    mod = infer_types(IRModule({"main": Function((a, b), call("nn.batch_matmul", a, b, transpose_b=True))}))
    body = mod["main"].body
    assert isinstance(body, Call)
    assert call_flops(body) == 2 * 4 * 5 * 7 * 6


def test_grouped_conv_flops_and_description() -> None:
    x = Var("x", TensorType((1, 8, 10, 10), "float32"))
    conv = call("nn.conv2d", x, rand(0, 8, 1, 3, 3), groups=8, padding=(1, 1), channels=8, kernel_size=(3, 3))
    (task,) = extract_tasks(optimize(infer_types(IRModule({"main": Function((x,), conv)}))))
    assert task.flops == 2 * 8 * 10 * 10 * 9
    assert task.description == "conv2d_nchw 1x8x10x10 * 8x1x3x3 s1 p1 g8"


def test_tuple_outputs_and_modules_without_calls() -> None:
    x = Var("x", TensorType((2, 2), "float32"))
    mod = infer_types(IRModule({"main": Function((x,), Tuple((x, x)))}))
    assert extract_tasks(optimize(mod)) == []
