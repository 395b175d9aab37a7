"""Executes every notebook under notebooks/ top to bottom (they hold no logic of
their own; a failing cell fails the test)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

pytestmark = [pytest.mark.integration, pytest.mark.notebook]


def execute(path, cwd, timeout=600):
    """Runs a notebook in a fresh kernel with `cwd` as its working directory; returns it."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def outputs_text(nb):
    chunks = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            chunks.append(out.get("text", "") or "".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(chunks)


def test_there_are_notebooks():
    assert any(p.name == "quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nb = execute(path, tmp_path)
    if path.stem == "quickstart":
        text = outputs_text(nb)
        assert "test_accuracy:" in text and "metrics.json" in text
        assert (tmp_path / "runs" / "quickstart" / "metrics.json").exists()
    elif path.stem == "profiling":
        text = outputs_text(nb)
        assert "traced steps: (8, 16)" in text
        assert "tensorboard --logdir runs/profiling-notebook-" in text
        assert "step time median:" in text and "step time p90:" in text
        assert "input: input-bound" in text or "input: not input-bound" in text
        assert "batch size search: batch size " in text and "(throughput, power)" in text
        assert "weights unchanged by the search: True" in text
        (run_dir,) = (tmp_path / "runs").iterdir()
        assert list(run_dir.glob("logs/train/plugins/profile/*/*.xplane.pb"))
