"""TensorFlow's "Multi-worker training with Keras" tutorial under `python -m tftrain.launch`.

The tutorial's two files are vendored in `tf_tutorial/`: `mnist_setup.py` verbatim and
`main.py` with only its strategy line changed to
`tftrain.runtime.KerasMultiWorkerMirroredStrategy()` (plus `import tftrain.runtime`);
`*.orig` hold the tutorial's text. The run is the tutorial's but for its length: 3 epochs
of 20 steps where the tutorial has 70 (`SHORT_FIT`), to keep the suite short; global
batch 128. The unmodified script fails under Keras 3 as keras-team/keras#20585 says.

Offline: the tutorial calls `tf.keras.datasets.mnist.load_data()`, which accepts a
cached `mnist.npz` only if its sha256 is Keras's; tftrain's bundled copy holds the
same arrays in other zip bytes. Each run gets a private `KERAS_HOME` holding the
bundled file and `tf_tutorial/offline` on `PYTHONPATH`, whose `sitecustomize`
makes Keras's MNIST hash check accept the bundled file's sha256 (see its docstring).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import SUBPROCESS_ENV
from tftrain.data.datasets import BUNDLED_MNIST, BUNDLED_MNIST_SHA256, sha256_of

pytestmark = pytest.mark.integration

PY = sys.executable
TUTORIAL = Path(__file__).resolve().parent / "tf_tutorial"
OFFLINE = TUTORIAL / "offline"
TUTORIAL_URL = "https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras"

TUTORIAL_FIT = "multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)"
SHORT_FIT = "multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=20)"
"""The tutorial's fit, and the shorter one the test runs."""

ORIGINAL_STRATEGY = "strategy = tf.distribute.MultiWorkerMirroredStrategy()"
TFTRAIN_LINES = ["import tftrain.runtime", "strategy = tftrain.runtime.KerasMultiWorkerMirroredStrategy()"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _split_header(text: str):
    """(license/source header comment, the tutorial's text below it)."""
    lines = text.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    return "".join(lines[:cut]), "".join(lines[cut:])


def _tutorial_run(tmp_path: Path, main_text: str):
    """A working folder holding `mnist_setup.py` and `main.py`, and the tasks' environment."""
    cwd = tmp_path / "tutorial"
    cwd.mkdir()
    shutil.copy(TUTORIAL / "mnist_setup.py", cwd / "mnist_setup.py")
    (cwd / "main.py").write_text(main_text)
    keras_home = tmp_path / "keras_home"
    (keras_home / "datasets").mkdir(parents=True)
    shutil.copy(BUNDLED_MNIST, keras_home / "datasets" / "mnist.npz")
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env.update(SUBPROCESS_ENV)
    env["KERAS_HOME"] = str(keras_home)
    env["PYTHONPATH"] = os.pathsep.join([str(OFFLINE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return cwd, env


def _launch(cwd: Path, env: dict, timeout_s: int):
    """`python -m tftrain.launch --workers 2 -- python main.py`; (exit code, stdout, stderr)."""
    cmd = [PY, "-m", "tftrain.launch", "--workers", "2", "--timeout", str(timeout_s), "--grace", "3",
           "--", PY, "main.py"]
    # Bytes: Keras's progress bar ends its updates with "\r", which text mode would turn into lines.
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=timeout_s + 60)
    return result.returncode, _decode(result.stdout), _decode(result.stderr)


def _decode(output: bytes) -> str:
    """Text with the progress bar's colours stripped."""
    return _ANSI.sub("", output.decode("utf-8", errors="replace"))


def _started_pids(stderr: str) -> list:
    return [int(pid) for pid in re.findall(r"started \S+ \(pid (\d+)\)", stderr)]


def _alive(pids) -> list:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _epoch_end_losses(stdout: str, worker: int) -> list:
    """The loss each epoch of `worker` ended with, read from its progress bar's last update."""
    losses = []
    for line in stdout.split("\n"):
        if line.startswith(f"[worker:{worker}] ") and "20/20" in line:  # SHORT_FIT
            losses.append(float(re.findall(r"loss: ([\d.]+)", line)[-1]))
    return losses


def test_vendored_tutorial_differs_only_in_the_strategy_line():
    setup_header, setup_body = _split_header((TUTORIAL / "mnist_setup.py").read_text())
    assert setup_body == (TUTORIAL / "mnist_setup.py.orig").read_text()

    main_header, main_body = _split_header((TUTORIAL / "main.py").read_text())
    original = (TUTORIAL / "main.py.orig").read_text()
    for header in (setup_header, main_header):
        assert TUTORIAL_URL in header and "Apache License, Version 2.0" in header
    assert "keras-team/keras#20585" in main_header
    removed, added = [], []
    matcher = difflib.SequenceMatcher(a=original.splitlines(), b=main_body.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            removed += matcher.a[i1:i2]
            added += matcher.b[j1:j2]
    assert removed == [ORIGINAL_STRATEGY]
    assert added == TFTRAIN_LINES


@pytest.mark.timeout(360)
def test_tutorial_trains_on_two_workers_with_the_tftrain_strategy(tmp_path):
    main = (TUTORIAL / "main.py").read_text()
    assert TUTORIAL_FIT in main
    cwd, env = _tutorial_run(tmp_path, main.replace(TUTORIAL_FIT, SHORT_FIT))
    returncode, stdout, stderr = _launch(cwd, env, timeout_s=240)

    assert returncode == 0, stderr[-3000:]
    assert "tftrain.launch: job finished" in stderr
    assert _alive(_started_pids(stderr)) == [], stderr[-3000:]
    for worker in (0, 1):
        for epoch in (1, 2, 3):
            assert f"[worker:{worker}] Epoch {epoch}/3" in stdout
    losses = [_epoch_end_losses(stdout, worker) for worker in (0, 1)]
    assert len(losses[0]) == 3, stdout[-3000:]
    # Synchronous training: both workers report the same all-reduced loss, and it falls.
    assert losses[0] == losses[1]
    assert losses[0][2] < losses[0][0]
    # The data came from the bundled file: nothing was downloaded, and the cached copy is intact.
    assert "Downloading data from" not in stdout + stderr
    assert sha256_of(Path(env["KERAS_HOME"]) / "datasets" / "mnist.npz") == BUNDLED_MNIST_SHA256


@pytest.mark.timeout(240)
def test_unmodified_tutorial_fails_under_keras_3_as_keras_20585(tmp_path):
    """Guards the reason for the swap: if this starts passing, Keras fixed #20585."""
    cwd, env = _tutorial_run(tmp_path, (TUTORIAL / "main.py.orig").read_text())
    returncode, stdout, stderr = _launch(cwd, env, timeout_s=150)

    assert returncode == 1, stderr[-3000:]
    assert "ValueError: Attempt to convert a value (PerReplica:" in stderr
    assert "with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor" in stderr
    assert "Epoch 1/3" not in stdout  # fit fails on the first batch, before its first epoch
    assert _alive(_started_pids(stderr)) == [], stderr[-3000:]
