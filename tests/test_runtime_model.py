"""Compiled models: running (inputs, outputs, aliases), measuring, and saving/loading without recompiling."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.jit import aligned_empty
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import IRModule
from relay_tune.runtime.model import (
    CompiledModel,
    GraphPlan,
    ModelFormatError,
    ModelInputError,
    TargetMismatchError,
    check_target_compatible,
    load,
    read_manifest,
)
from relay_tune.target import Target
from relay_tune.text import parse_module

RNG = np.random.default_rng(7)

# conv2d+bias+relu -> reshape (an alias: no kernel) -> dense; returns both the dense result and the reshape.
CNN = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 3, 12, 12), float32], %w: Tensor[(8, 3, 3, 3), float32], %b: Tensor[(8), float32],
          %w2: Tensor[(10, 1152), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=8, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, %b);
  %2 = nn.relu(%1);
  %3 = reshape(%2, newshape=[1, 1152]);
  %4 = nn.dense(%3, %w2);
  (%4, %3)
}
"""


def cnn_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "w": rng.standard_normal((8, 3, 3, 3)).astype("float32"),
        "b": rng.standard_normal(8).astype("float32"),
        "w2": (0.1 * rng.standard_normal((10, 1152))).astype("float32"),
    }


@pytest.fixture(scope="module")
def cnn_mod() -> IRModule:
    return parse_module(CNN)


@pytest.fixture(scope="module")
def cnn(cnn_mod: IRModule) -> CompiledModel:
    # NCHW throughout: 8 channels are one vector of an AVX2 target, whose layout planning would block them (NCHW8c)
    # and add layout transforms around the convolution on some hosts and not others
    return relay_tune.build(cnn_mod, params=cnn_params(), layout_planning=False)


def reference(mod: IRModule, params: dict[str, np.ndarray], **inputs: np.ndarray) -> object:
    return evaluate(mod, {**inputs, **params})


def test_run_matches_interpreter_positionally_and_by_name(cnn_mod: IRModule, cnn: CompiledModel) -> None:
    x = RNG.standard_normal((1, 3, 12, 12)).astype("float32")
    expected = reference(cnn_mod, cnn_params(), x=x)
    for got in (cnn.run(x), cnn.run(x=x), cnn(x)):
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)  # type: ignore[index]
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)  # type: ignore[index]


def test_reshape_group_is_an_alias_written_by_the_kernel_before_it(cnn: CompiledModel) -> None:
    plan = cnn.plan
    assert len(plan.calls) == 2  # conv and dense; the reshape costs nothing
    assert sum(1 for t in plan.tasks if not t.kernel) == 1
    conv, _dense = plan.calls
    conv_out = plan.values[conv.args[-1]]
    reshaped = plan.values[plan.outputs[1]]  # type: ignore[index]
    assert reshaped.storage == conv_out.storage and reshaped.shape == (1, 1152) and conv_out.shape == (1, 8, 12, 12)
    # The alias is returned, so the conv writes straight into an output buffer instead of the arena.
    assert plan.storages[conv_out.storage].kind == "output"
    assert cnn.memory_report().aliased_tensors == 1


def test_results_are_fresh_arrays_every_run(cnn: CompiledModel) -> None:
    x1 = RNG.standard_normal((1, 3, 12, 12)).astype("float32")
    x2 = RNG.standard_normal((1, 3, 12, 12)).astype("float32")
    first = cnn.run(x1)
    kept = [a.copy() for a in first]  # type: ignore[union-attr]
    second = cnn.run(x2)
    for a, b in zip(first, kept):  # type: ignore[arg-type]
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], second[0])  # type: ignore[index]


