"""Checkpoints within an epoch, the NaN guard and early stopping, through the Trainer (any task).

Each run is a tiny regression in this process (default strategy): 512 examples, batches of
32, so 16 optimizer steps per epoch. A "kill" is a callback that raises KeyboardInterrupt
after a chosen optimizer step: nothing is saved after it, as with a killed process.
"""

import json
import math
import re
import warnings

import numpy as np
import pytest

import tftrain
from tftrain.config import RecipeConfig, TrainConfig
from tftrain.errors import ConfigError, TrainingDiverged

STEPS_PER_EPOCH = 16


def _data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]


def _task(build=None, **kw):
    import keras

    def model():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])

    x, y = _data()
    kw = {"loss": "mse", "optimizer": "sgd", "learning_rate": 0.05, "name": "tiny", **kw}
    return tftrain.ArrayTask(build or model, x, y, x[:64], y[:64], **kw)


def _run(tmp_path, task=None, callbacks=(), name="run", **overrides):
    overrides = {"epochs": 3, "verbose": 0, "seed": 0, "execution": "graph", "batch_size": 32,
                 "run_dir": str(tmp_path / name), **overrides}
    return tftrain.Trainer(task or _task(), callbacks=list(callbacks), **overrides).fit()


def _killer(after_step):
    """A callback that stops the process (KeyboardInterrupt) once `after_step` optimizer steps are done."""
    import keras

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) >= after_step:
                raise KeyboardInterrupt

    return Kill()


def _step_counter():
    """A callback counting the optimizer steps this process runs (one hook per execution)."""
    import keras

    class Count(keras.callbacks.Callback):
        steps = 0

        def on_train_begin(self, logs=None):
            self.start = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.start is None:
                self.start = int(self.model.optimizer.iterations)

        def on_train_end(self, logs=None):
            self.steps = int(self.model.optimizer.iterations) - self.start

    return Count()


def _metadata(run_dir):
    from tests.conftest import checkpoint_metadata

    return checkpoint_metadata(run_dir)


@pytest.mark.parametrize("spe, every, saves_every, killed_after", [(1, 5, 5, 25), (4, 10, 8, 28)],
                         ids=["one-step-executions", "four-step-executions"])
@pytest.mark.slow
def test_a_run_killed_mid_epoch_loses_at_most_n_steps_and_resumes_at_its_step(tmp_path, capsys, spe, every,
                                                                                saves_every, killed_after):
    kw = {"backup_every_steps": every, "steps_per_execution": spe}
    whole = _run(tmp_path, name="whole", **kw)
    assert whole.to_dict()["optimizer_steps"] == 3 * STEPS_PER_EPOCH

    with pytest.raises(tftrain.Interrupted):
        _run(tmp_path, callbacks=[_killer(killed_after)], **kw)
    saved = _metadata(tmp_path / "run")
    assert 0 < saved["steps_in_epoch"] < STEPS_PER_EPOCH  # a checkpoint from inside an epoch
    assert saved["optimizer_iterations"] == saved["epoch"] * STEPS_PER_EPOCH + saved["steps_in_epoch"]
    assert killed_after - saved["optimizer_iterations"] <= every  # the steps the kill lost

    counter = _step_counter()
    capsys.readouterr()
    resumed = _run(tmp_path, callbacks=[counter], verbose=2, **kw)
    said = capsys.readouterr().out  # what a user sees (the killed-then-rerun recipe, as a user meets it)
    backup = tmp_path / "run" / "backup"
    assert f"backup:    every {saves_every} optimizer steps and at each epoch end, in {backup}" in said
    assert (f"resuming: {saved['epoch']}/3 epochs done and {saved['steps_in_epoch']} optimizer steps of the next, "
            f"from the checkpoint in {backup}") in said
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["optimizer_steps"] == whole.to_dict()["optimizer_steps"]  # not one step twice, none missing
    assert counter.steps == 3 * STEPS_PER_EPOCH - saved["optimizer_iterations"]
    assert m["backup"] == {"every_steps": saves_every, "resumed_from": saved}
    assert m["resumed_from_epoch"] == saved["epoch"] and resumed.epochs_trained == 3 - saved["epoch"]
    assert not (tmp_path / "run" / "backup").exists()  # removed once the run finished


