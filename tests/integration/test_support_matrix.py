"""The support matrix's in-process columns: every model shape (tests/matrix/shapes.py) through every
feature of one process (tests/matrix/cells.py), each cell trained and its figure checked, or refused
before training; the results must be those in tests/matrix/results.json, which docs/support-matrix.md
shows (`TFTRAIN_WRITE_MATRIX=1` writes them there)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV
from tests.matrix import table

pytestmark = pytest.mark.integration


def _cells(tmp_path, *args):
    out = tmp_path / "cells.json"
    env = {**__import__("os").environ, **SUBPROCESS_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-m", "tests.matrix.cells", "--out", str(out), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(1600)
def test_every_shape_through_every_feature_of_one_process(tmp_path):
    found = _cells(tmp_path)
    failed = [f"{row} / {column}: {status}" for row, cells in found.items() for column, status in cells.items()
              if table.kind(status) not in ("ok", "refused")]
    assert not failed, "\n".join(failed)
    assert not table.check_or_write(found)


@pytest.mark.timeout(600)
def test_every_shape_under_mirrored_on_two_logical_cpus(tmp_path):
    found = _cells(tmp_path, "--cpu-replicas", "2")
    failed = [f"{row}: {cells}" for row, cells in found.items() if table.kind(next(iter(cells.values()))) == "failed"]
    assert not failed, "\n".join(failed)
    assert not table.check_or_write(found)
