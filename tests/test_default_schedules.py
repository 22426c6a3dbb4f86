"""The default schedule is the family template at the default config, for every task of every model the tests build.

What an untuned model build runs (`relay_tune.build`) and what the tuner measures and logs as the task's default
config (`RelayTuneTask.lower(task.default_config())`) are lowered and compared loop nest by loop nest; a special
case on either path (a hand-written default, a config that stands for something else) makes them differ. Also: no
default kernel runs on one core where there is work enough for several, and the GPU default config is exactly the
default rule's parameters.

To cover more models, add them to `MODELS` (a name and a function returning the module).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.compile import resolve_target
from relay_tune.compile.tasks import is_memory_view, lower_one
from relay_tune.interpreter import Interpreter
from relay_tune.ir import IRModule
from relay_tune.kernel import analysis, tir
from relay_tune.kernel.compute import primitive_compute
from relay_tune.kernel.schedule import Schedule
from relay_tune.passes import optimize
from relay_tune.passes.extract_tasks import extract_tasks
from relay_tune.target import Target
from relay_tune.testing import zoo
from relay_tune.text import load_module, parse_module
from relay_tune.tuning.relay_task import RelayTuneTask
from relay_tune.type_infer import infer_types
from search_space import Config
from search_space.cpu import PARALLEL_MIN_WORK
from search_space.gpu import config_to_params
from search_space.gpu import default_config as gpu_default_config
from search_space.gpu_template import default_params
from tests.conftest import CORPUS_DIR, REPO_ROOT

# A 4-core target whatever this machine has: parallel decisions do not depend on where the tests run.
CPU = resolve_target("llvm -num-cores=4")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=4")  # for loop nests inspected, never run
CUDA = Target.parse("cuda -arch=sm_90")

_FAMILIES_SOURCE = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 9, 24), float32], %w: Tensor[(20, 24), float32], %a: Tensor[(3, 10, 12), float32],
          %b: Tensor[(3, 19, 12), float32], %img: Tensor[(1, 8, 20, 20), float32], %k: Tensor[(16, 8, 3, 3), float32],
          %dw: Tensor[(8, 1, 3, 3), float32], %nhwc: Tensor[(1, 9, 9, 8), float32],
          %kh: Tensor[(3, 3, 8, 24), float32], %g: Tensor[(8, 2, 3, 3), float32],
          %k12: Tensor[(12, 8, 3, 3), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.softmax(%0, axis=-1);
  %2 = nn.batch_matmul(%a, %b, transpose_b=True);
  %3 = nn.conv2d(%img, %k, strides=[2, 2], padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3]);
  %4 = nn.conv2d(%img, %dw, padding=[1, 1, 1, 1], groups=8, channels=8, kernel_size=[3, 3]);
  %5 = nn.conv2d(%nhwc, %kh, padding=[1, 1, 1, 1], channels=24, kernel_size=[3, 3], data_layout="NHWC",
                 kernel_layout="HWIO");
  %6 = nn.conv2d(%img, %g, padding=[1, 1, 1, 1], groups=4, channels=8, kernel_size=[3, 3]);
  %7 = nn.max_pool2d(%4, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1]);
  %8 = nn.avg_pool2d(%6, pool_size=[2, 2], strides=[2, 2]);
  %9 = mean(%3, axis=[1], keepdims=True);
  %10 = sum(%2, axis=[2]);
  %11 = transpose(%5, axes=[0, 3, 1, 2]);
  %12 = nn.relu(nn.conv2d(%img, %k12, padding=[1, 1, 1, 1], channels=12, kernel_size=[3, 3]));
  (%1, %2, %7, %8, %9, %10, %11, sigmoid(%x), nn.global_avg_pool2d(%3), %12)
}
"""


def _families() -> IRModule:
    """One module with a task of every operator family: dense and batch_matmul, conv2d (strided, grouped,
    depthwise, NHWC), pooling, reductions, softmax, injective."""
    return parse_module(_FAMILIES_SOURCE)


def _file(path: Path) -> Callable[[], IRModule]:
    def load() -> IRModule:
        if not path.is_file():
            pytest.skip(f"{path} not found")
        return load_module(path)

    return load


# Every model the tests build; a model zoo can be appended here.
_CORPUS_MODELS = ("tvm_menagerie_mnist", "tvm_menagerie_mobilenet", "tvm_menagerie_gpt2_extract",
                  "tvm_menagerie_resnext50_32x4d", "tvm_menagerie_resnet50", "tvm_autoquant_two_conv",
                  "tvm_dfpattern_nhwc_conv")

