"""CPU schedule spaces (search_space.cpu) and the tuning task of a fused Relay workload (RelayTuneTask).

Every family's template must give a correct kernel for every config of its space, tails included: random configs
are compiled and checked against the interpreter. Also: which family a workload gets, constraints rejecting
configs before anything is built, the default config being the default schedule, packing of
constant weights only, the dense 1024^3 space holding the reference kernel's structure, artifacts that pass the
runner's own check, pickling to build workers, the build's decoder of logged configs, short target names in logs,
and a table of space sizes for zoo models (`pytest -s` shows it).
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest

from relay_tune.compile import resolve_target
from relay_tune.compile.primitive import build_primitive, lower_primitive
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Function, IRModule
from relay_tune.kernel.compute import primitive_compute
from relay_tune.kernel.schedule import LayoutTransform
from relay_tune.target import Target
from relay_tune.text import parse_module
from relay_tune.tuning import InlineBuilder, LocalRunner, MeasureResult, apply_layout
from relay_tune.tuning.relay_task import RelayTuneTask, layout_steps, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space import Config, InvalidConfigError
from search_space.cpu import (
    FAMILIES,
    TileKnob,
    accumulator_registers,
    analyze,
    cpu_space,
    format_space_table,
    vector_registers,
)
from search_space.decode import config_to_steps
from search_space.defaults import default_steps

HOST = resolve_target("llvm")
ONE_CORE = resolve_target("llvm -num-cores=1")
RNG = np.random.default_rng(7)

# Small one-group programs per family: (source, constant weights by input name).
PROGRAMS: dict[str, tuple[str, dict[str, tuple[int, ...]]]] = {
    "dense": ("""
def @main(%x: Tensor[(37, 70), float32], %w: Tensor[(45, 70), float32], %b: Tensor[(45), float32]) {
  nn.relu(nn.bias_add(nn.dense(%x, %w), %b))
}""", {"w": (45, 70), "b": (45,)}),
    "dense_3d": ("""
def @main(%x: Tensor[(2, 9, 24), float32], %w: Tensor[(20, 24), float32]) {
  nn.dense(%x, %w)
}""", {"w": (20, 24)}),
    "dense_unpacked": ("""
def @main(%x: Tensor[(12, 16), float32], %w: Tensor[(24, 16), float32]) {
  nn.dense(%x, %w)
}""", {}),
    "batch_matmul": ("""
def @main(%a: Tensor[(3, 10, 12), float32], %b: Tensor[(3, 19, 12), float32]) {
  nn.batch_matmul(%a, %b, transpose_b=True)
}""", {}),
    "conv2d_nchw": ("""
def @main(%x: Tensor[(1, 5, 20, 21), float32], %w: Tensor[(12, 5, 3, 3), float32], %b: Tensor[(12), float32]) {
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=12, kernel_size=[3, 3]), %b))
}""", {"w": (12, 5, 3, 3), "b": (12,)}),
    "conv2d_nchw_strided": ("""
def @main(%x: Tensor[(1, 4, 37, 40), float32], %w: Tensor[(6, 4, 3, 2), float32]) {
  nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 0, 1, 0], channels=6, kernel_size=[3, 2])
}""", {"w": (6, 4, 3, 2)}),
    "conv2d_pointwise": ("""
def @main(%x: Tensor[(1, 8, 6, 6), float32], %w: Tensor[(10, 8, 1, 1), float32]) {
  nn.conv2d(%x, %w, channels=10, kernel_size=[1, 1])
}""", {"w": (10, 8, 1, 1)}),
    "conv2d_nchw_cl": ("""
def @main(%x: Tensor[(1, 8, 7, 9), float32], %w: Tensor[(20, 8, 3, 3), float32], %b: Tensor[(20), float32]) {
  nn.relu(nn.bias_add(nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=20, kernel_size=[3, 3]), %b))
}""", {"w": (20, 8, 3, 3), "b": (20,)}),
    "conv2d_nhwc": ("""
