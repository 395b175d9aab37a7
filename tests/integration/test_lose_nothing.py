"""Lose nothing: a kill between the end of training and the written run resumes without training
again, and a finished attempt removes the failed one's `failure.log` (real processes, real signals)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV, checkpoint_metadata, checkpoint_weights

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

if os.environ.get("KILL_AFTER_METRICS"):  # metrics.json written, the backup not yet removed
    write_record = tftrain.Trainer.write_record
    def killed_after(self, record):
        write_record(self, record)
        os.kill(os.getpid(), signal.SIGKILL)
    tftrain.Trainer.write_record = killed_after

if os.environ.get("KILL_BEFORE_REPORT"):  # metrics.json written, report.md not yet
    from tftrain import reports
    def killed_before(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    reports.write_report = killed_before

if os.environ.get("TERM_IN_EXPORT"):  # SIGTERM while the export is written
    import time
    from tftrain.train import export as export_module
    def termed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    export_module.export_all = termed

if os.environ.get("KILL_IN_SAVE"):  # inside model.keras's save: part of its temporary file written
    def killed_in(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"PK part of a zip")
        os.kill(os.getpid(), signal.SIGKILL)
    keras.Model.save = killed_in

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [0.0]], "float32")
task = tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", learning_rate=0.05, name="k")
try:
    tftrain.Trainer(task, epochs=3, batch_size=32, execution="graph", verbose=0, seed=0, run_dir=sys.argv[1],
                    callbacks=[KillAfterTraining()], export=os.environ.get("EXPORT") or None).fit()
except tftrain.AlreadyFinished as e:
    print(e)
except tftrain.Preempted as e:
    print(f"Preempted: {e}")
    sys.exit(128 + e.signum)
"""