MODELS: dict[str, Callable[[], IRModule]] = {
    "families": _families,
    "small_cnn": _file(REPO_ROOT / "relay_tune" / "examples" / "small_cnn.relay"),
    "small_resnet": _file(REPO_ROOT / "relay_tune" / "examples" / "small_resnet.relay"),
    # every model of the zoo at its test size (always there), and the corpus programs where the corpus is
    **{f"zoo:{name}": functools.partial(zoo.small, name) for name in zoo.MODELS},
    **{name: _file(CORPUS_DIR / f"{name}.relay") for name in _CORPUS_MODELS
       if (CORPUS_DIR / f"{name}.relay").is_file()},
}
SLOW = {"tvm_menagerie_resnet50", "tvm_menagerie_resnext50_32x4d"}


def _specs(name: str, make: Callable[[], IRModule] | None = None) -> list:
    fused = optimize(infer_types((make or MODELS[name])()), opt_level=3)
    return [s for s in extract_tasks(IRModule({"main": fused["main"]})) if not is_memory_view(s.func)]


def _params() -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in MODELS]


def _renamed(func: tir.PrimFunc) -> tir.PrimFunc:
    return dataclasses.replace(func, name="kernel")


def _built_default(spec: object, target: Target) -> tir.PrimFunc:
    """The loop nest an untuned `relay_tune.build` runs for a task."""
    lowered = lower_one(spec, target, None, "kernel", [])
    assert not lowered.tuned
    return _renamed(lowered.primfunc)


@pytest.mark.parametrize("name", _params())
def test_default_kernel_is_the_template_at_the_default_config(name: str) -> None:
    specs = _specs(name)
    assert specs
    for spec in specs:
        task = RelayTuneTask(spec, CPU)
        built = _built_default(spec, CPU)
        logged = _renamed(task.lower(task.default_config()))
        assert analysis.structurally_equal(built, logged), (
            f"{name}: the default kernel of {spec.description} ({task.family}) is not the template at its default "
            f"config {dict(task.default_config())}")


def test_a_different_config_gives_a_different_nest() -> None:
    """The comparison above can fail: every family's template moves the nest when a knob moves."""
    families: set[str] = set()
    for spec in _specs("families"):
        task = RelayTuneTask(spec, CPU)
        default = task.default_config()
        built = _built_default(spec, CPU)
        for knob in task.space.knobs:
            others = [v for v in knob.values() if v != default[knob.name]]
            changed = [default.replace(**{knob.name: v}) for v in others]
            valid = [c for c in changed if task.space.is_valid(c)]
            if any(not analysis.structurally_equal(built, _renamed(task.lower(c))) for c in valid):
                families.add(task.family)
                break
    assert families >= {"dense", "batch_matmul", "conv2d_nchw", "conv2d_nchw_cl", "depthwise_conv2d_nchw",
                        "conv2d_nhwc", "reduction", "injective"}


def _parallel_loops(stmt: tir.Stmt) -> int:
    return sum(isinstance(s, tir.For) and s.kind is tir.ForKind.PARALLEL for s in analysis.iter_stmts(stmt))


def _work(spec: object) -> int:
    """The largest stage's iterations (output elements times reduction size), and whether the output has an axis
    to split over cores."""
    prim = primitive_compute(spec.func)  # type: ignore[attr-defined]
    sch = Schedule(prim.outputs)
    return max(math.prod(ax.extent for ax in st.root_axes) for st in sch.stages.values() if st.op is not None)


# The zoo at its real sizes too: extracting the tasks and lowering their defaults takes about a second a model.
FULL_SIZE: dict[str, Callable[[], IRModule]] = {
    f"zoo-full:{name}": functools.partial(zoo.full, name) for name in zoo.MODELS}


@pytest.mark.parametrize("name", [*_params(), *FULL_SIZE])
def test_no_default_kernel_runs_on_one_core_where_parallel_work_exists(name: str) -> None:
    serial = []
    specs = _specs(name, FULL_SIZE.get(name))
    assert specs
    for spec in specs:
        outputs = primitive_compute(spec.func).outputs
        if _work(spec) < PARALLEL_MIN_WORK or all(math.prod(t.shape) <= 1 for t in outputs):
            continue
        if not _parallel_loops(_built_default(spec, CPU).body):
            serial.append(spec.description)
    assert not serial, f"default kernels on one core: {serial}"


