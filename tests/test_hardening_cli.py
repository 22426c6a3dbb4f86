"""Every bad input answered: one clear message, exit code 1, no traceback, and nothing done before the check.

The command runs in a child process (as a user runs it), some under an address-space limit: an attribute that
makes type inference build a list "as long as the attribute says" would die there with a MemoryError.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relay_tune.records.log_format import (
    SCHEMA_VERSION,
    LogEvent,
    LogWarning,
    append_lines,
    host_cpu_name,
    read_events,
    read_records,
)
from relay_tune.tuning import LogWriter, TuningRecord
from search_space import Config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "relay_tune" / "examples" / "small_cnn.relay"
HEADER = '#[version = "0.0.5"]\n'
CLI = "import sys; from relay_tune.cli import main; sys.exit(main())"


# Root passes every file permission check; without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from the
# bounding set before exec) it is held to the permission bits like any user, so the permission tests run as root too.
WITHOUT_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []


def relay_tune_cli(*args: str | Path, cwd: Path, memory_limit: int | None = None, prelude: str = "",
                   timeout: float = 300, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    command = [sys.executable, "-c", prelude + CLI, *map(str, args)]
    if unprivileged and WITHOUT_DAC:
        if shutil.which("setpriv") is None:
            pytest.fail("running as root, the permission tests need setpriv (util-linux) to drop file capabilities")
        command = WITHOUT_DAC + command

    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                          preexec_fn=limit)


def assert_clean_failure(result: subprocess.CompletedProcess[str], *phrases: str, code: int = 1) -> None:
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    err = result.stderr
    assert err.startswith("relay-tune: ") and "Traceback" not in err and "Traceback" not in result.stdout, err
    for phrase in phrases:
        assert phrase in err, err


def write(path: Path, text: str) -> Path:
    path.write_text(HEADER + text)
    return path


# ---------------------------------------------------------------------------------------------------------------
# 3. a model the reference interpreter cannot check
# ---------------------------------------------------------------------------------------------------------------

UNCHECKABLE = "def @main(%x: Tensor[(16, 16), float32]) {\n  log(negative(abs(%x)))\n}\n"  # NaN on any input
# A logarithm and a square root of inputs: not finite on signed inputs, checked on non-negative ones (their domain).
DOMAIN = "def @main(%x: Tensor[(16, 16), float32], %v: Tensor[(16, 16), float32]) {\n" \
         "  add(log(%x), divide(%x, sqrt(add(%v, 1e-05f))))\n}\n"


def test_tuning_a_model_the_reference_cannot_check_stops_before_tuning(tmp_path: Path) -> None:
    model = write(tmp_path / "logm.relay", UNCHECKABLE)
    log = tmp_path / "logm.jsonl"
    result = relay_tune_cli(model, "--trials", "2", "--log", log, cwd=tmp_path)
    assert_clean_failure(result, "task abs+negative+log 16x16", "not finite", "--no-check")
    assert not log.exists() or not log.read_text().strip()  # nothing was measured


def test_a_task_whose_inputs_have_a_domain_is_checked_on_inputs_in_it(tmp_path: Path) -> None:
    model = write(tmp_path / "norm.relay", DOMAIN)
    log = tmp_path / "norm.jsonl"
    result = relay_tune_cli(model, "--trials", "3", "--log", log, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = read_records(log)
    assert records and all(r.ok for r in records), [r.error_msg for r in records]
    assert not [e for e in read_events(log) if e.event == "numerical_check_disabled"]


def test_nonnegative_specs_keep_the_draws_of_the_others() -> None:
    from relay_tune.tuning.runner import random_inputs
    from relay_tune.tuning.task import TensorSpec

    signed = random_inputs([TensorSpec((64,), "float32"), TensorSpec((8,), "int32")], seed=3)
    positive = random_inputs([TensorSpec((64,), "float32", True), TensorSpec((8,), "int32", True)], seed=3)
    assert (signed[0] < 0).any() and (signed[1] < 0).any()
    assert (positive[0] > 0).all() and (positive[1] > 0).all()
    np.testing.assert_array_equal(np.abs(signed[0]), positive[0])
    np.testing.assert_array_equal(np.abs(signed[1]), positive[1])


def test_no_check_tunes_without_the_check_and_says_so_in_the_log(tmp_path: Path) -> None:
    model = write(tmp_path / "logm.relay", UNCHECKABLE)
    log = tmp_path / "logm.jsonl"
    result = relay_tune_cli(model, "--trials", "2", "--log", log, "--no-check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--no-check" in result.stdout
    events = [e for e in read_events(log) if e.event == "numerical_check_disabled"]
    assert len(events) == 1 and events[0].data["tasks"] == 1
    assert "--no-check" in events[0].data["reason"]


# ---------------------------------------------------------------------------------------------------------------
# 4. logs: torn, garbage, future, other targets and hosts
# ---------------------------------------------------------------------------------------------------------------

TINY = "def @main(%x: Tensor[(8, 16), float32], %w: Tensor[(4, 16), float32]) {\n  nn.dense(%x, %w)\n}\n"


def test_build_skips_foreign_and_broken_log_lines_with_one_warning_each(tmp_path: Path) -> None:
    from relay_tune.compile import resolve_target
    from relay_tune.passes import optimize
    from relay_tune.passes.extract_tasks import extract_tasks
    from relay_tune.text import parse_module
    from relay_tune.type_infer import infer_types

    model = write(tmp_path / "tiny.relay", TINY)
    (spec,) = extract_tasks(optimize(infer_types(parse_module(model.read_text()))))
    here = resolve_target("llvm")
    config = Config({"steps": "[]"})
    mine = TuningRecord(spec.key, here.log_name, config, (1e-4,), host_cpu=host_cpu_name())
    log = tmp_path / "mixed.jsonl"
    lines = [mine.to_json()]
    lines += [TuningRecord(spec.key, "cuda -arch=sm_80", config, (1e-6,)).to_json()] * 3  # another target
    lines += [TuningRecord(spec.key, here.log_name, config, (1e-7,), host_cpu="some-other-cpu").to_json()] * 2
    lines += ["garbage that is not JSON", '{"v": 99, "workload_key": "from the future"}', "[" * 100_000]
    torn = mine.to_json()
    log.write_text("\n".join(lines) + "\n" + torn[: len(torn) // 2])  # killed during a write
    # the in-graph timing check is skipped: on a loaded machine it may drop the record (its kernel, an unscheduled
    # loop nest, is slower than the default one), and the record's use is what is tested here
    result = relay_tune_cli("build", model, "-o", tmp_path / "m.rtmod", "--log", log, "--no-check-tuned", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    out = result.stdout + result.stderr
    assert out.count("skipped 3 of other targets (cuda -arch=sm_80) and 2 measured on other CPUs (some-other-cpu)") \
        == 1
    assert out.count("skipped 4 unreadable log lines (1 newer schema, 3 not JSON)") == 1
    assert "(1 tuned" in result.stdout  # the one usable record was used


def test_logs_summary_gives_one_warning_per_log(tmp_path: Path) -> None:
    log = tmp_path / "l.jsonl"
    good = TuningRecord("k" * 64, "llvm -num-cores=1", Config({"a": 1}), (1e-3,))
    log.write_text("\n".join([good.to_json(), "x", "y", '{"v": 2}', good.to_json()[:30]]) + "\n")
    result = relay_tune_cli("logs", "summary", log, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("warning:") == 1
    assert "skipped 4 unreadable log lines (1 newer schema, 3 not JSON)" in result.stdout


def test_future_schema_is_counted_as_newer(tmp_path: Path) -> None:
    from relay_tune.tuning import read_records

    log = tmp_path / "l.jsonl"
    log.write_text(json.dumps({"v": SCHEMA_VERSION + 1, "anything": [1, 2]}) + "\n")
    with pytest.warns(LogWarning, match=r"1 newer schema"):
        assert read_records(log) == []


_WRITER = """
import sys
from relay_tune.records.log_format import append_lines
path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(count):
    pad = "z" * (i * 997 % 20000)  # lines of many sizes, most larger than PIPE_BUF
    append_lines(path, ['{"v": 1, "event": "e", "session": "%s", "data": {"i": %d, "pad": "%s"}}' % (tag, i, pad)])
