"""In-graph kernel times beside the tuning log's times (Python API and `relay-tune run --profile --log`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.cli import main
from relay_tune.compile import resolve_target
from relay_tune.passes import extract_tasks, optimize
from relay_tune.runtime.profile import compare_with_logs
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types
from search_space.defaults import default_steps

MODEL = """#[version = "0.0.5"]
def @main(%x: Tensor[(8, 128), float32], %w1: Tensor[(64, 128), float32], %w2: Tensor[(16, 64), float32]) {
  %0 = nn.dense(%x, %w1);
  %1 = nn.relu(%0);
  %2 = nn.dense(%1, %w2);
  sigmoid(%2)
}
"""


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, dict[str, float]]:
    from relay_tune.tuning import TuningRecord
    from search_space import Config

    mod = parse_module(MODEL)
    rng = np.random.default_rng(0)
    mod = relay_tune.bind_params(infer_types(mod), {"w1": (0.1 * rng.standard_normal((64, 128))).astype("float32"),
                                                    "w2": (0.1 * rng.standard_normal((16, 64))).astype("float32")})
    target = resolve_target("llvm")
    tasks = extract_tasks(optimize(infer_types(mod)))
    log = tmp_path_factory.mktemp("profile") / "tuning.jsonl"
    costs = {}
    lines = []
    for number, task in enumerate(tasks):
        steps = [s.to_json() for s in default_steps(task.func, target)]
        costs[task.key] = 1e-5 * (number + 1)
        lines.append(TuningRecord(task.key, target.log_name, Config({"steps": json.dumps(steps)}),
                                  (costs[task.key], 2 * costs[task.key])).to_json())
    log.write_text("\n".join(lines) + "\n")
    return mod, log, costs


def test_profile_rows_carry_the_logged_time_of_their_task(logged: tuple[object, Path, dict[str, float]]) -> None:
    mod, log, costs = logged
    assert costs
    model = relay_tune.build(mod, logs=[str(log)])
    assert all(t.tuned for t in model.plan.tasks if t.kernel)
    rows = compare_with_logs(model, [log], repeat=3)
    assert {r.profile.key for r in rows} == set(costs)
    for row in rows:
        assert row.logged == pytest.approx(costs[row.profile.key])  # the fastest repeat of the best record
        assert row.ratio == pytest.approx(row.profile.per_call / row.logged)
    # A log of another target has nothing for this model.
    other = log.with_name("other.jsonl")
    other.write_text(log.read_text().replace(f'"{model.target.log_name}"', '"llvm -mcpu=other -num-cores=3"'))
    assert all(r.logged is None and r.ratio is None for r in compare_with_logs(model, [other], repeat=1))


def test_cli_run_profile_with_log(logged: tuple[object, Path, dict[str, float]], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    mod, log, _ = logged
    path = relay_tune.build(mod, logs=[str(log)]).save(tmp_path / "m.rtmod")
    assert main(["run", str(path), "--repeat", "2", "--profile", "--log", str(log)]) == 0
    text = capsys.readouterr().out
    assert "logged" in text and "per call" in text
    assert text.count("x1 ") >= 2 and "tuned" in text
    assert "us" in text
