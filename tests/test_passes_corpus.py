"""The whole pass pipeline on the Relay corpus (when it is beside the checkout) and the model zoo: results never
change, and ResNet-50 fuses the way it should."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from model_sources import ZOO_FILES, corpus_cases

from relay_tune.interpreter import evaluate
from relay_tune.ir import ANY, Call, Constant, Expr, Function, IRModule, TensorType, rewrite
from relay_tune.op.registry import OpPattern, get_op, has_op
from relay_tune.passes import optimize
from relay_tune.passes.base import dataflow_post_order
from relay_tune.passes.extract_tasks import extract_tasks, format_task_table, primitive_calls
from relay_tune.testing import zoo
from relay_tune.text import load_module, parse_expr
from relay_tune.type_infer import infer_types

CORPUS_FILES = corpus_cases(*(f"{name}.relay" for name in [
    "tvm_aot_fused_nchwc", "tvm_aot_int8_conv", "tvm_autoquant_bias_conv", "tvm_autoquant_two_conv",
    "tvm_composite_partition", "tvm_dfpattern_nhwc_conv", "tvm_dfpattern_partitioned", "tvm_dyn_any_dims",
    "tvm_expr_grad_let_tuple", "tvm_lower_te_primitive", "tvm_menagerie_batch_norm_extract",
    "tvm_menagerie_gpt2_16_for_cutlass_extract", "tvm_menagerie_gpt2_extract", "tvm_menagerie_mnist",
    "tvm_menagerie_mobilenet", "tvm_menagerie_resnet50", "tvm_menagerie_resnet50_16", "tvm_menagerie_resnext50_32x4d",
    "tvm_op_level1_take_slice", "tvm_target_hooks_infix", "tvm_type_infer_polymorphic",
]))
# ~10 s per interpreter run of the whole 12-layer GPT-2; zoo models at their real size
SLOW_FILES = [*corpus_cases("tvm_menagerie_gpt2.relay"), "zoo:resnet50", "zoo:mobilenet_v2", "zoo:bert_layer"]


def positive_batch_norm_variance(func: Function) -> Function:
    """The sidecar constants are random normals; a batch-norm variance must be positive to mean anything."""

    def fix(_orig: Expr, new: Expr) -> Expr:
        if isinstance(new, Call) and new.op_name == "nn.batch_norm" and isinstance(new.args[4], Constant):
            var = np.abs(new.args[4].data) + np.asarray(1, new.args[4].data.dtype)
            return Call(new.op, (*new.args[:4], Constant(var)), new.attrs, new.span)
        return new

    out = rewrite(func, fix)
    assert isinstance(out, Function)
    return out


def load(path: Path) -> IRModule:
    text = path.read_text()
    if "def @" in text:
        mod = load_module(path)
    else:  # a bare expression file: a function literal
        func = parse_expr(text, str(path))
        assert isinstance(func, Function)
        mod = IRModule({"main": func})
    return infer_types(mod.map_functions(lambda _name, f: positive_batch_norm_variance(f)))


def random_inputs(func: Function, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = []
    for param in func.params:
        ty = param.checked_type
        assert isinstance(ty, TensorType)
        shape = tuple(3 if d is ANY else int(d) for d in ty.shape)  # type: ignore[arg-type]
        if ty.dtype.startswith("float"):
            inputs.append(rng.standard_normal(shape).astype(ty.dtype))
        elif ty.dtype == "bool":
            inputs.append(rng.random(shape) < 0.5)
        else:  # integer inputs are indices in the corpus (token ids): keep them small and valid
            inputs.append(rng.integers(0, 4, shape).astype(ty.dtype))
    return inputs


def flatten(value: object) -> list[object]:
    out: list[object] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out


def check_pipeline_preserves_outputs(mod: IRModule, name: str, atol: float = 1e-6) -> None:
    inputs = random_inputs(mod["main"])
    expected = flatten(evaluate(mod, inputs))
    assert all(isinstance(v, np.ndarray) for v in expected), f"{name} returns a function value, not tensors"
    fused = optimize(mod, opt_level=3)
    for func in fused.values():  # every operator call now sits inside a primitive function
        if not func.is_primitive:
            assert not [n for n in dataflow_post_order(func) if isinstance(n, Call) and n.op_name is not None]
    actual = flatten(evaluate(fused, inputs))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert isinstance(a, np.ndarray) and isinstance(e, np.ndarray)
        assert a.shape == e.shape and a.dtype == e.dtype
        if e.dtype == np.float16:
            # rtol 1e-5 is below float16 resolution; folding rounds at float16 precision (one ulp ~ 1e-3)
            np.testing.assert_allclose(a.astype(np.float32), e.astype(np.float32), rtol=1e-2, atol=2e-3)
        else:
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol * max(1.0, float(np.abs(e).max(initial=0))))


@pytest.mark.parametrize("name", CORPUS_FILES + ZOO_FILES)
def test_pipeline_preserves_outputs(program: Callable[[str], Path], name: str) -> None:
    check_pipeline_preserves_outputs(load(program(name)), name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_FILES)
def test_pipeline_preserves_outputs_big_models(program: Callable[[str], Path], name: str) -> None:
    mod = zoo.full(name.removeprefix("zoo:")) if name.startswith("zoo:") else load(program(name))
    # folded batch norms and reassociated scales round differently through 50 layers: an absolute slack of
    # 1e-5 of the largest output (a few float32 ulps of it)
    check_pipeline_preserves_outputs(mod, name, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# ResNet-50
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet50() -> tuple[IRModule, IRModule]:
    mod = zoo.full("resnet50")  # ResNet-50 v1 at 224x224
    return mod, optimize(mod, opt_level=3)


def _ops(func: Function) -> list[str]:
    return [n.op_name for n in dataflow_post_order(func.body) if isinstance(n, Call) and n.op_name is not None]


def test_resnet50_has_no_batch_norm_and_one_conv_per_function(resnet50: tuple[IRModule, IRModule]) -> None:
    original, fused = resnet50
    assert "nn.batch_norm" in [n.op_name for n in dataflow_post_order(original["main"]) if isinstance(n, Call)]
    calls = primitive_calls(fused)
    all_ops = [name for c in calls for name in _ops(c.op)]  # type: ignore[arg-type]
    assert "nn.batch_norm" not in all_ops
    assert all(_ops(c.op).count("nn.conv2d") <= 1 for c in calls)  # type: ignore[arg-type]
    assert all_ops.count("nn.conv2d") == 53
    # no call of an operator remains outside primitive functions
    assert not [n for n in dataflow_post_order(fused["main"]) if isinstance(n, Call) and n.op_name is not None]


def _is_elementwise(name: str | None) -> bool:
    return name is not None and has_op(name) and get_op(name).pattern <= OpPattern.BROADCAST


def test_resnet50_every_conv_absorbs_its_elementwise_consumers(resnet50: tuple[IRModule, IRModule]) -> None:
    """A conv group's output may only reach element-wise code in another group when fusion could not go on:
    the value has several consumers, or the consumer's group already holds a complex operator."""
    _, fused = resnet50
    main = fused["main"]
    consumers: dict[int, list[tuple[Call, int]]] = {}
    for node in dataflow_post_order(main):
        if isinstance(node, Call):
            for i, arg in enumerate(node.args):
                consumers.setdefault(id(arg), []).append((node, i))
    checked = 0
    for call in primitive_calls(fused):
        func = call.op
        assert isinstance(func, Function)
        if "nn.conv2d" not in _ops(func):
            continue
        # the epilogue starts inside the group: whatever directly follows the conv there is element-wise
        users = consumers.get(id(call), [])
        if len(users) != 1:
            continue
        user, index = users[0]
        if not (isinstance(user.op, Function) and user.op.is_primitive):
            continue
        user_ops = _ops(user.op)
        if any(has_op(o) and get_op(o).pattern == OpPattern.OUT_ELEMWISE_FUSABLE for o in user_ops):
            continue
        param = user.op.params[index]
        first_use = next(
            n for n in dataflow_post_order(user.op.body) if isinstance(n, Call) and any(a is param for a in n.args)
        )
        assert not _is_elementwise(first_use.op_name), f"{_ops(func)} is followed by {user_ops} in another group"
        checked += 1
    conv_groups = [tuple(_ops(c.op)) for c in primitive_calls(fused) if "nn.conv2d" in _ops(c.op)]  # type: ignore[arg-type]
    # batch norm folds into each convolution's weights and a bias add; the 16 residual adds and their ReLUs join
    # the last convolution of each block's branch, every other ReLU its convolution; only the four projection
    # shortcuts (whose sum belongs to the branch's group) keep nothing but the bias
    assert sorted(set(conv_groups)) == [("nn.conv2d", "add"), ("nn.conv2d", "add", "add", "nn.relu"),
                                        ("nn.conv2d", "add", "nn.relu")]
    assert conv_groups.count(("nn.conv2d", "add")) == 4
    assert conv_groups.count(("nn.conv2d", "add", "add", "nn.relu")) == 16