def test_unaligned_and_non_contiguous_inputs_are_staged(cnn: CompiledModel) -> None:
    x = RNG.standard_normal((1, 3, 12, 12)).astype("float32")
    expected = cnn.run(x)
    raw = aligned_empty(x.size + 1, "float32")
    unaligned = raw[1:].reshape(x.shape)  # 4 bytes past a 64-byte boundary
    unaligned[...] = x
    assert unaligned.ctypes.data % 64
    strided = np.zeros((1, 3, 12, 24), "float32")[..., ::2]
    strided[...] = x
    assert not strided.flags.c_contiguous
    for variant in (unaligned, strided, x.tolist()):
        got = cnn.run(variant)
        np.testing.assert_array_equal(got[0], expected[0])  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing input"),
        ((), {"y": 1}, "unknown input 'y'"),
        ((np.zeros((1, 3, 12, 12), "float32"),), {"x": 0}, "both by position and by name"),
        ((np.zeros((1, 3, 12, 12), "float32"), 1), {}, "takes 1 input"),
        ((np.zeros((1, 3, 12, 12), "float64"),), {}, "expected dtype float32"),
        ((np.zeros((1, 3, 12, 11), "float32"),), {}, "expected shape (1, 3, 12, 12)"),
        (("text",), {}, "expected a numpy array"),
    ],
)
def test_input_errors_are_clear(cnn: CompiledModel, args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ModelInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cnn.run(*args, **kwargs)
    assert issubclass(ModelInputError, RelayTuneError)


def test_outputs_that_are_inputs_constants_or_repeated_get_their_own_arrays() -> None:
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(4, 5), float32], %c: Tensor[(5), float32]) {
  %0 = add(%x, %c);
  %1 = reshape(%x, newshape=[20]);
  (%0, %x, %0, %1, %c)
}
""")
    c = np.arange(5, dtype="float32")
    model = relay_tune.build(mod, params={"c": c})
    x = RNG.standard_normal((4, 5)).astype("float32")
    out = model.run(x)
    assert isinstance(out, tuple) and len(out) == 5
    np.testing.assert_allclose(out[0], x + c)
    np.testing.assert_array_equal(out[1], x)
    np.testing.assert_array_equal(out[2], out[0])
    np.testing.assert_array_equal(out[3], x.reshape(20))
    np.testing.assert_array_equal(out[4], c)
    assert not np.shares_memory(out[1], x) and not np.shares_memory(out[3], x)
    assert not np.shares_memory(out[0], out[2])
    out[4][0] = 99.0  # mutating a returned constant never changes the model
    np.testing.assert_array_equal(model.run(x)[4], c)


@pytest.mark.parametrize(
    "body",
    [
        # a kernel with two outputs (split), one of them also read by another kernel
        "%0 = split(%x, indices_or_sections=2, axis=1); %1 = exp(%0.1); (%0.0, %1, %0.1)",
        # a tuple of two kernels' results passed to one kernel (concatenate takes a tuple parameter)
        "%0 = nn.dense(%x, %w1); %1 = nn.dense(%x, %w2); %2 = (%0, %1); %3 = concatenate(%2, axis=1); "
        "(nn.relu(%3), %2)",
    ],
)
def test_tuples_into_and_out_of_kernels(body: str) -> None:
    mod = parse_module(
        '#[version = "0.0.5"]\n'
        "def @main(%x: Tensor[(3, 8), float32], %w1: Tensor[(5, 8), float32], %w2: Tensor[(7, 8), float32]) {\n"
        + body.replace("; ", ";\n") + "\n}"
    )
    model = relay_tune.build(mod)
    inputs = model.random_inputs(2)
    expected = evaluate(mod, inputs)
    got = model.run(**inputs)

    def leaves(value: object) -> list[np.ndarray]:
        return [x for item in value for x in leaves(item)] if isinstance(value, tuple) else [value]  # type: ignore[list-item]

    assert [a.shape for a in leaves(got)] == [a.shape for a in leaves(expected)]
    for a, b in zip(leaves(got), leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_intermediates_share_the_arena() -> None:
    # Four convolutions in a chain: each intermediate dies after the next conv, so two slots are enough.
    lines = ['#[version = "0.0.5"]',
             "def @main(%x: Tensor[(1, 4, 10, 10), float32], %w: Tensor[(4, 4, 3, 3), float32]) {"]
    lines.append("  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3]);")
    for i in range(1, 5):
        lines.append(f"  %{2 * i - 1} = nn.relu(%{2 * i - 2});")
        lines.append(f"  %{2 * i} = nn.conv2d(%{2 * i - 1}, %w, padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3]);")
    lines.append("  %8\n}")
    mod = parse_module("\n".join(lines))
    w = (0.3 * RNG.standard_normal((4, 4, 3, 3))).astype("float32")
    model = relay_tune.build(mod, params={"w": w})
    report = model.memory_report()
    assert report.intermediate_tensors == 4
    assert report.naive_bytes == 4 * 1600
    assert report.arena_bytes == report.lower_bound_bytes == 2 * 1600
    x = RNG.standard_normal((1, 4, 10, 10)).astype("float32")
    np.testing.assert_allclose(model.run(x), evaluate(mod, {"x": x, "w": w}), rtol=1e-4, atol=1e-4)
    assert "arena" in str(report)


def test_benchmark_and_profile(cnn: CompiledModel) -> None:
    stats = cnn.benchmark(repeat=5, number=3)
    assert len(stats.costs) == 5 and stats.number == 3
    assert 0 < stats.min <= stats.median <= stats.max
    assert "median" in str(stats)
    rows = cnn.profile(repeat=3)
    assert {r.description.split()[0] for r in rows} == {"conv2d_nchw+bias+relu", "dense"}
    assert all(r.calls == 1 and r.seconds > 0 for r in rows)
    assert abs(sum(r.share for r in rows) - 1.0) < 1e-9
    with pytest.raises(RelayTuneError):
        cnn.benchmark(repeat=0)


def test_plan_json_round_trip(cnn: CompiledModel) -> None:
    text = json.dumps(cnn.plan.to_json())
    assert GraphPlan.from_json(json.loads(text)) == cnn.plan


# ---------------------------------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------------------------------


def test_save_load_round_trip_gives_identical_outputs_without_compiling(
    cnn: CompiledModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cnn.save(tmp_path / "cnn.rtmod")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    assert "manifest.json" in names and any(n.endswith(".o") for n in names)
    assert all(n.endswith((".json", ".o", ".npy")) for n in names)

    import relay_tune.codegen.llvm as llvm_codegen
    import relay_tune.compile.primitive as primitive

    def no_compiling(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("loading a saved model must not compile")

    # every module that holds the compiling functions by name (imported at module level), not only their homes
    originals = {id(llvm_codegen.compile_object), id(primitive.lower_primitive)}
    for module in [m for name, m in sys.modules.items() if name.startswith("relay_tune") and m is not None]:
        for attr in ("compile_object", "lower_primitive"):
            if id(getattr(module, attr, None)) in originals:
                monkeypatch.setattr(module, attr, no_compiling)
    loaded = relay_tune.runtime.load(path)
    x = RNG.standard_normal((1, 3, 12, 12)).astype("float32")
    for a, b in zip(cnn.run(x), loaded.run(x)):  # type: ignore[arg-type]
        np.testing.assert_array_equal(a, b)
    assert loaded.plan == cnn.plan and loaded.target == cnn.target
    assert read_manifest(path)["format"] == "relay-tune-model"


def _rewrite_manifest(src: Path, dst: Path, change: dict) -> None:
    with zipfile.ZipFile(src) as archive, zipfile.ZipFile(dst, "w") as out:
        for item in archive.infolist():
            data = archive.read(item.filename)
            if item.filename == "manifest.json":
                manifest = json.loads(data)
                manifest.update(change)
                data = json.dumps(manifest).encode()
            out.writestr(item, data)


def test_loading_refuses_other_cpus_versions_and_garbage(cnn: CompiledModel, tmp_path: Path) -> None:
    path = cnn.save(tmp_path / "ok.rtmod")
    host = Target.host()
    absent = next((f[1:] for f in host.mattr if f.startswith("-")), None) or "avx512vp2intersect"
    foreign = Target("llvm", host.mcpu, (*[f for f in host.mattr if f[1:] != absent], f"+{absent}"), 1)
    bad_target = tmp_path / "other_cpu.rtmod"
    _rewrite_manifest(path, bad_target, {"target": str(foreign)})
    with pytest.raises(TargetMismatchError, match=absent):
        load(bad_target)
    assert load(bad_target, check_target=False).run(np.zeros((1, 3, 12, 12), "float32"))[0].shape == (1, 10)

    other_arch = tmp_path / "arm.rtmod"
    _rewrite_manifest(path, other_arch, {"triple": "aarch64-unknown-linux-gnu"})
    with pytest.raises(TargetMismatchError, match="aarch64"):
        load(other_arch)

    future = tmp_path / "future.rtmod"
    _rewrite_manifest(path, future, {"format_version": 999})
    with pytest.raises(ModelFormatError, match="version 999"):
        load(future)

    garbage = tmp_path / "garbage.rtmod"
    garbage.write_bytes(b"not a zip file at all")
    with pytest.raises(ModelFormatError, match="not a zip"):
        load(garbage)
    truncated = tmp_path / "truncated.rtmod"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelFormatError):
        load(truncated)
    with pytest.raises(ModelFormatError, match="no such file"):
        load(tmp_path / "missing.rtmod")


def test_a_damaged_plan_is_refused_before_any_kernel_runs(cnn: CompiledModel, tmp_path: Path) -> None:
    path = cnn.save(tmp_path / "ok.rtmod")
    plan = cnn.plan.to_json()
    for damage in ("shrink_storage", "constant_size", "dangling_value"):
        bad = json.loads(json.dumps(plan))
        if damage == "shrink_storage":
            output = next(s for s in bad["storages"] if s["kind"] == "output")
            output["nbytes"] = 4  # a kernel would write past the end of the buffer
        elif damage == "constant_size":
            constant = next(s for s in bad["storages"] if s["kind"] == "constant")
            constant["nbytes"] *= 2
        else:
            bad["calls"][0]["args"][0] = len(bad["values"]) + 5
        target = tmp_path / f"{damage}.rtmod"
        _rewrite_manifest(path, target, {"plan": bad})
        with pytest.raises(ModelFormatError):
            load(target)


def test_hand_made_plans_are_checked() -> None:
    from relay_tune.runtime.memory_plan import MemoryPlan
    from relay_tune.runtime.model import InputInfo, Storage, Value

    def plan(offset: int, arena: int) -> GraphPlan:
        return GraphPlan(
            inputs=(InputInfo("x", 0),),
            values=(Value((4,), "float32", 0), Value((4,), "float32", 1)),
            storages=(Storage("input", 0, 16), Storage("arena", 0, 16)),
            calls=(),
            outputs=(0, 1),
            tasks=(),
            memory=MemoryPlan(offsets=(offset,), sizes=(64,), arena_bytes=arena, naive_bytes=64, lower_bound_bytes=64),
        )

    host = Target.host()
    model = CompiledModel(plan(0, 64), [], [], host, libraries=[])
    x = np.arange(4, dtype="float32")
    got = model.run(x)
    np.testing.assert_array_equal(got[0], x)  # type: ignore[index]
    assert got[1].shape == (4,)  # type: ignore[index]
    for offset, arena in ((64, 64), (8, 128)):  # outside the arena; misaligned
        with pytest.raises(ModelFormatError, match="arena"):
            CompiledModel(plan(offset, arena), [], [], host, libraries=[])


def test_target_check_accepts_this_machine_and_implied_features() -> None:
    host = Target.host()
    check_target_compatible(host)
    check_target_compatible(Target("llvm", "", (), 1))  # generic x86-64 code runs anywhere
    with pytest.raises(TargetMismatchError, match="llvm"):
        check_target_compatible(Target("cuda", arch="sm_90"))
    old_cpu = Target("llvm", "x86-64", (), 1)
    assert check_target_compatible(old_cpu, host=old_cpu) is None
    with pytest.raises(TargetMismatchError, match="avx512f"):
        check_target_compatible(Target("llvm", "skylake-avx512", (), 1), host=Target("llvm", "haswell", (), 1))