def _run(run_dir, kill: bool, after_metrics: bool = False, **more):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(SUBPROCESS_ENV, KILL_AFTER_TRAINING="1" if kill else "", KILL_AFTER_METRICS="1" if after_metrics else "",
               **more)
    return subprocess.run([sys.executable, "-c", _SCRIPT, str(run_dir)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_kill_after_training_resumes_without_training_again(tmp_path):
    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (run_dir / "metrics.json").exists()
    meta = checkpoint_metadata(run_dir)
    assert meta["epoch"] == 3  # the finished training's checkpoint outlived fit
    (run_dir / "failure.log").write_text("a failed attempt's traceback\n")
    done = _run(run_dir, kill=False)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == 3 and metrics["epochs_trained"] == 0  # nothing trained twice
    assert "; nothing left to train (the checkpoint held every epoch); wall time" in done.stdout, done.stdout
    assert metrics["test"]["loss"] < 1.0 and (run_dir / "model.keras").is_file()
    assert not (run_dir / "backup").exists() and not (run_dir / "failure.log").exists()


def _hparams_sessions(log_dir) -> int:
    """HParams sessions (their start records) in the event files directly in `log_dir`."""
    import tensorflow as tf

    return sum(value.tag == "_hparams_/session_start_info"
               for path in log_dir.glob("events.out.tfevents.*")
               for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value)


def test_a_kill_right_after_metrics_json_is_completed_by_the_same_command(tmp_path):
    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=False, after_metrics=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (run_dir / "metrics.json").is_file() and (run_dir / "backup").is_dir()
    assert _hparams_sessions(run_dir / "logs") == 1  # written before metrics.json, which marks the run finished
    metrics = (run_dir / "metrics.json").read_text()
    done = _run(run_dir, kill=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished before (metrics.json is written); removed the checkpoint its end left behind" in done.stdout
    assert not (run_dir / "backup").exists() and (run_dir / "metrics.json").read_text() == metrics  # untouched
    again = _run(run_dir, kill=False)  # now an ordinary finished run: refused, untouched
    assert again.returncode == 1 and "holds a finished run" in again.stderr, again.stderr[-2000:]


@pytest.mark.parametrize("damage", ["metrics.json garbled", "model.keras deleted"])
def test_a_damaged_end_beside_its_checkpoint_is_written_again_from_it(tmp_path, damage):
    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=False, after_metrics=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    if damage == "model.keras deleted":
        (run_dir / "model.keras").unlink()
    else:
        (run_dir / "metrics.json").write_bytes(b"\x8f{garbage")
    done = _run(run_dir, kill=False)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == 3 and metrics["epochs_trained"] == 0 and metrics["optimizer_steps"] == 24
    assert (run_dir / "model.keras").is_file() and not (run_dir / "backup").exists()


def test_a_kill_between_metrics_json_and_report_md_with_an_export_pending_is_completed_by_the_same_command(tmp_path):
    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=False, KILL_BEFORE_REPORT="1", EXPORT="saved_model")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (run_dir / "metrics.json").is_file() and not (run_dir / "report.md").exists()
    done = _run(run_dir, kill=False, EXPORT="saved_model")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["after_steps"] == {"export": "done"}
    assert (run_dir / "report.md").is_file() and not (run_dir / "backup").exists()  # the end the kill cut short


def test_a_sigterm_during_a_pending_export_leaves_it_pending_for_the_same_command(tmp_path):
    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=False, KILL_BEFORE_REPORT="1", EXPORT="saved_model")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    termed = _run(run_dir, kill=False, EXPORT="saved_model", TERM_IN_EXPORT="1")  # the rerun doing only the export
    assert termed.returncode == 128 + signal.SIGTERM and "Preempted: stopped by SIGTERM" in termed.stdout, \
        (termed.stdout + termed.stderr)[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["after_steps"] == {"export": "pending"}
    done = _run(run_dir, kill=False, EXPORT="saved_model")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["after_steps"] == {"export": "done"}


def test_a_kill_inside_the_save_of_model_keras_leaves_no_part_file_once_resumed(tmp_path):
    import keras

    run_dir = tmp_path / "run"
    killed = _run(run_dir, kill=False, KILL_IN_SAVE="1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [p.name for p in run_dir.glob(".tmp-*")] and not (run_dir / "model.keras").exists()
    done = _run(run_dir, kill=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(run_dir.glob(".tmp-*")) and not list(run_dir.glob(".*.tmp-*"))
    assert keras.models.load_model(run_dir / "model.keras").count_params() == 5


_SLOW_RUN = """
import dataclasses, sys, time
import keras, numpy as np
import tftrain

class Slow(keras.callbacks.Callback):  # 20 ms a step: the signal lands mid-epoch
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)

def build():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

rng = np.random.default_rng(0)
x = rng.standard_normal((1024, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [0.0]], "float32")
task = tftrain.ArrayTask(build, x, y, x[:64], y[:64], loss="mse", optimizer="sgd", learning_rate=0.05, name="p")
make_callbacks = tftrain.Trainer.make_callbacks
tftrain.Trainer.make_callbacks = lambda self: dataclasses.replace(made := make_callbacks(self), all=(*made.all, Slow()))
from tftrain.run import main
sys.exit(main(["--epochs", sys.argv[2] if len(sys.argv) > 2 else "3", "--batch-size", "32", "--execution", "graph", "--verbose", "0", "--seed", "0",
               "--run-dir", sys.argv[1]], task=task, prog="preempted"))
"""


def test_a_preemption_signal_saves_the_current_step_and_the_rerun_resumes_there(tmp_path):
    import time

    signum = signal.SIGTERM  # SIGUSR1 takes the same path: tests/unit/callbacks/test_preemption.py

    from tests.conftest import optimizer_steps

    run_dir, env = tmp_path / "run", {**os.environ, **SUBPROCESS_ENV}
    env.pop("TF_CONFIG", None)
    cmd = [sys.executable, "-c", _SLOW_RUN, str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while checkpoint_metadata(run_dir) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the first epoch's checkpoint: training runs
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.25)  # into the second epoch's 32 steps of 20 ms
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err[-2000:]
    saved = checkpoint_metadata(run_dir)
    assert saved["epoch"] == 1 and 0 < saved["steps_in_epoch"] < 32, saved  # the step it stopped at, mid-epoch
    assert f"stopped by {signal.Signals(signum).name}: checkpoint saved at epoch 2, batch {saved['steps_in_epoch']}" \
        in err and "To resume, rerun the same command." in err
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert optimizer_steps(run_dir) == 3 * 32  # every step once: none lost, none repeated
    history = json.loads((run_dir / "metrics.json").read_text())["history"]
    assert len(history["loss"]) == 3 and all(loss > 0 for loss in history["loss"])  # the whole run, both processes
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert rows[0].split(",")[0] == "epoch" and [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]


def test_a_second_process_on_a_run_directory_in_use_is_refused_naming_the_first(tmp_path):
    import time

    run_dir, env = tmp_path / "run", {**os.environ, **SUBPROCESS_ENV}
    env.pop("TF_CONFIG", None)
    cmd = [sys.executable, "-c", _SLOW_RUN, str(run_dir), "60"]  # 60 epochs of 0.7 s: the second starts meanwhile
    first = subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "backup").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()[1][-2000:]
        second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        lines = second.stderr.strip().splitlines()
        assert f"error: Run directory {str(run_dir)!r} is in use by another tftrain process (pid {first.pid} on " \
            in lines[-1], lines[-3:]
        first.send_signal(signal.SIGTERM)  # the first, undisturbed by the refused one, checkpoints and ends
        _, err = first.communicate(timeout=120)
        assert first.returncode == 143 and "checkpoint saved" in err, err[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert not (run_dir / ".tftrain.holder").exists()  # the lock's holder file goes with the process


_WIDE_RUN = """
import os, sys
import keras, numpy as np
import tftrain
from tftrain.run import main

if os.environ.get("DISK_FILLS_IN_THE_WRITE"):  # the space check passes: another process fills the disk after it
    from tftrain.callbacks.backup import StepBackup
    StepBackup._check_space = lambda self: None

def build():  # 131,585 weights: 1.6 MB a checkpoint with Adam's two slots
    return keras.Sequential([keras.Input((512,)), keras.layers.Dense(256), keras.layers.Dense(1)])

x = np.random.default_rng(0).standard_normal((256, 512)).astype("float32")
task = tftrain.ArrayTask(build, x, x[:, :1], loss="mse", optimizer="adam", name="wide")
sys.exit(main(["--epochs", "3", "--batch-size", "32", "--execution", "graph", "--verbose", "0", "--seed", "0",
               "--run-dir", sys.argv[1]], task=task, prog="full"))
"""


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs: room for the first checkpoint, not for the next one beside it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount (root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_fails_in_one_line_and_keeps_the_previous_checkpoint(small_disk):
    import keras

    run_dir, env = small_disk / "run", {**os.environ, **SUBPROCESS_ENV}
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", _WIDE_RUN, str(run_dir)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]  # a failed run, not a crash inside HDF5
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("full: run failed: CheckpointSpaceError: No space for the checkpoint in ") and \
        "MB are free. The previous checkpoint is intact: free space on that disk. Traceback: " in line, line
    assert line.endswith("Its checkpoint is kept. To resume, rerun the same command."), line  # said once
    assert checkpoint_metadata(run_dir)["epoch"] == 1
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(256), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.load_weights(checkpoint_weights(run_dir))  # whole
    assert int(model.optimizer.iterations) == 8  # the first epoch's 8 steps


def test_a_disk_that_fills_during_a_checkpoint_s_write_fails_in_one_line_not_a_crash_in_hdf5(small_disk):
    # Keras's save_weights leaves its HDF5 file open when the write fails; h5py closing it at exit on the full
    # disk printed tracebacks and crashed the process (exit 139).
    run_dir, env = small_disk / "run", {**os.environ, **SUBPROCESS_ENV, "DISK_FILLS_IN_THE_WRITE": "1"}
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", _WIDE_RUN, str(run_dir)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "h5py" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("full: run failed: OSError: no space left on the disk holding "), line
    assert checkpoint_metadata(run_dir)["epoch"] >= 1 and not list((run_dir / "backup").glob(".tmp-*"))  # whole