def test_resnet50_task_table(resnet50: tuple[IRModule, IRModule], capsys: pytest.CaptureFixture[str]) -> None:
    _, fused = resnet50
    tasks = extract_tasks(fused)
    conv_tasks = [t for t in tasks if t.anchor_op == "nn.conv2d"]
    dense_tasks = [t for t in tasks if t.anchor_op == "nn.dense"]
    assert sum(t.occurrences for t in conv_tasks) == 53
    assert [t.occurrences for t in dense_tasks] == [1]
    assert len({t.key for t in tasks}) == len(tasks)
    # distinct convolution shapes (data, weight, strides): the tuning workloads that matter
    shapes: dict[str, int] = {}
    for t in conv_tasks:
        shape_key = t.description.split(" ", 1)[1]
        shapes[shape_key] = shapes.get(shape_key, 0) + t.occurrences
    assert len(shapes) == 23
    assert shapes["1x64x56x56 * 64x64x3x3 s1 p1"] == 3
    assert shapes["1x256x14x14 * 256x256x3x3 s1 p1"] == 5
    assert dense_tasks[0].description == "dense+bias 1x2048 * 1000x2048"
    total_gflops = sum(t.total_flops for t in tasks) / 1e9
    assert 7.5 < total_gflops < 8.5  # ResNet-50 at 224x224: about 4.1 GMACs
    with capsys.disabled():
        print(f"\nResNet-50 tasks ({len(tasks)} distinct fused functions, {total_gflops:.2f} GFLOPs):")
        print(format_task_table(tasks))