def test_resnet50_final_dense_runs_in_parallel() -> None:
    """1x2048 by 1000x2048: a small output and a long reduction (the work counts the reduction)."""
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 2048), float32], %w: Tensor[(1000, 2048), float32], %b: Tensor[(1000), float32]) {
  nn.bias_add(nn.dense(%x, %w), %b)
}""")
    (spec,) = extract_tasks(optimize(infer_types(mod)))
    assert _parallel_loops(_built_default(spec, CPU).body) == 1
    assert _parallel_loops(_built_default(spec, resolve_target("llvm -num-cores=1")).body) == 0


def test_few_channel_blocks_stay_parallel() -> None:
    """1x32x32x32 by 8x32 (1x1, work 2^18, the parallel threshold): a channel tile that leaves a tail (8 channels in
    tiles of 7) has its last block peeled by lowering, and with two blocks the parallel loop went with it; the
    default tile divides."""
    assert PARALLEL_MIN_WORK <= 8 * 32 * 32 * 32
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 32, 32, 32), float32], %w: Tensor[(8, 32, 1, 1), float32]) {
  nn.relu(nn.conv2d(%x, %w, padding=[0, 0, 0, 0], channels=8, kernel_size=[1, 1]))
}""")
    (spec,) = extract_tasks(optimize(infer_types(mod)))
    assert _parallel_loops(_built_default(spec, CPU).body) == 1