def @main(%x: Tensor[(1, 9, 10, 6), float32], %w: Tensor[(3, 3, 6, 20), float32]) {
  nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=20, kernel_size=[3, 3], data_layout="NHWC",
            kernel_layout="HWIO")
}""", {"w": (3, 3, 6, 20)}),
    "depthwise": ("""
def @main(%x: Tensor[(1, 6, 19, 17), float32], %w: Tensor[(6, 1, 3, 3), float32]) {
  nn.conv2d(%x, %w, padding=[1, 1, 1, 1], groups=6, channels=6, kernel_size=[3, 3])
}""", {"w": (6, 1, 3, 3)}),
    "pool": ("""
def @main(%x: Tensor[(1, 7, 18, 19), float32]) {
  nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
}""", {}),
    "softmax": ("""
def @main(%x: Tensor[(5, 37), float32]) {
  nn.softmax(%x)
}""", {}),
    "mean": ("""
def @main(%x: Tensor[(6, 33, 20), float32]) {
  mean(%x, axis=[1], keepdims=True)
}""", {}),
    "injective": ("""
def @main(%x: Tensor[(3, 7, 41), float32], %y: Tensor[(41), float32]) {
  nn.relu(add(%x, %y))
}""", {}),
    "transpose": ("""
def @main(%x: Tensor[(6, 35, 5), float32]) {
  transpose(%x, axes=[2, 0, 1])
}""", {}),
}

FAMILY_OF = {
    "dense": "dense", "dense_3d": "dense", "dense_unpacked": "dense", "batch_matmul": "batch_matmul",
    "conv2d_nchw": "conv2d_nchw", "conv2d_nchw_strided": "conv2d_nchw", "conv2d_pointwise": "conv2d_nchw",
    "conv2d_nchw_cl": "conv2d_nchw_cl", "conv2d_nhwc": "conv2d_nhwc", "depthwise": "depthwise_conv2d_nchw",
    "pool": "reduction", "softmax": "reduction", "mean": "reduction",
    "injective": "injective", "transpose": "injective",
}


def module_of(source: str, constants: dict[str, tuple[int, ...]]) -> IRModule:
    from relay_tune.compile import bind_params

    mod = infer_types(parse_module('#[version = "0.0.5"]\n' + source))
    values = {name: (RNG.standard_normal(shape) * 0.5).astype("float32") for name, shape in constants.items()}
    return infer_types(bind_params(mod, values))


def task_of(name: str, target: Target = HOST) -> RelayTuneTask:
    source, constants = PROGRAMS[name]
    tasks = tasks_from_module(module_of(source, constants), target)
    anchors = [t for t in tasks if t.family != "injective"] or tasks
    return anchors[0]


def check_config(task: RelayTuneTask, config: Config) -> None:
    """Compile `config` in this process and compare with the interpreter on random inputs."""
    inputs = [(RNG.standard_normal(spec.shape) * 0.5).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None
    kernel = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))
    got = kernel(*inputs)
    outputs = got if isinstance(got, tuple) else (got,)
    for out, ref in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4, err_msg=f"{task.description} {config}")


# ---------------------------------------------------------------------------------------------------------------
# Families and spaces
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_family_and_space(name: str) -> None:
    task = task_of(name)
    assert task.family == FAMILY_OF[name]
    assert task.family in FAMILIES
    assert task.space.names[0] == "family"
    assert task.space.size() >= 2
    assert task.space.is_valid(task.default_config())


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_random_configs_compute_the_right_result(name: str) -> None:
    task = task_of(name)
    rng = np.random.default_rng(abs(hash(name)) % 1000)
    configs = list(dict.fromkeys([task.default_config(), *(task.space.sample(rng) for _ in range(5))]))
    for config in configs:
        check_config(task, config)


def test_tails_of_non_dividing_tiles_are_correct() -> None:
    task = task_of("dense")  # 37 x 45 output, K = 70: none of the factors below divides
    lanes = task.workload.lanes  # one vector of columns per row: 11 rows fit the registers of AVX2 and AVX-512
    config = Config({**task.default_config(), "tile_m": (2, 2, 11), "tile_n": (-(-45 // lanes), 1, lanes),
                     "tile_k": (10, 7), "order": "mn", "parallel": 1, "pack_b": True})
    task.space.validate(config)
    check_config(task, config)
    conv = task_of("conv2d_nchw")  # 12 channels, 20 rows, 21 columns: one vector of columns leaves a tail
    # 5 channels by 3 rows leave a tail on every axis; 15 accumulators spill 16 registers (AVX2), where the channel
    # and row tails are checked in kernels of their own
    tiles = [(5, 3)] if 5 * 3 <= conv.workload.accumulator_budget else [(5, 2), (2, 3)]
    for channels, rows in tiles:
        config = Config({**conv.default_config(), "tile_c": (-(-12 // channels), channels),
                         "tile_h": (-(-20 // rows), rows), "tile_w": (-(-21 // lanes), lanes), "order": "ch",
                         "parallel": 1, "reduce_order": "hw_c", "unroll_kw": True, "pad": "inline", "pack_w": True})
        conv.space.validate(config)
        check_config(conv, config)


def test_every_knob_value_is_exercised_on_dense_and_conv() -> None:
    for name in ("dense", "conv2d_nchw", "conv2d_nchw_cl", "conv2d_nhwc", "depthwise", "injective", "softmax",
                 "pool"):
        task = task_of(name)
        default = task.default_config()
        for knob in task.space.knobs:
            if knob.name in ("family",) or knob.name.startswith("tile"):
                continue
            for value in knob.values():
                config = default.replace(**{knob.name: value})
                if task.space.is_valid(config) and config != default:
                    check_config(task, config)


def test_register_budget_rejects_spilling_tiles() -> None:
    task = task_of("dense")
    lanes = task.workload.lanes
    assert vector_registers(2 * lanes, lanes) == 2
    assert vector_registers(lanes + lanes // 2, lanes) == 2  # a half vector still takes a register
    assert accumulator_registers(8, 2 * lanes, lanes) == 16
    too_big = task.default_config().replace(tile_m=(3, 1, 16), tile_n=(1, 1, 45))
    with pytest.raises(InvalidConfigError, match="vector registers"):
        task.space.validate(too_big)
    # the same check runs in the builder before anything is compiled
    (result,) = InlineBuilder().build(task, [too_big])
    assert result.error_kind is not None and result.error_kind.name == "INVALID_CONFIG"


def test_duplicate_schedules_are_not_part_of_the_space() -> None:
    conv = task_of("conv2d_nchw")
    with pytest.raises(InvalidConfigError, match="channel block"):
        conv.space.validate(conv.default_config().replace(tile_c=(12, 1), pack_w=True))
    dense = task_of("dense_3d")  # 18 rows, 20 columns
    lanes = dense.workload.lanes  # one vector of columns: 9 rows fit the registers of AVX2 and AVX-512
    narrow = dense.default_config().replace(tile_n=(-(-20 // lanes), 1, lanes))
    with pytest.raises(InvalidConfigError, match="row blocks"):
        dense.space.validate(narrow.replace(tile_m=(1, 2, 9)))
    dense.space.validate(narrow.replace(tile_m=(2, 1, 9)))
    pointwise = task_of("conv2d_pointwise")
    assert "row_vector" in pointwise.space.names
    with pytest.raises(InvalidConfigError, match="whole rows"):
        pointwise.space.validate(pointwise.default_config().replace(row_vector=True, tile_w=(2, 4)))


def test_weights_are_packed_by_default() -> None:
    assert "pack_b" in task_of("dense").space.names
    assert task_of("dense").default_config()["pack_b"]
    # %w is an input of the model: packing it costs a packing kernel on every run, which the runner times with the
    # kernel (tests/test_runtime_weight_packing.py), and the default does it: a gather across the vector lanes was
    # slower at every size measured (search_space.cpu.task_workload)
    assert "pack_b" in task_of("dense_unpacked").space.names
    assert task_of("dense_unpacked").default_config()["pack_b"]
    assert "pack_w" in task_of("conv2d_nchw").space.names
    assert task_of("dense").constants == (1, 2)  # weight and bias


def test_parallel_choices_follow_the_cores() -> None:
    for name in ("dense", "conv2d_nchw", "pool", "injective"):
        assert set(task_of(name, ONE_CORE).space.knob("parallel").values()) == {0}
        if HOST.num_cores > 1:
            assert len(list(task_of(name, HOST).space.knob("parallel").values())) >= 2


def test_tile_knob_offers_register_sizes_that_do_not_divide() -> None:
    knob = TileKnob("tile_m", 1024, 3, 16, range(1, 17))
    assert {6, 12} <= set(knob.candidates)  # not divisors of 1024
    assert knob.contains((86, 1, 12))
    assert knob.contains((16, 4, 16))
    assert not knob.contains((1, 1, 1024))  # above the cap
    assert (86, 1, 12) in knob.neighbors((94, 1, 11)) or (86, 1, 12) in knob.neighbors((79, 1, 13))


def test_dense_1024_space_holds_the_reference_kernel_structure() -> None:
    """The hand-written reference kernel (8x32 tile of 16-lane vectors, packed panels, k unrolled 4x, parallel
    over panels) is a point of the dense 1024^3 space, and the template gives it exactly that loop nest."""
    source = """