"""


def test_several_processes_appending_never_interleave(tmp_path: Path) -> None:
    log = tmp_path / "shared.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(log), f"p{n}", "60"], env=env) for n in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    lines = log.read_text().splitlines()
    assert len(lines) == 240
    events = [json.loads(line) for line in lines]  # any interleaving breaks a line's JSON
    for n in range(4):
        assert [e["data"]["i"] for e in events if e["session"] == f"p{n}"] == list(range(60))


def test_a_full_disk_while_tuning_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from relay_tune.resources import ResourceError

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ResourceError, match=r"cannot append to the tuning log .*l.jsonl: No space left on device"):
        append_lines(tmp_path / "l.jsonl", [LogEvent("x").to_json()])
    monkeypatch.undo()
    LogWriter(tmp_path / "l.jsonl").write_one(LogEvent("after"))  # the log is usable once there is room again
    assert [e.event for e in read_events(tmp_path / "l.jsonl")] == ["after"]


# ---------------------------------------------------------------------------------------------------------------
# 5. absurd attributes, unwritable folders, full disks, bad files, unsupported ONNX, models too big for memory
# ---------------------------------------------------------------------------------------------------------------

ABSURD = [
    ("expand_dims(%x, axis=0, num_newaxis=2147483648)", "at most 64"),
    ("expand_dims(%x, axis=0, num_newaxis=1099511627776)", "at most 64"),
    ("nn.lrn(%x, size=1099511627776)", "size=1099511627776"),
    ("reshape(%x, newshape=[1099511627776, 1099511627776, 0])", "type error"),
    ("split(%x, indices_or_sections=4294967296, axis=1).0", "type error"),
    ("transpose(%x, axes=[0, 1, 2, 4294967296])", "type error"),
    ("sum(%x, axis=[9223372036854775807])", "type error"),
    ("nn.max_pool2d(%x, pool_size=[4294967296, 4294967296])", "type error"),
    ("nn.upsampling(%x, scale_h=1e+30f, scale_w=1e+30f)", "type error"),
    ("nn.pad(%x, 0f, pad_width=[[0, 0], [0, 0], [0, 1099511627776], [0, 1099511627776]])", "type error"),
]


@pytest.mark.parametrize(("call", "phrase"), ABSURD)
def test_absurd_attribute_is_a_type_error_not_an_allocation(call: str, phrase: str, tmp_path: Path) -> None:
    model = write(tmp_path / "absurd.relay", f"def @main(%x: Tensor[(1, 4, 6, 6), float32]) {{\n  {call}\n}}\n")
    result = relay_tune_cli("check", model, cwd=tmp_path, memory_limit=1 << 31, timeout=120)
    assert_clean_failure(result, phrase, "absurd.relay:")


def test_absurd_dimension_in_an_annotation_is_a_type_error(tmp_path: Path) -> None:
    model = write(tmp_path / "dim.relay", "def @main(%x: Tensor[(0, 8, 1099511627776, 1099511627776), float32]) {\n"
                  "  nn.avg_pool2d(%x, pool_size=[3, 3])\n}\n")
    result = relay_tune_cli("check", model, cwd=tmp_path, memory_limit=1 << 31, timeout=120)
    assert_clean_failure(result, "more elements than any tensor can have")


def test_unwritable_log_folder(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    result = relay_tune_cli(EXAMPLE, "--trials", "1", "--log", tmp_path / "afile" / "l.jsonl", cwd=tmp_path)
    assert_clean_failure(result, "cannot create the folder", "afile is a file")
    result = relay_tune_cli("build", EXAMPLE, "-o", tmp_path / "afile" / "m.rtmod", cwd=tmp_path)
    assert_clean_failure(result, "for the model file")


def test_read_only_log_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = relay_tune_cli(EXAMPLE, "--trials", "1", "--log", folder / "l.jsonl", cwd=tmp_path,
                                unprivileged=True)
        assert_clean_failure(result, "cannot write the tuning log", "Permission denied")
    finally:
        folder.chmod(0o755)


def test_log_that_is_not_a_file(tmp_path: Path) -> None:
    result = relay_tune_cli(EXAMPLE, "--trials", "1", "--log", "/dev/full", cwd=tmp_path, timeout=120)
    assert_clean_failure(result, "/dev/full is not a regular file")


FULL_DISK = ("import os, collections\n"
             "_real = os.statvfs\n"
             "def _full(path):\n"
             "    s = _real(path)\n"
             "    return os.statvfs_result((s.f_bsize, s.f_frsize, s.f_blocks, 0, 0, s.f_files, s.f_ffree, "
             "s.f_favail, s.f_flag, s.f_namemax))\n"
             "os.statvfs = _full\n")


def test_full_disk_before_tuning(tmp_path: Path) -> None:
    result = relay_tune_cli(EXAMPLE, "--trials", "1", "--log", tmp_path / "l.jsonl", cwd=tmp_path,
                            prelude=FULL_DISK)
    assert_clean_failure(result, "no space left for the tuning log", "0 bytes free")
    assert not (tmp_path / "l.jsonl").exists()


def _mount_tiny_tmpfs(where: Path) -> bool:
    where.mkdir()
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(where)],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_full_tmpfs_before_tuning(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"
    if not _mount_tiny_tmpfs(tiny):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        (tiny / "fill").write_bytes(b"\0" * 100_000)
        result = relay_tune_cli(EXAMPLE, "--trials", "1", "--log", tiny / "l.jsonl", cwd=tmp_path)
        assert_clean_failure(result, "no space left for the tuning log", "No space left on device")
    finally:
        subprocess.run(["umount", str(tiny)], capture_output=True, timeout=10)


def test_unreadable_model(tmp_path: Path) -> None:
    model = tmp_path / "secret.relay"
    model.write_text(EXAMPLE.read_text())
    model.chmod(0)
    assert_clean_failure(relay_tune_cli("check", model, cwd=tmp_path, unprivileged=True), "cannot be read",
                         "Permission denied")


@pytest.mark.parametrize(("name", "content", "phrase"), [
    ("folder.relay", None, "is a folder"),
    ("cut.relay", HEADER + "def @main(%x: Tensor[(1, 4), float32]) {\n  nn.relu(%x", "cut.relay:3:"),
    ("binary.relay", b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 40, "invalid UTF-8 byte"),
    ("empty.relay", "", "empty.relay:"),
    ("garbage.onnx", b"\x08\x07this is no protobuf" * 10, "not a readable ONNX model"),
    ("empty.onnx", b"", "no graph outputs"),
])
def test_corrupt_or_unreadable_model_files(name: str, content: str | bytes | None, phrase: str,
                                           tmp_path: Path) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    for command in (["check", path], ["build", path, "-o", tmp_path / "m.rtmod"]):
        result = relay_tune_cli(*command, cwd=tmp_path)
        assert_clean_failure(result, phrase)
        assert len(result.stderr) < 2000  # one message, not a dump of the binary


def _onnx_model(nodes: list[onnx.NodeProto], opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_truncated_onnx_model(tmp_path: Path) -> None:
    data = _onnx_model([helper.make_node("Relu", ["x"], ["y"])]).SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    assert_clean_failure(relay_tune_cli("check", tmp_path / "cut.onnx", cwd=tmp_path), "cut.onnx")


def test_unsupported_onnx_operator_names_operator_node_and_opset(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first_relu"),
             helper.make_node("ImageDecoder", ["r"], ["y"], name="the_decoder")]
    onnx.save(_onnx_model(nodes, opset=14), str(tmp_path / "hm.onnx"))
    result = relay_tune_cli("build", tmp_path / "hm.onnx", "-o", tmp_path / "m.rtmod", cwd=tmp_path)
    assert_clean_failure(result, "ImageDecoder", "node #1 'the_decoder'", "opset 14")
    assert not (tmp_path / "m.rtmod").exists()


HUGE = "def @main(%x: Tensor[(65536, 1048576), float32]) {\n  nn.relu(%x)\n}\n"  # 256 GiB in, 256 GiB out


def test_model_larger_than_memory_fails_before_work(tmp_path: Path) -> None:
    model = write(tmp_path / "huge.relay", HUGE)
    for command in (["build", model, "-o", tmp_path / "m.rtmod"], [model, "--trials", "1", "--log", tmp_path / "l"]):
        result = relay_tune_cli(*command, cwd=tmp_path, timeout=120)
        assert_clean_failure(result, "needs 512.00 GiB of memory", "available")
    assert not (tmp_path / "l").exists()


def test_memory_plan_check_in_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact plan (not only the type-level bound) is checked: with 1 MiB 'available' a small model fails."""
    import relay_tune
    from relay_tune import resources
    from relay_tune.text import load_module

    mod = load_module(EXAMPLE)
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 1 << 18)
    with pytest.raises(resources.ResourceError, match=r"the model's memory plan needs .* \(intermediates"):
        relay_tune.build(mod, target="llvm")


def test_model_without_main(tmp_path: Path) -> None:
    model = write(tmp_path / "no_main.relay", "def @aux(%x: Tensor[(4), float32]) {\n  nn.relu(%x)\n}\n")
    for command in (["build", model, "-o", tmp_path / "m.rtmod"], [model, "--trials", "1", "--log", tmp_path / "l"]):
        assert_clean_failure(relay_tune_cli(*command, cwd=tmp_path), "no @main function", "@aux")


def test_only_the_inputs_whose_domain_needs_it_are_drawn_non_negative() -> None:
    from relay_tune.text import parse_module
    from relay_tune.tuning.relay_task import tasks_from_module
    from relay_tune.tuning.tune_model import check_references

    # x is any real number; v is a variance (its square root is taken).
    mod = parse_module(HEADER + "def @main(%x: Tensor[(16, 16), float32], %v: Tensor[(16, 16), float32]) {\n"
                       "  divide(%x, sqrt(add(%v, 1e-05f)))\n}\n")
    (task,) = tasks_from_module(mod, "llvm")
    x_index, v_index = 0, 1
    check_references([task])
    assert task.nonnegative_inputs == frozenset({v_index})
    specs = task.input_specs()
    assert specs[v_index].nonnegative and not specs[x_index].nonnegative
