"""Stop signals at every moment of a run (real processes, real signals): the batch plan, training (SIGHUP),
evaluation, the writes of the run (two signals), the export. Each ends in one line and 128 + the
signal, or completes; the same command then resumes or finishes without training again."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV, checkpoint_metadata

pytestmark = pytest.mark.integration

_SCRIPT = """
import dataclasses, os, signal, sys
import keras, numpy as np
import tftrain
from tftrain.train import after_steps
from tftrain.train.trainer import Trainer

moment = os.environ.get("MOMENT", "")

def kill(times=1, signum=signal.SIGTERM):
    for _ in range(times):
        os.kill(os.getpid(), signum)

def before(owner, name, times=1, signum=signal.SIGTERM):
    real = getattr(owner, name)
    def wrapped(*args, **kwargs):
        kill(times, signum)
        return real(*args, **kwargs)
    setattr(owner, name, wrapped)

if moment == "batch plan":
    before(Trainer, "plan_batch")
elif moment == "evaluation":
    before(Trainer, "evaluate")
elif moment == "saving, twice":
    before(Trainer, "save", times=2)
elif moment == "export":
    before(after_steps, "export")
elif moment == "report":
    before(Trainer, "report")
elif moment == "report, SIGINT":
    before(Trainer, "report", signum=signal.SIGINT)
elif moment == "second trial":  # in its first epoch's batches: inside keras-tuner, which fails a trial on errors
    from tftrain.tuning import keras_tuner
    trial_fit = keras_tuner.TrainingHyperModel.fit
    trials = []
    def fit(self, hp, model, *args, **kwargs):
        trials.append(1)
        if len(trials) == 2:
            class Kill(keras.callbacks.Callback):
                def on_train_batch_begin(self, batch, logs=None):
                    if batch == 1:
                        kill()
            kwargs["callbacks"] = [*kwargs.get("callbacks", []), Kill()]
        return trial_fit(self, hp, model, *args, **kwargs)
    keras_tuner.TrainingHyperModel.fit = fit
elif moment == "sanity step":  # the handler's Preempted comes out of the step wrapped in the pass's own error
    from tftrain.train import sanity
    sanity._traced_train_step = lambda model, train: kill()
    sanity._user_code = lambda model: True

class HangUp(keras.callbacks.Callback):  # a closed terminal in epoch 2; or Ctrl-C pressed twice
    def on_train_batch_end(self, batch, logs=None):
        if moment == "training, SIGHUP" and int(self.model.optimizer.iterations) == 12:
            kill(signum=signal.SIGHUP)
        if moment.startswith("training, SIGINT twice") and int(self.model.optimizer.iterations) == 12:
            import subprocess, time
            gap = moment.split()[-1]  # seconds between the two, from another process
            subprocess.Popen(["sh", "-c", f"kill -INT {os.getpid()}; sleep {gap}; kill -INT {os.getpid()}"])
            time.sleep(5)

def build():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [0.0]], "float32")
task = tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", learning_rate=0.05, name="s")
make_callbacks = Trainer.make_callbacks
Trainer.make_callbacks = lambda self: dataclasses.replace(made := make_callbacks(self), all=(*made.all, HangUp()))
from tftrain.run import main, run_module
run_module(lambda: main(["--epochs", "3", "--batch-size", "32", "--execution", "graph", "--verbose", "0", "--seed",
                         "0", "--backup-every-steps", "4", "--run-dir", sys.argv[1], *sys.argv[2:]], task=task,
                        prog="sig"))  # as python -m tftrain.run exits
