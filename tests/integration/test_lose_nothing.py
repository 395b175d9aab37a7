"""Lose nothing: a kill between the end of training and the written run resumes without training
again, and a finished attempt removes the failed one's `failure.log` (real processes, real signals)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV

pytestmark = pytest.mark.integration

_SCRIPT = """
import os, signal, sys
import keras, numpy as np
import tftrain

class KillAfterTraining(keras.callbacks.Callback):
    def on_train_end(self, logs=None):  # after fit, before the evaluation, the model and metrics.json
        if os.environ.get("KILL_AFTER_TRAINING"):
            os.kill(os.getpid(), signal.SIGKILL)

def build():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [0.0]], "float32")
task = tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", learning_rate=0.05, name="k")
tftrain.Trainer(task, epochs=3, batch_size=32, execution="graph", verbose=0, seed=0, run_dir=sys.argv[1],
                callbacks=[KillAfterTraining()]).fit()
"""


def _run(run_dir, kill: bool):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(SUBPROCESS_ENV, KILL_AFTER_TRAINING="1" if kill else "")
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(run_dir)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_kill_after_training_resumes_without_training_again(tmp_path):
    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (run_dir / "metrics.json").exists()
    meta = json.loads((run_dir / "backup" / "training_metadata.json").read_text())
    assert meta["epoch"] == 3  # the finished training's checkpoint outlived fit
    (run_dir / "failure.log").write_text("a failed attempt's traceback\n")
    done = _run(run_dir, kill=False)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == 3 and metrics["epochs_trained"] == 0  # nothing trained twice
    assert metrics["test"]["loss"] < 1.0 and (run_dir / "model.keras").is_file()
    assert not (run_dir / "backup").exists() and not (run_dir / "failure.log").exists()