def @main(%x: Tensor[(1024, 1024), float32], %w: Tensor[(1024, 1024), float32]) {
  nn.dense(%x, %w)
}"""
    target = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")
    (task,) = tasks_from_module(module_of(source, {"w": (1024, 1024)}), target)
    config = Config({"family": "dense", "tile_m": (128, 1, 8), "tile_n": (32, 1, 32), "tile_k": (256, 4),
                     "order": "nm", "parallel": 2, "k_block": 0, "pack_b": True})
    task.space.validate(config)
    steps = [s.to_json() for s in task.steps(config)]
    kinds = [s["kind"] for s in steps]
    assert {"kind": "transform_layout", "tensor": "p1", "src_layout": "NK", "dst_layout": "NK32n"} in steps
    assert kinds.count("parallel") == 1 and "cache_write" in kinds and "compute_at" in kinds
    primfunc = task.lower(config)
    from relay_tune.kernel import tir

    kinds_found: dict[str, list[int]] = {}
    stack: list[Any] = [primfunc.body]
    while stack:
        node = stack.pop()
        if isinstance(node, tir.For):
            kinds_found.setdefault(node.kind.name, []).append(node.extent)
            stack.append(node.body)
        elif isinstance(node, tir.Seq):
            stack.extend(node.stmts)
        elif isinstance(node, tir.Allocate):
            stack.append(node.body)
        elif isinstance(node, tir.IfThenElse):
            stack.extend(b for b in (node.then_body, node.else_body) if b is not None)
    assert 32 * 128 in kinds_found["PARALLEL"]  # panels x row blocks, fused
    assert 32 in kinds_found["VECTORIZED"] and 8 in kinds_found["UNROLLED"] and 4 in kinds_found["UNROLLED"]
    assert accumulator_registers(8, 32, task.workload.lanes) <= task.workload.accumulator_budget


# ---------------------------------------------------------------------------------------------------------------
# The default config is the built-in default schedule
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dense", "conv2d_nchw", "conv2d_nchw_cl", "depthwise", "pool", "injective"])
def test_default_config_is_the_default_schedule(name: str) -> None:
    task = task_of(name)
    steps = default_steps(primitive_compute(task.func), task.target_info, task.constants)
    assert task.steps(task.default_config()) == steps
    # the build's decoder of the logged default config agrees
    decoded = config_to_steps(task.func, task.default_config().to_dict(), task.target_info)
    assert decoded == steps
    # and other configs are other schedules (the comparison can fail)
    assert any(task.steps(task.space.sample(RNG)) != steps for _ in range(20))


def test_decoder_turns_logged_configs_into_template_steps() -> None:
    task = task_of("conv2d_nchw")
    rng = np.random.default_rng(3)
    config = next(c for c in (task.space.sample(rng) for _ in range(50)) if c != task.default_config())
    assert config_to_steps(task.func, json.loads(config.canonical_json), HOST) == task.steps(config)
    steps = [s.to_json() for s in task.steps(config)]
    assert config_to_steps(task.func, {"steps": json.dumps(steps)}, HOST) == steps  # hand-pinned schedules
    with pytest.raises(RelayTuneError, match="cannot turn a tuning config into schedule steps"):
        config_to_steps(task.func, {"tile": 8}, HOST)
    with pytest.raises(RelayTuneError, match="not a point of the conv2d_nchw schedule space"):
        config_to_steps(task.func, {**config.to_dict(), "tile_c": [1, 99]}, HOST)


# ---------------------------------------------------------------------------------------------------------------
# The task protocol
# ---------------------------------------------------------------------------------------------------------------


def test_layout_steps_pack_like_the_schedule() -> None:
    source = np.arange(45 * 70, dtype="float32").reshape(45, 70)
    for dst in ("NK16n", "NK32n", "KN", "NK"):
        layout = LayoutTransform("p1", "p1.packed", "NK", dst, (45, 70), "float32")
        np.testing.assert_array_equal(apply_layout(source, layout_steps(layout)), layout.pack(source))
    weights = np.arange(12 * 5 * 3 * 3, dtype="float32").reshape(12, 5, 3, 3)
    layout = LayoutTransform("p1", "p1.packed", "OIHW", "OIHW5o", (12, 5, 3, 3), "float32")
    np.testing.assert_array_equal(apply_layout(weights, layout_steps(layout)), layout.pack(weights))


def test_artifacts_pass_the_runners_check() -> None:
    """Built artifacts (object code, packed weights described as layout steps) measured by the real runner."""
    with LocalRunner(min_repeat_ms=1.0, repeat=1, number=1) as runner:
        for name in ("dense", "conv2d_nchw", "softmax"):
            task = task_of(name)
            rng = np.random.default_rng(5)
            configs = list(dict.fromkeys([task.default_config(), task.space.sample(rng), task.space.sample(rng)]))
            for config, built in zip(configs, InlineBuilder().build(task, configs)):
                assert built.artifact is not None, built.error_msg
                result = MeasureResult.combine(built, runner.run(task, built.artifact))
                assert result.ok, f"{task.description} {config}: {result.error_kind} {result.error_msg}"


def test_task_protocol_fields_and_pickling() -> None:
    task = task_of("dense")
    assert task.key and task.weight == 1 and task.flops == 2 * 37 * 45 * 70 + 2 * 37 * 45
    assert task.target == HOST.log_name
    assert [s.shape for s in task.input_specs()] == [(37, 70), (45, 70), (45,)]
    copy = pickle.loads(pickle.dumps(task))
    assert copy.key == task.key and copy.space.names == task.space.names
    assert copy.default_config() == task.default_config()
    config = task.space.sample(np.random.default_rng(1))
    assert copy.steps(config) == task.steps(config)
    spec = task.workload_spec()
    rebuilt = RelayTuneTask.from_workload_spec(json.loads(json.dumps(spec)))
    assert rebuilt.space.names == task.space.names and rebuilt.steps(config) == task.steps(config)


def test_reference_uses_the_interpreter_on_the_primitive_function() -> None:
    task = task_of("conv2d_nchw")
    inputs = [RNG.standard_normal(s.shape).astype(s.dtype) for s in task.input_specs()]
    plain = Function(task.func.params, task.func.body, task.func.ret_type)
    expected = evaluate(IRModule({"main": plain}), inputs)
    (got,) = task.reference(inputs)
    np.testing.assert_array_equal(got, expected)


def test_invalid_configs_are_rejected_before_lowering() -> None:
    task = task_of("dense")
    with pytest.raises(InvalidConfigError):
        task.lower(Config({"family": "dense"}))
    with pytest.raises(InvalidConfigError):
        task.steps(Config({**task.default_config(), "family": "conv2d_nchw"}))
    primfunc, packing = lower_primitive(task.func, HOST, task.steps(task.default_config()), name="k")
    assert primfunc.name == "k" and packing.packed_inputs == (1,)


def test_analyze_reports_workload_facts() -> None:
    task = task_of("conv2d_nchw")
    workload = analyze(primitive_compute(task.func), HOST, task.constants)
    assert workload.family == "conv2d_nchw" and workload.has_pad and workload.constant_weight
    assert dict(workload.dims)["c"] == 12 and dict(workload.dims)["w"] == 21
    assert cpu_space(workload).names == task.space.names


# ---------------------------------------------------------------------------------------------------------------
# Targets in logs
# ---------------------------------------------------------------------------------------------------------------


def test_target_log_names_are_short_and_stable() -> None:
    host = Target.host()
    name = host.log_name
    assert len(name) < 80 and name == Target.host().log_name
    assert name.startswith("llvm") and f"-num-cores={host.num_cores}" in name
    if host.mattr:
        assert "-features=" in name and len(str(host)) > len(name)
        fewer = Target("llvm", host.mcpu, host.mattr[1:], host.num_cores)
        assert fewer.log_name != name
    assert host.with_cores(1).log_name != host.with_cores(2).log_name
    assert Target.parse("cuda -arch=sm_80").log_name == "cuda -arch=sm_80"
    assert Target.parse("llvm -num-cores=3").log_name == "llvm -num-cores=3"


# ---------------------------------------------------------------------------------------------------------------
# Space sizes of real models
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["inception_block", "lstm", "bert_layer"])  # conv2d, dense, batch_matmul
def test_space_size_table(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    from relay_tune.testing import zoo

    tasks = tasks_from_module(zoo.full(model), HOST)
    table = format_space_table([(t.description, t.family, t.space) for t in tasks])
    with capsys.disabled():
        print(f"\nschedule spaces of {model} ({HOST.log_name}):\n{table}")
    assert tasks
    for task in tasks:
        assert task.space.is_valid(task.default_config()), task.description
        if task.family in ("dense", "conv2d_nchw", "conv2d_nchw_cl", "conv2d_nhwc", "depthwise_conv2d_nchw"):
            assert task.space.size() >= 100, task.description


def test_pooling_reads_its_padding_either_way() -> None:
    """A padded pooling window: the padded input written once ahead (`pad` root) or read through a guard
    (inline), in every mode of the reduction template; configs logged before the knob decode to the padded copy."""
    task = task_of("pool")
    assert "pad" in task.space.names
    for pad in ("root", "inline"):
        for parallel in task.space.knob("parallel").values():
            config = task.default_config().replace(pad=pad, parallel=parallel)
            if task.space.is_valid(config):
                check_config(task, config)
    assert task.steps(task.default_config().replace(pad="root")) != task.steps(task.default_config().replace(
        pad="inline"))
    old = {k: v for k, v in task.default_config().to_dict().items() if k != "pad"}
    assert config_to_steps(task.func, old, HOST) == task.steps(task.default_config().replace(pad="root"))
    width = HOST.vector_lanes() - 2  # rows narrower than one vector: 14 columns on AVX-512, 6 on AVX2
    (narrow,) = tasks_from_module(module_of(f"""
def @main(%x: Tensor[(1, 20, {width}, {width}), float32]) {{
  nn.max_pool2d(%x, pool_size=[3, 3], padding=[1, 1, 1, 1])
}}""", {}), HOST)
    assert "vector" not in narrow.space.names and narrow.default_config()["pad"] == "inline"
    check_config(narrow, narrow.default_config())