@pytest.mark.slow
def test_a_checkpoint_whose_metadata_lags_its_weights_gives_way_to_the_previous_one(tmp_path):
    with pytest.raises(tftrain.Interrupted):
        _run(tmp_path, callbacks=[_killer(25)], backup_every_steps=5)
    from tftrain.checkpoint_files import checkpoints

    newest, before = checkpoints(tmp_path / "run" / "backup")[:2]
    previous = json.loads(before.metadata.read_text())
    # Metadata that names another step than its weights hold: the newest gives way to the one before.
    newest.metadata.write_text(json.dumps({**previous, "optimizer_iterations": 999}))
    counter = _step_counter()
    _run(tmp_path, callbacks=[counter], backup_every_steps=5)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    fields = {k: v for k, v in previous.items() if k != "metadata_crc32"}  # the position it holds
    assert m["optimizer_steps"] == 3 * STEPS_PER_EPOCH and m["backup"]["resumed_from"] == fields
    assert counter.steps == 3 * STEPS_PER_EPOCH - previous["optimizer_iterations"]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["a changed byte", "fields missing", "every metadata file deleted"])
def test_metadata_changed_or_lost_is_said_never_trusted(tmp_path, damage):
    with pytest.raises(tftrain.Interrupted):
        _run(tmp_path, callbacks=[_killer(25)], backup_every_steps=5)
    from tftrain.checkpoint_files import checkpoints
    from tftrain.errors import RunDirError

    newest, before = checkpoints(tmp_path / "run" / "backup")[:2]
    text = newest.metadata.read_text()
    if damage == "a changed byte":  # the epoch, one bit off: its CRC-32 no longer matches
        newest.metadata.write_text(text.replace('"epoch": 1', '"epoch": 3'))
        assert newest.metadata.read_text() != text
    elif damage == "fields missing":
        newest.metadata.write_text('{"epoch": 7}')
    else:
        newest.metadata.unlink()
        before.metadata.unlink()
        with pytest.raises(RunDirError, match=r"no checkpoint in .*backup can be read \(ckpt-\d+\.json: its metadata "
                                              r"is missing\)"):
            _run(tmp_path, backup_every_steps=5)
        return
    _run(tmp_path, backup_every_steps=5)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["optimizer_steps"] == 3 * STEPS_PER_EPOCH and m["backup"]["resumed_from"]["optimizer_iterations"] == \
        before.position.optimizer_iterations


def test_backup_every_steps_must_hold_one_execution(tmp_path):
    with pytest.raises(ConfigError, match="--backup-every-steps 3 is less than one execution of 4 optimizer steps"):
        _run(tmp_path, backup_every_steps=3, steps_per_execution=4)
    assert not (tmp_path / "run").exists()
    cfg = RecipeConfig(train=TrainConfig(backup_every_steps=10))
    tftrain.train.ParameterServerLoop().check(cfg)  # its coordinator joins every N steps to save
    tftrain.train.FitLoop().check(cfg)


def _nan_after(steps):
    """A model whose output (and so loss) turns NaN from training step `steps + 1` on."""
    import keras

    class NanAfter(keras.layers.Layer):
        def build(self, input_shape):
            self.count = self.add_weight(shape=(), initializer="zeros", trainable=False, name="count")

        def call(self, x, training=None):
            if training:
                self.count.assign_add(1.0)
            return x * keras.ops.cast(keras.ops.where(self.count > steps, float("nan"), 1.0), x.dtype)

    def build():
        inputs = keras.Input((4,))
        return keras.Model(inputs, NanAfter()(keras.layers.Dense(1)(inputs)))

    return build


