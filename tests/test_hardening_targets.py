"""Bad targets: one clear message naming the valid choices and exit code 2, never an abort inside LLVM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay_tune.compile import resolve_target
from relay_tune.target import Target, TargetError, llvm_cpu_features, llvm_cpu_names

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "relay_tune" / "examples" / "small_cnn.relay"


def relay_tune_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real command in a child process (an LLVM abort would kill it: no in-process test can see that)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    code = "import sys; from relay_tune.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def test_llvm_lists_cpus_and_features_without_printing() -> None:
    cpus, features = llvm_cpu_names(), llvm_cpu_features()
    host = Target.host()
    assert host.mcpu in cpus and "x86-64" in cpus and "avx2" in features
    assert all(f[1:] in features for f in host.mattr)  # the host's own features are all in LLVM's list


@pytest.mark.parametrize(("target", "names"), [
    ("llvm -mcpu=bogus", ["-mcpu=bogus", "haswell", "znver4"]),
    ("llvm -mcpu=haswel", ["did you mean haswell"]),
    ("llvm -mattr=+nope", ["-mattr=+nope", "avx512f", "+name or -name"]),
    ("llvm -mattr=+avx2,+nope,-fake", ["-fake", "+nope", "features"]),
    ("cuda -arch=sm_1", ["sm_1", "sm_80", "sm_90"]),
    ("foo", ["'foo'", "llvm, cuda"]),
    ("llvm -num-cores=0", ["positive integer"]),
    ("llvm -num-cores=100000", ["1 to 1024"]),
    ("llvm -num-cores=two", ["positive integer"]),
    ("llvm -speed=max", ["unknown target option -speed"]),
])
def test_bad_target_is_a_target_error_naming_the_choices(target: str, names: list[str]) -> None:
    with pytest.raises(TargetError) as info:
        resolve_target(target)
    for name in names:
        assert name in str(info.value)


def test_valid_targets_pass() -> None:
    assert resolve_target("llvm -mcpu=skylake-avx512 -mattr=+avx512f,-avx512bw -num-cores=4").mcpu == "skylake-avx512"
    assert resolve_target("cuda -arch=sm_80").arch == "sm_80"
    assert resolve_target("native").mcpu == Target.host().mcpu


@pytest.mark.parametrize("target", ["llvm -mcpu=bogus", "llvm -mattr=+nope", "cuda -arch=sm_1", "foo"])
def test_cli_bad_target_exit_code_2(target: str, tmp_path: Path) -> None:
    for command in (["build", str(MODEL), "-o", str(tmp_path / "m.rtmod")],
                    ["tune", str(MODEL), "--trials", "1", "--log", str(tmp_path / "t.jsonl")]):
        result = relay_tune_cli(*command, "--target", target, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("relay-tune: ") and "Traceback" not in result.stderr
        assert "LLVM ERROR" not in result.stderr and "not a recognized" not in result.stderr
        assert not (tmp_path / "m.rtmod").exists() and not (tmp_path / "t.jsonl").exists()