def test_a_split_innermost_axis_is_vectorized_by_whole_runs() -> None:
    """Attention's head merge (12x128x64 -> 128x768) reads each output row in runs of 64: vectorizing the row
    whole makes every load a gather; the default splits it by a vector that divides the run."""
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(12, 128, 64), float32]) {
  reshape(transpose(reshape(%x, newshape=[1, 12, 128, 64]), axes=[0, 2, 1, 3]), newshape=[128, 768])
}""")
    (spec,) = extract_tasks(optimize(infer_types(mod)))
    for target in (CPU, AVX512):
        config = RelayTuneTask(spec, target).default_config()
        lanes = target.vector_lanes()
        vector = int(config["vector"])  # type: ignore[call-overload]
        assert config["mode"] == "split" and 64 % vector == 0 and vector >= lanes, dict(config)
    # four vectors of 16 lanes are the whole run: every index is affine (with 8 lanes the run is two vectors
    # of 32, and the head's index divides the outer loop)
    text = analysis.format_func(_built_default(spec, AVX512))
    assert "vectorized" in text and "//" not in text and "%" not in text, text  # affine, contiguous indices


def test_dense_column_tail_under_the_fused_parallel_loop_is_versioned() -> None:
    """PP-OCRv4's classifier head, 40x120 by 6625x120: 6625 columns in tiles of 16 leave a one-column tail under the
    fused parallel loop, tested at every lane (8x the time of the loop without it); lowering versions the nest, so
    the whole tiles run a copy without tests, and the kernel equals numpy's product."""
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(40, 120), float32], %w: Tensor[(6625, 120), float32], %b: Tensor[(6625), float32]) {
  nn.bias_add(nn.dense(%x, %w), %b)
}""")
    (spec,) = extract_tasks(optimize(infer_types(mod)))
    func = _built_default(spec, CPU)
    versions = [s for s in analysis.iter_stmts(func.body) if isinstance(s, tir.IfThenElse) and s.else_body]
    unguarded_vectors = [
        loop for v in versions for loop in analysis.iter_stmts(v.then_body)
        if isinstance(loop, tir.For) and loop.kind is tir.ForKind.VECTORIZED
        and not any(isinstance(t, tir.IfThenElse) for t in analysis.iter_stmts(loop.body))]
    assert _parallel_loops(func.body) == 1 and unguarded_vectors
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((40, 120), (6625, 120), (6625,)))
    got = relay_tune.build(mod, params={"w": w, "b": b}).run(x=x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), x @ w.T + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,m,k,n", [(0, 40, 120, 360), (0, 40, 120, 120), (36, 75, 96, 24), (3, 13, 10, 40)])
def test_default_matmul_panels_divide_rows_of_three_vectors(batch: int, m: int, k: int, n: int) -> None:
    """Rows of 24, 120 or 360 columns (Winograd's 24-channel products in DBNet, SVTR's projections) at 8 lanes: two
    vectors leave half a panel at the end of every row, three divide it; the product equals numpy's."""
    x_shape, w_shape = ((batch, m, k), (batch, n, k)) if batch else ((m, k), (n, k))
    call = "nn.batch_matmul(%x, %w, transpose_b=True)" if batch else "nn.dense(%x, %w)"
    mod = parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[{x_shape}, float32], %w: Tensor[{w_shape}, float32]) {{
  {call}
}}""")
    (spec,) = extract_tasks(optimize(infer_types(mod)))
    config = RelayTuneTask(spec, CPU).default_config()
    lanes = CPU.vector_lanes("float32")
    panel = int(config["tile_n"][-1])  # type: ignore[index]
    if n % lanes == 0 and n % (3 * lanes) == 0:
        assert n % panel == 0, dict(config)
    rng = np.random.default_rng(n)
    x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
    got = relay_tune.build(mod, params={"w": w}).run(x=x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), x @ np.swapaxes(w, -1, -2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout_planning", [False, True])
@pytest.mark.parametrize("channels,out,height,width", [(96, 24, 15, 20), (13, 10, 7, 9), (40, 20, 3, 5)])
def test_default_convolutions_with_tails_under_fused_loops_match_the_interpreter(
        channels: int, out: int, height: int, width: int, layout_planning: bool) -> None:
    """3x3 convolutions whose default tiles leave tails under the fused parallel loop (PP-OCRv4's 96 -> 24 channel
    head on a 15x20 map runs versioned nests), in NCHW and in planned blocked layouts."""
    mod = parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {height}, {width}), float32], %w: Tensor[({out}, {channels}, 3, 3), float32]) {{
  nn.relu(nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels={out}, kernel_size=[3, 3]))
}}""")
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((1, channels, height, width)).astype(np.float32)
    w = rng.standard_normal((out, channels, 3, 3)).astype(np.float32)
    want = np.asarray(Interpreter(mod).run({"x": x, "w": w}))
    got = relay_tune.build(mod, params={"w": w}, layout_planning=layout_planning).run(x=x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    # on the output's scale: planned 96-channel maps of 14x14 and more run Winograd, which rounds differently
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("size,channels", [(14, 384), (7, 960)])
def test_depthwise_row_tiles_leave_no_tail(size: int, channels: int) -> None:
    """MobileNet v2's 14-row depthwise maps in tiles of 4 rows left a tail tile, guarded inside the fused parallel
    loop at every tap (2.3-2.9x the best config); the default's row tile divides the map (7 rows: all of them).
    MobileNet v2's channel counts at those sizes, so that the work is above the parallel threshold."""
    assert channels * size * size * 9 >= PARALLEL_MIN_WORK
    mod = parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(1, {channels}, {size}, {size}), float32], %w: Tensor[({channels}, 1, 3, 3), float32]) {{
  clip(nn.conv2d(%x, %w, padding=[1, 1, 1, 1], groups={channels}, channels={channels}, kernel_size=[3, 3]),
       a_min=0f, a_max=6f)
}}""")
    (spec,) = extract_tasks(optimize(infer_types(mod)))
    config = RelayTuneTask(spec, CPU).default_config()
    assert size % int(config["tile_h"][-1]) == 0, dict(config)  # type: ignore[index]
    text = analysis.format_func(_built_default(spec, CPU))
    assert " if (" not in text and "parallel" in text, text


@pytest.mark.parametrize("name", ["families", "small_cnn", "zoo:mobilenet_v2", "zoo:bert_layer"])
def test_gpu_default_kernel_is_the_template_at_the_default_config(name: str) -> None:
    specs = _specs(name)
    assert specs
    for spec in specs:
        prim = primitive_compute(spec.func)
        config = gpu_default_config(prim, "sm_90")
        assert config_to_params(prim, config) == default_params(prim), spec.description
        built = _built_default(spec, CUDA)
        from relay_tune.compile.primitive import lower_primitive
        from search_space.gpu import steps_of_prim

        logged, _ = lower_primitive(spec.func, CUDA, steps_of_prim(prim, config), name="kernel", prim=prim)
        assert analysis.structurally_equal(built, logged), spec.description


def test_a_log_of_an_earlier_default_config_still_builds(tmp_path: Path) -> None:
    """Logs record the default config like any other: one another default rule chose (here the same config with
    the other `parallel` choice, as a rule with another threshold picks) is still a point of the space and builds
    as logged, not as today's default."""
    import json

    import numpy as np

    import relay_tune
    from relay_tune.interpreter import evaluate

    mod = infer_types(parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 3, 224, 224), float32], %s: Tensor[(3, 1, 1), float32]) {
  add(multiply(%x, %s), %s)
}"""))
    (spec,) = extract_tasks(optimize(mod))
    task = RelayTuneTask(spec, CPU)
    today = dict(task.default_config())
    earlier = {**today, "parallel": 1 - today["parallel"]}
    record = {"v": 1, "workload_key": spec.key, "description": spec.description, "target": task.target,
              "config": earlier, "costs": [1e-5], "error_kind": "OK", "trial": 0, "strategy": "default"}
    log = tmp_path / "old.jsonl"
    log.write_text(json.dumps(record) + "\n")
    model = relay_tune.build(mod, target=CPU, logs=[str(log)])
    assert all(t.tuned for t in model.plan.tasks)
    # the build's decoder gives the logged schedule, not today's default
    assert _parallel_loops(task.lower(Config(earlier)).body) == earlier["parallel"]
    assert _parallel_loops(task.lower(Config(today)).body) == today["parallel"]
    inputs = model.random_inputs(seed=0)
    np.testing.assert_allclose(model.run(**inputs), np.asarray(evaluate(mod, list(inputs.values()))), rtol=1e-5,
                               atol=1e-6)
