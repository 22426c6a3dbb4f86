"""The analysis notebook runs against a real (small) tuning log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relay_tune.tuning import LocalBuilder, LocalRunner, tune
from relay_tune.tuning.testing import FaultyTask, MatmulTask

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO_ROOT / "experiments" / "analysis.ipynb"


def _outputs_text(notebook: object) -> str:
    texts = []
    for cell in notebook.cells:  # type: ignore[attr-defined]
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            texts.extend(str(v) for v in output.get("data", {}).values())
    return "\n".join(texts)


def test_analysis_notebook_executes_on_a_tuning_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbclient
    import nbformat

    log = tmp_path / "logs" / "small.jsonl"
    tasks = [MatmulTask(16, 24, 16, weight=2), FaultyTask(size=128, variants=("plain", "wrong", "segfault"),
                                                           max_repeat=2)]
    with LocalBuilder(n_parallel=2, timeout=20.0) as builder, LocalRunner(timeout=5.0, min_repeat_ms=2) as runner:
        tune(tasks, 12, log, builder=builder, runner=runner, batch_size=4)

    figures = tmp_path / "figures"
    monkeypatch.setenv("RELAY_TUNE_LOGS", str(tmp_path / "logs" / "*.jsonl"))
    monkeypatch.setenv("RELAY_TUNE_FIGURES", str(figures))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO_ROOT)}})
    client.execute()

    text = _outputs_text(notebook)
    assert "12 records from 1 log(s)" in text
    assert "matmul 16x16 @ 16x24 float32" in text and "add 128 float32" in text
    assert "WRONG_RESULT" in text or "RUNTIME_ERROR" in text
    assert "finished" in text
    assert (figures / "tuning_curves.png").stat().st_size > 0
    assert (figures / "time_split.png").stat().st_size > 0