"""


def _run(run_dir, moment, *args):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(SUBPROCESS_ENV, MOMENT=moment)
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(run_dir), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("moment, signum, line, trained_on_rerun", [
    ("batch plan", signal.SIGTERM, "sig: stopped by SIGTERM during the batch plan, before training. To resume, rerun "
                                   "the same command", 3),
    ("training, SIGHUP", signal.SIGHUP, "sig: stopped by SIGHUP: checkpoint saved at epoch 2, batch 5 "
                                        "(optimizer step 13). To resume, rerun the same command", 2),
    ("evaluation", signal.SIGTERM, "sig: stopped by SIGTERM during evaluation (training's checkpoint is kept). "
                                   "To resume, rerun the same command", 0),
])
def test_a_signal_ends_in_one_line_and_the_same_command_resumes(tmp_path, moment, signum, line, trained_on_rerun):
    run_dir = tmp_path / "run"
    stopped = _run(run_dir, moment)
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    assert _last_line(stopped).startswith(line), _last_line(stopped)
    if moment == "training, SIGHUP":
        assert checkpoint_metadata(run_dir)["optimizer_iterations"] == 13  # the step the signal came in: nothing lost
    done = _run(run_dir, "")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs_trained"] == trained_on_rerun and metrics["optimizer_steps"] == 24


def test_a_signal_during_a_tune_trial_stops_the_run_and_the_resume_runs_that_trial_again(tmp_path):
    run_dir = tmp_path / "run"
    stopped = _run(run_dir, "second trial", "--tune", "2", "--validation-split", "0.25")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert _last_line(stopped).startswith("sig: stopped by SIGTERM during the batch plan, before training"), \
        _last_line(stopped)
    done = _run(run_dir, "", "--tune", "2", "--validation-split", "0.25")
    assert done.returncode == 0, done.stderr[-3000:]
    tuning = json.loads((run_dir / "metrics.json").read_text())["tuning"]
    assert sorted(t["trial_id"] for t in tuning["ranking"]) == ["0", "1"]  # the stopped trial, run again


def test_a_signal_whose_stop_tensorflow_wraps_in_its_own_error_still_ends_in_the_stop_line(tmp_path):
    stopped = _run(tmp_path / "run", "sanity step")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert _last_line(stopped).startswith("sig: stopped by SIGTERM during the sanity pass (nothing written). To "
                                          "resume, rerun the same command"), _last_line(stopped)


@pytest.mark.parametrize("gap", ["0", "0.05", "0.3"])
def test_ctrl_c_twice_exits_130_in_one_line_and_the_same_command_resumes(tmp_path, gap):
    run_dir = tmp_path / "run"
    stopped = _run(run_dir, f"training, SIGINT twice {gap}")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert _last_line(stopped).startswith("sig: interrupted. To resume, rerun the same command"), \
        stopped.stderr[-3000:]
    done = _run(run_dir, "")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["optimizer_steps"] == 24


def test_a_signal_during_the_report_after_the_export_ends_the_run_complete_without_redoing_it(tmp_path):
    run_dir = tmp_path / "run"
    done = _run(run_dir, "report", "--export", "saved_model")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["after_steps"] == {"export": "done"} and "saved_model" in metrics["export"]


def test_signals_while_the_run_is_written_wait_for_it_and_the_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    done = _run(run_dir, "saving, twice", "--verbose", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIGTERM received while the run was written: the run is complete" in done.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 24 and not (run_dir / "backup").exists()
    import keras

    assert int(keras.saving.load_model(run_dir / "model.keras").optimizer.iterations) == 24  # whole


def test_a_signal_during_the_export_leaves_it_pending_and_the_same_command_does_it(tmp_path):
    run_dir = tmp_path / "run"
    stopped = _run(run_dir, "export", "--export", "saved_model")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert _last_line(stopped).startswith("sig: stopped by SIGTERM during the export (the trained run is written; "
                                          "the export is pending)"), _last_line(stopped)
    assert json.loads((run_dir / "metrics.json").read_text())["after_steps"] == {"export": "pending"}
    done = _run(run_dir, "", "--export", "saved_model")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["after_steps"] == {"export": "done"}


@pytest.mark.parametrize("name", ["history.csv", "config.yaml", "model.keras"])
def test_a_folder_where_the_run_writes_a_file_is_named_in_one_line(tmp_path, name):
    run_dir = tmp_path / "run"
    assert _run(run_dir, "training, SIGHUP").returncode == 128 + signal.SIGHUP
    (run_dir / name).unlink(missing_ok=True)
    (run_dir / name).mkdir()
    failed = _run(run_dir, "")
    assert failed.returncode in (1, 2), failed.stderr[-3000:]
    assert str(run_dir / name) in _last_line(failed) and "Traceback (most" not in failed.stderr, \
        failed.stderr[-3000:]
    (run_dir / name).rmdir()
    if name == "config.yaml":
        return
    done = _run(run_dir, "")  # the fix the line gives: the run resumes
    assert done.returncode == 0, done.stderr[-3000:]


def test_ctrl_c_during_the_report_of_a_written_run_says_it_is_complete_and_exits_0(tmp_path):
    run_dir = tmp_path / "run"
    done = _run(run_dir, "report, SIGINT")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _last_line(done) == f"sig: interrupted after the run was written ({run_dir / 'metrics.json'}): it is complete"
    assert json.loads((run_dir / "metrics.json").read_text())["optimizer_steps"] == 24