def _h5_arrays(path):
    import h5py

    arrays = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: arrays.append(obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_a_nan_loss_stops_the_run_naming_where_and_keeps_the_last_finite_checkpoint(tmp_path, precision):
    run_dir = tmp_path / "run"
    with warnings.catch_warnings(), pytest.raises(TrainingDiverged) as e:
        warnings.simplefilter("ignore")  # mixed_float16 on a CPU is slow, and says so
        _run(tmp_path, _task(_nan_after(7)), backup_every_steps=2, precision=precision)
    message = str(e.value)
    found = re.fullmatch(r"loss became nan at epoch 1, batch 8 \(optimizer step (\d+); dtype policy (\w+)(, loss scale "
                         r"([\d.]+))?\); the last good checkpoint \(epoch 1, batch 6\) is kept in (\S+)\. Lower "
                         r"--learning-rate \(or check the data\), then train into a new --run-dir\.", message)
    assert found, message
    step, policy, scale, kept = int(found[1]), found[2], found[4], found[5]
    assert policy == precision and kept == str(run_dir / "backup")
    if precision == "float32":
        assert step == 8 and scale is None  # the NaN step was applied and counted
    else:  # each step loss scaling skipped (the NaN one among them) halved the scale from 2**15
        assert step < 8 and float(scale) == 2.0 ** 15 / 2 ** (8 - step)
    assert _metadata(run_dir)["steps_in_epoch"] == 6
    from tests.conftest import checkpoint_weights

    weights = _h5_arrays(checkpoint_weights(run_dir))
    assert weights and all(np.isfinite(np.asarray(a, "float64")).all() for a in weights)
    assert not (run_dir / "metrics.json").exists()


def test_a_diverging_run_exits_1_with_one_line_and_keeps_its_checkpoint(tmp_path, capsys):
    from tftrain import run

    path = tmp_path / "absurd.py"
    path.write_text(
        "import numpy as np, tftrain\n"
        "x = np.random.default_rng(0).standard_normal((256, 4)).astype('float32')\n"
        "def build():\n"
        "    import keras\n"
        "    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16), keras.layers.Dense(1)])\n"
        "task = tftrain.ArrayTask(build, x, x[:, :1] * 3, loss='mse', optimizer='sgd', learning_rate=1e10)\n"
    )
    run_dir = tmp_path / "run"
    code = run.main([f"{path}:task", "--batch-size", "16", "--epochs", "2", "--verbose", "0", "--execution", "graph",
                     "--seed", "0", "--backup-every-steps", "1", "--precision", "float32", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    found = re.search(r"run failed: TrainingDiverged: loss became (nan|infinite) at epoch 1, batch (\d+) \(optimizer "
                      r"step \d+; dtype policy float32\); the last good checkpoint \(epoch 1, batch (\d+)\)", err[0])
    assert found and int(found[3]) == int(found[2]) - 1, err[0]  # saved after every step until the bad one
    assert str(run_dir / "failure.log") in err[0] and "loss became" in (run_dir / "failure.log").read_text()
    assert any((run_dir / "backup").glob("ckpt-*.weights.h5")) and not (run_dir / "metrics.json").exists()


def _weights_log():
    """A callback keeping the weights at each epoch end (it runs after EarlyStopping)."""
    import keras

    class Log(keras.callbacks.Callback):
        by_epoch = {}

        def on_epoch_end(self, epoch, logs=None):
            self.by_epoch[epoch] = self.model.get_weights()

    return Log()


def _diverging_validation_task():
    """Validation targets of the opposite sign: val_loss is best after the first epoch, then worsens."""
    x, y = _data(128, seed=1)
    return _task(validation_data=(x, -y))


def _saved_weights(run_dir):
    import keras

    return keras.models.load_model(run_dir / "model.keras").get_weights()


@pytest.mark.slow
def test_early_stopping_stops_after_patience_and_saves_the_best_weights(tmp_path):
    log = _weights_log()
    record = _run(tmp_path, _diverging_validation_task(), callbacks=[log], epochs=10, early_stopping=2)
    m = record.to_dict()
    assert m["early_stopping"] == {"monitor": "val_loss", "patience": 2, "stopped_epoch": 3, "best_epoch": 1,
                                   "best": pytest.approx(record.history["val_loss"][0])}
    assert record.epochs_trained == 3 and record.history["val_loss"][2] > record.history["val_loss"][0]
    for saved, best in zip(_saved_weights(tmp_path / "run"), log.by_epoch[0]):
        np.testing.assert_array_equal(saved, best)


@pytest.mark.slow
def test_early_stopping_keeps_its_best_epoch_and_patience_across_a_resume(tmp_path):
    log = _weights_log()
    with pytest.raises(tftrain.Interrupted):  # killed in epoch 3: epochs 1 (best) and 2 are done
        _run(tmp_path, _diverging_validation_task(), callbacks=[log, _killer(2 * STEPS_PER_EPOCH + 3)], epochs=10,
             early_stopping=3)
    best = log.by_epoch[0]
    record = _run(tmp_path, _diverging_validation_task(), epochs=10, early_stopping=3)
    m = record.to_dict()
    assert m["resumed_from_epoch"] == 2
    assert m["early_stopping"]["best_epoch"] == 1 and m["early_stopping"]["stopped_epoch"] == 4
    for saved, weights in zip(_saved_weights(tmp_path / "run"), best):
        np.testing.assert_array_equal(saved, weights)


def test_early_stopping_needs_validation_data(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--early-stopping watches val_loss: pass --validation-split F"):
        _run(tmp_path, early_stopping=2)
    assert not (tmp_path / "run").exists()
    from tftrain.recipes import mnist

    assert mnist.main(["--early-stopping", "2", "--train-examples", "1024", "--run-dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --early-stopping watches val_loss" in err[0], err
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_early_stopping_watches_the_monitor_keep_best_ranks_by(tmp_path):
    """`--monitor` is the one metric keep-best, early stopping and model.keras agree on; a training metric needs no
    validation data."""
    log = _weights_log()
    x, y = _data()
    task = _task(validation_data=(x[:64], -y[:64]), metrics=["mae"])  # val_* worsens; the training mae falls
    record = _run(tmp_path, task, callbacks=[log], epochs=4, early_stopping=1, monitor="mae", keep_best=1)
    stop = record.to_dict()["early_stopping"]
    assert stop["monitor"] == "mae" and stop["stopped_epoch"] is None  # val_loss would have stopped it at epoch 3
    assert stop["best"] == pytest.approx(min(record.history["mae"]))
    assert record.epochs_trained == 4
    best = int(np.argmin(record.history["mae"]))
    for saved, weights in zip(_saved_weights(tmp_path / "run"), log.by_epoch[best]):
        np.testing.assert_array_equal(saved, weights)


def test_early_stopping_on_an_unknown_monitor_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match="--monitor 'val_accuracy' is not among the epoch logs' keys"):
        _run(tmp_path, _diverging_validation_task(), early_stopping=2, monitor="val_accuracy")
    assert not (tmp_path / "run").exists()


def test_describe_divergence_names_an_execution_s_range():
    import keras

    from tftrain.callbacks.nan_guard import describe_divergence

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(40)
    assert describe_divergence(model, math.inf, (33, 40), 2) == (
        "loss became infinite at epoch 3, batches 33-40 (optimizer step 40; dtype policy float32)")


@pytest.mark.slow
def test_a_resumed_run_whose_epoch_log_is_gone_says_its_history_starts_there(tmp_path, capsys):
    with pytest.raises(tftrain.Interrupted):
        _run(tmp_path, callbacks=[_killer(2 * STEPS_PER_EPOCH + 3)])
    (tmp_path / "run" / "history.csv").write_text("")  # emptied by a bad disk, or deleted
    capsys.readouterr()
    record = _run(tmp_path, verbose=1)
    printed = capsys.readouterr()
    assert "history.csv is missing or empty: the epoch log, and metrics.json's history, hold only the epochs from " \
           "3 on" in printed.out + printed.err
    assert len(record.history["loss"]) == 1


@pytest.mark.slow
def test_a_scheduler_s_restart_of_a_command_without_run_dir_resumes_its_attempt_s_run(tmp_path, monkeypatch):
    # SLURM requeues the same command: without --run-dir it must find the run its job's attempt made, not start a new
    # one (the run before it, of another job, is left alone).
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_RESTART_COUNT", "TFTRAIN_RUN_ID", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4241")
    _run(tmp_path, run_dir=None, backup_every_steps=4, epochs=2)  # another job's finished run of these settings
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(tftrain.Interrupted) as stopped:
        _run(tmp_path, callbacks=[_killer(20)], run_dir=None, backup_every_steps=4, epochs=2)  # 16 steps an epoch
    first = stopped.value.run_dir
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    record = _run(tmp_path, run_dir=None, backup_every_steps=4, epochs=2)
    assert record.run_dir == first and record.extras["backup"]["resumed_from"]["optimizer_iterations"] == 20
    assert len(list((tmp_path / "runs").iterdir())) == 2
