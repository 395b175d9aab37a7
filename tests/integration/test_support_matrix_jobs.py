"""The support matrix's multi-process columns: every model shape (tests/matrix/shapes.py) as a real
MultiWorkerMirrored job (2 workers) and a real ParameterServer job (chief, worker, ps) on 127.0.0.1
through `python -m tftrain.launch`, each trained to its test figure or refused before training with one
line (exit 2); the results must be those in tests/matrix/results.json (`TFTRAIN_WRITE_MATRIX=1`
writes them there)."""

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV
from tests.matrix import table
from tests.matrix.shapes import SHAPE_ENV, SHAPES

pytestmark = pytest.mark.integration

PY = sys.executable
FLAGS = ["--epochs", "2", "--batch-size", "32", "--verbose", "0", "--seed", "0", "--precision", "float32",
         "--execution", "graph"]
JOBS = {
    "multi_worker_mirrored, 2 workers": (["--workers", "2"], ["--strategy", "multi_worker_mirrored",
                                                              "--communication", "ring"]),
    "parameter_server, 1 worker + 1 ps": (["--chief", "--workers", "1", "--ps", "1"],
                                          ["--strategy", "parameter_server"]),
}


def _job(row: str, launch_args, run_args, run_dir, extra=()) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env = {**env, **SUBPROCESS_ENV, "TF_CPP_MIN_LOG_LEVEL": "3", SHAPE_ENV: row}
    cmd = [PY, "-m", "tftrain.launch", *launch_args, "--timeout", "150", "--grace", "3", "--",
           PY, "-m", "tftrain.run", "tests/matrix/shapes.py:task", *run_args, *FLAGS, *extra, "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    output = done.stdout + done.stderr
    if done.returncode == 0 and (run_dir / "metrics.json").is_file():
        metrics = json.loads((run_dir / "metrics.json").read_text())
        losses = [v for k, v in metrics.items() if k.startswith("test_") and isinstance(v, float)]
        return "ok" if losses and all(math.isfinite(v) for v in losses) else f"failed: test figures {losses}"
    errors = [line.split("error: ", 1)[1] for line in output.splitlines() if "tftrain.run: error: " in line]
    if done.returncode == 2 and errors and not (run_dir / "metrics.json").exists():
        return f"refused: {errors[0]}"
    return f"failed: exit {done.returncode}: {' | '.join(output.strip().splitlines()[-4:])[:400]}"


@pytest.mark.timeout(3000)
@pytest.mark.parametrize("column", list(JOBS))
def test_every_shape_as_a_multi_process_job(column, tmp_path):
    launch_args, run_args = JOBS[column]
    found = {row: {column: _job(row, launch_args, run_args, tmp_path / f"row{i}")} for i, row in enumerate(SHAPES)}
    failed = [f"{row}: {cells[column]}" for row, cells in found.items() if table.kind(cells[column]) == "failed"]
    assert not failed, "\n".join(failed)
    assert not table.check_or_write(found)


@pytest.mark.timeout(300)
def test_a_parameter_server_job_reports_each_output_s_loss_and_metrics_as_keras_evaluates_the_saved_model(tmp_path):
    # The workers run the model's own train_step and the chief its test_step: losses, loss weights and metrics per
    # output are Keras's own, so the test figures are those of keras evaluate on the saved model.
    row = "dict outputs, per-output metrics, loss_weights"
    launch_args, run_args = JOBS["parameter_server, 1 worker + 1 ps"]
    # Batches of 40: the last of the 192 test examples is partial, and Keras weighs it as its evaluate does.
    assert _job(row, launch_args, run_args, tmp_path / "run", ["--batch-size", "40"]) == "ok"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    check = ("import json, sys, keras; from tests.matrix import shapes as s; "
             "m = keras.models.load_model(sys.argv[1]); "
             "print(json.dumps(m.evaluate(s.X, {'label': s.LABEL, 'value': s.VALUE}, batch_size=40, verbose=0, "
             "return_dict=True)))")
    env = {**os.environ, **SUBPROCESS_ENV, "TF_CPP_MIN_LOG_LEVEL": "3", SHAPE_ENV: row}
    done = subprocess.run([PY, "-c", check, str(tmp_path / "run" / "model.keras")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    evaluated = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(evaluated) == {"loss", "label_loss", "value_loss", "label_accuracy", "value_mae"}, evaluated
    for name, value in evaluated.items():
        assert metrics[f"test_{name}"] == pytest.approx(value, rel=1e-5), name


@pytest.mark.timeout(300)
def test_a_parameter_server_job_validates_stops_early_and_keeps_the_best_epoch_by_a_per_output_metric(tmp_path):
    row = "dict outputs, per-output metrics, loss_weights"
    launch_args, run_args = JOBS["parameter_server, 1 worker + 1 ps"]
    extra = ["--validation-split", "0.25", "--early-stopping", "1", "--keep-best", "1", "--monitor", "val_value_mae"]
    assert _job(row, launch_args, run_args, tmp_path / "run", extra) == "ok"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    val_mae = metrics["history"]["val_value_mae"]
    assert len(val_mae) == 2 and all(math.isfinite(v) for v in val_mae), metrics["history"]
    assert {"val_loss", "val_label_accuracy", "val_label_loss", "val_value_loss"} <= set(metrics["history"])
    (kept,) = metrics["keep_best"]["kept"]
    assert kept["value"] == min(val_mae) and kept["epoch"] == val_mae.index(min(val_mae)) + 1
    assert (tmp_path / "run" / "checkpoints" / "best" / f"epoch-{kept['epoch']}.index").is_file()
    assert metrics["early_stopping"]["monitor"] == "val_value_mae" and metrics["early_stopping"]["best"] == min(val_mae)


_OWN_STEP = '''
import keras, numpy as np, tensorflow as tf, tftrain

class OwnStep(keras.Model):  # reports its own figure, under its own name, from no compiled loss
    def __init__(self, **kw):
        super().__init__(**kw)
        self.hidden, self.out = keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)
        self.tracker = keras.metrics.Mean(name="my_loss")

    def call(self, x):
        return self.out(self.hidden(x))

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(x, training=True) - y))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        self.tracker.update_state(loss)
        return {"my_loss": self.tracker.result()}

    def test_step(self, data):
        x, y = data
        self.tracker.update_state(keras.ops.mean(keras.ops.square(self(x) - y)))
        return {"my_loss": self.tracker.result()}

x = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
task = tftrain.ArrayTask(OwnStep, x, x.sum(axis=1, keepdims=True), x[:64], x[:64].sum(axis=1, keepdims=True),
                         loss=None, name="own")
'''


@pytest.mark.timeout(300)
def test_a_parameter_server_job_logs_what_a_model_s_own_train_step_reports(tmp_path):
    (tmp_path / "own.py").write_text(_OWN_STEP)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env = {**env, **SUBPROCESS_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}
    launch_args, run_args = JOBS["parameter_server, 1 worker + 1 ps"]
    cmd = [PY, "-m", "tftrain.launch", *launch_args, "--timeout", "150", "--grace", "3", "--", PY, "-m",
           "tftrain.run", "own.py:task", *run_args, *FLAGS, "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    losses = metrics["history"]["my_loss"]
    assert len(losses) == 2 and all(math.isfinite(v) and v > 0 for v in losses) and "loss" not in metrics["history"]
    assert math.isfinite(metrics["test_my_loss"])
