"""`python -m tftrain.export RUN_DIR` on a run whose model holds a custom layer its task file registers: refused
in one line that names `--task` with the training command's task, then exported with it (real processes)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV

pytestmark = pytest.mark.integration

_TASK = """
import keras, numpy as np, tftrain

@keras.saving.register_keras_serializable(package="mine")
class Doubled(keras.layers.Layer):
    def call(self, x):
        return 2.0 * x

def build():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(Doubled()(inputs)))

x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
task = tftrain.ArrayTask(build, x, x[:, :1], loss="mse", name="custom")
"""


def _run(*args, cwd, own_log_level=False):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(SUBPROCESS_ENV, PYTHONPATH=str(REPO))
    if own_log_level:  # as a user's shell: the command sets TensorFlow's C++ log level itself
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_registered_custom_layer_exports_with_the_task_the_refusal_names(tmp_path):
    (tmp_path / "custom.py").write_text(_TASK)
    trained = _run("tftrain.run", "custom.py:task", "--epochs", "1", "--execution", "graph", "--verbose", "0",
                   "--run-dir", "run", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    refused = _run("tftrain.export", "run", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "pass --task custom.py:task (the training command's task file registers them)" in refused.stderr
    done = _run("tftrain.export", "run", "--task", "custom.py:task", cwd=tmp_path, own_log_level=True)
    assert done.returncode == 0, done.stderr[-3000:]
    info = [line for line in done.stderr.splitlines() if re.match(r"I\d{4} ", line)
            and not re.search(r" (port|cudart_stub)\.cc:", line)]  # before TensorFlow reads the log level
    assert not info, done.stderr
    exported = json.loads((tmp_path / "run" / "metrics.json").read_text())["export"]["saved_model"]
    assert exported["max_abs_difference"] < 1e-4 and (tmp_path / "run" / "export" / "saved_model").is_dir()
