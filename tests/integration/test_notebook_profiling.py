"""notebooks/profiling.ipynb runs from top to bottom and shows what it promises."""

import pytest

from conftest import REPO
from notebook_runner import cell_text, execute_notebook

pytestmark = [pytest.mark.integration, pytest.mark.notebook]


def test_profiling_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    notebook = execute_notebook(REPO / "notebooks" / "profiling.ipynb", cwd=tmp_path, timeout=600)
    text = cell_text(notebook)
    assert "traced steps: (8, 16)" in text
    assert "tensorboard --logdir runs/profiling-notebook-" in text
    assert "step time median:" in text and "step time p90:" in text
    assert "input: input-bound" in text or "input: not input-bound" in text
    assert "batch size search: batch size " in text and "(throughput, power)" in text
    assert "weights unchanged by the search: True" in text
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert list(run_dir.glob("logs/train/plugins/profile/*/*.xplane.pb"))
