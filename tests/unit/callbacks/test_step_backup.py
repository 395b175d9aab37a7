"""StepBackup and ResumableEarlyStopping in a plain `model.fit`, without the Trainer.

80 examples in batches of 8: 10 batches per epoch. A "kill" raises KeyboardInterrupt from a
callback placed after the backup, once the optimizer has taken a chosen number of steps.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tftrain.checkpoint_files import read_position


def _fit(backup_dir, spe, endless, kill_after=None, epochs=3, every=4):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import NanGuard, StepBackup

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=spe)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8)

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if kill_after is not None and int(self.model.optimizer.iterations) >= kill_after:
                raise KeyboardInterrupt

    callbacks = [NanGuard(), StepBackup(backup_dir, every_steps=every), Kill()]
    kwargs = {"steps_per_epoch": 10} if endless else {}
    model.fit(data.repeat() if endless else data, epochs=epochs, verbose=0, callbacks=callbacks, shuffle=False,
              **kwargs)
    return int(model.optimizer.iterations), callbacks[1].restored


@pytest.mark.parametrize("spe, endless", [(1, False), (2, False), (4, True)],
                         ids=["finite-spe1", "finite-spe2", "endless-spe4"])
@pytest.mark.slow
def test_resumed_runs_take_the_uninterrupted_number_of_steps(tmp_path, spe, endless):
    whole, _ = _fit(tmp_path / "whole", spe, endless)  # endless with 10 steps/epoch in 4s: Keras runs 12
    assert whole == 3 * (12 if endless else 10)
    for kill_after in (5, 13, 21):
        backup = tmp_path / f"killed-{kill_after}"
        with pytest.raises(KeyboardInterrupt):
            _fit(backup, spe, endless, kill_after)
        saved = read_position(backup)
        total, restored = _fit(backup, spe, endless)
        assert total == whole, (kill_after, saved)
        assert restored.optimizer_iterations == saved.optimizer_iterations


@pytest.mark.slow
def test_finite_epochs_not_a_multiple_of_steps_per_execution_take_at_most_spe_minus_1_extra_steps(tmp_path):
    # 10 batches per epoch in executions of 4: an epoch's last execution runs 2 steps; a resumed
    # epoch (from step 8) reads a whole new pass and its execution runs 4.
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 4, False, kill_after=5)
    assert read_position(tmp_path).steps_in_epoch == 8
    total, _ = _fit(tmp_path, 4, False)
    assert total == 30 + 2


def test_every_steps_must_be_a_positive_integer(tmp_path):
    from tftrain.callbacks import StepBackup

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="every_steps must be an integer >= 1 or None"):
            StepBackup(tmp_path, every_steps=bad)


def test_early_stopping_knows_the_direction_of_a_per_output_metric_keras_does_not():
    import keras

    from tftrain.callbacks import ResumableEarlyStopping

    inputs = keras.Input((2,))
    model = keras.Model(inputs, {"reg": keras.layers.Dense(1, name="reg")(inputs)})
    model.compile("sgd", {"reg": "mse"}, metrics={"reg": ["mae"]})
    for monitor, improving in (("val_reg_mae", [3.0, 2.0, 1.0]), ("val_reg_loss", [3.0, 2.0, 1.0])):
        stop = ResumableEarlyStopping(monitor=monitor, patience=1)
        stop.set_model(model)
        stop.on_train_begin()
        for epoch, value in enumerate(improving):  # Keras's own "auto" raises at the first epoch's end here
            stop.on_epoch_end(epoch, {monitor: value})
        assert (stop.best, stop.best_epoch, model.stop_training) == (1.0, 2, False)


def test_early_stopping_state_round_trips_through_its_directory(tmp_path):
    import keras

    from tftrain import _compat
    from tftrain.callbacks import ResumableEarlyStopping

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    first = ResumableEarlyStopping(tmp_path, monitor="val_loss", patience=3, restore_best_weights=True)
    first.set_model(model)
    first.on_train_begin()
    for epoch, val_loss in enumerate([1.0, 0.5, 0.7]):
        first.on_epoch_end(epoch, {"val_loss": val_loss})
        if epoch == 1:
            best = [w.copy() for w in model.get_weights()]
            model.set_weights([w + 1 for w in best])  # the weights move on after the best epoch
    again = ResumableEarlyStopping(tmp_path, monitor="val_loss", patience=3, restore_best_weights=True)
    again.set_model(model)
    _compat.set_initial_epoch(model, 3)  # as the backup's restore of epoch 3's checkpoint does
    again.on_train_begin()
    assert (again.best, again.best_epoch, again.wait) == (0.5, 1, 1)
    for loaded, saved in zip(again.best_weights, best):
        np.testing.assert_array_equal(loaded, saved)


def _fresh_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def test_the_previous_checkpoint_is_kept_whole_beside_the_latest(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 1, False, kill_after=13)  # saves at steps 4, 8, 10 (epoch end); killed after 13
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1.json", "ckpt-1.weights.h5", "ckpt-2.json", "ckpt-2.weights.h5"]
    assert (tmp_path / "ckpt-1.weights.h5").stat().st_ino != (tmp_path / "ckpt-2.weights.h5").stat().st_ino
    for number, step in ((1, 8), (2, 10)):
        model = _fresh_model()
        model.load_weights(tmp_path / f"ckpt-{number}.weights.h5")  # each whole, in Keras's format
        position = read_position(tmp_path / f"ckpt-{number}.json")
        assert int(model.optimizer.iterations) == step == position.optimizer_iterations


def _resume(tmp_path, **kwargs):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import StepBackup

    said = []
    keras.utils.set_random_seed(0)
    model = _fresh_model()
    backup = StepBackup(tmp_path, every_steps=4, say=said.append, **kwargs)
    x = np.zeros((80, 4), "float32")
    model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=3, verbose=0, callbacks=[backup])
    return backup, model, said


@pytest.mark.parametrize("damage", ["truncated weights", "truncated metadata", "weights of another step",
                                    "bytes changed mid-file"])
@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_resumes_at_its_own_position(tmp_path, damage):
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 1, False, kill_after=13)  # newest: the end of epoch 1 (step 10); previous: step 8
    victim = tmp_path / ("ckpt-2.json" if damage == "truncated metadata" else "ckpt-2.weights.h5")
    if damage == "weights of another step":
        victim.write_bytes((tmp_path / "ckpt-1.weights.h5").read_bytes())
    elif damage == "bytes changed mid-file":  # HDF5 checks none of its data: the CRC-32 in the metadata does
        data = bytearray(victim.read_bytes())
        data[len(data) // 3: len(data) // 3 + 64] = bytes(b ^ 0x5A for b in data[len(data) // 3: len(data) // 3 + 64])
        victim.write_bytes(bytes(data))
    else:
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    if damage != "weights of another step":  # the run's first line, read before TensorFlow starts, says the same
        assert read_position(tmp_path).optimizer_iterations == 8
    backup, model, said = _resume(tmp_path)
    assert len(said) == 1 and "skipped the newest checkpoint" in said[0] and victim.name in said[0], said
    assert "resuming instead from ckpt-1.json at epoch 1, batch 8 (optimizer step 8)" in said[0], said
    assert said[0].endswith("2 optimizer steps earlier than the newest") == (damage != "truncated metadata"), said
    assert backup.restored.optimizer_iterations == 8 and int(model.optimizer.iterations) == 30  # nothing lost twice


@pytest.mark.slow
def test_a_save_cut_short_leaves_the_committed_checkpoints_and_its_leftovers_are_removed(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 1, False, kill_after=13)
    (tmp_path / "ckpt-3.tmp.weights.h5").write_bytes(b"half a file")  # killed while writing (an older name)
    (tmp_path / ".tmp-99-ckpt-3.weights.h5").write_bytes(b"half a file")  # killed while writing
    (tmp_path / "ckpt-4.weights.h5").write_bytes(b"renamed, never committed")  # killed before its metadata
    backup, model, said = _resume(tmp_path, delete_checkpoint=False)
    assert said == [] and backup.restored.optimizer_iterations == 10 and int(model.optimizer.iterations) == 30
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 4 and all(n.endswith((".json", ".weights.h5")) and "tmp" not in n for n in names), names
    assert read_position(tmp_path).optimizer_iterations == 30


def test_no_readable_checkpoint_is_one_line_naming_the_directory(tmp_path):
    from tftrain.errors import RunDirError

    (tmp_path / "ckpt-0.json").write_text("{not json")
    with pytest.raises(RunDirError, match=r"no checkpoint in .* can be read \(ckpt-0.json: its metadata cannot be "
                                          r"read\): delete .* to train from the start"):
        _resume(tmp_path)


_KILLED_SAVE = textwrap.dedent("""
    import os, signal, sys
    import numpy as np, keras, tensorflow as tf
    from tftrain.callbacks import StepBackup
    from tftrain import checkpoint_files, files
    backup_dir, moment, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = []
    def kill_at(name, real, weights_only=False):
        def wrapped(*a, **k):
            if not weights_only or str(a[0]).endswith(".weights.h5"):
                calls.append(name)
            if name == moment and calls.count(name) == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        return wrapped
    files.fsync_file = kill_at("weights written", files.fsync_file, weights_only=True)
    checkpoint_files.write_text_atomic = kill_at("weights renamed", checkpoint_files.write_text_atomic)
    checkpoint_files.prune = kill_at("metadata written", checkpoint_files.prune)
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    backup = StepBackup(backup_dir, every_steps=4)
    model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=3, verbose=0, callbacks=[backup],
              shuffle=False)
    print("restored", None if backup.restored is None else backup.restored.optimizer_iterations,
          "steps", int(model.optimizer.iterations))
""")


@pytest.mark.integration
@pytest.mark.parametrize("moment", ["weights written", "weights renamed", "metadata written"])
def test_a_kill_inside_a_save_resumes_within_one_interval(tmp_path, moment):
    """SIGKILL at each step of the third save (steps 4, 8, then the end of epoch 1 at step 10): the rerun
    resumes at step 8 or 10 and ends at the uninterrupted run's 30 steps."""
    script = tmp_path / "killed_save.py"
    script.write_text(_KILLED_SAVE)
    backup = tmp_path / "backup"
    run = lambda *args: subprocess.run([sys.executable, str(script), str(backup), *args], capture_output=True,
                                       text=True, timeout=240)
    killed = run(moment, "3")
    assert killed.returncode == -9, killed.stderr[-2000:]
    rerun = run("none", "0")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    restored, steps = rerun.stdout.split()[1], rerun.stdout.split()[3]
    assert steps == "30" and restored == ("10" if moment == "metadata written" else "8"), rerun.stdout


def test_a_checkpoint_restores_into_a_model_whose_optimizer_is_not_built_yet(tmp_path):
    """As when `fit` calls `on_train_begin` before its first step built the optimizer (the MNIST recipe): Adam's
    moments are restored too."""
    import keras

    from tftrain.callbacks import StepBackup

    def adam_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        return model

    trained = adam_model()
    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    trained.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
                callbacks=[StepBackup(tmp_path, delete_checkpoint=False)])
    model = adam_model()
    assert not model.optimizer.built
    backup = StepBackup(tmp_path)
    backup.set_model(model)
    backup.on_train_begin()
    assert backup.restored.optimizer_iterations == 10 == int(model.optimizer.iterations)
    for restored, saved in zip(model.optimizer.variables, trained.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(restored), np.asarray(saved))


@pytest.mark.slow
def test_early_stopping_resumed_after_a_kill_between_the_checkpoint_and_its_own_state_keeps_that_epoch(tmp_path):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import ResumableEarlyStopping, StepBackup

    losses, at_best = [1.0, 0.5, 0.7, 0.8, 0.9], []  # epoch 1 is the best
    backup, history = tmp_path / "backup", tmp_path / "history.csv"

    class Scripted(keras.callbacks.Callback):  # first: the later callbacks read its val_loss
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = losses[epoch]
            if epoch == 1:
                at_best.append([w.copy() for w in self.model.get_weights()])

    class KillAfterTheCheckpoint(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt

    def fit(kill):
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        stop = ResumableEarlyStopping(backup, history, monitor="val_loss", patience=3, restore_best_weights=True)
        callbacks = [Scripted(), keras.callbacks.CSVLogger(str(history), append=True),
                     StepBackup(backup, delete_checkpoint=False), *([KillAfterTheCheckpoint()] if kill else []), stop]
        model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=5, verbose=0, shuffle=False,
                  callbacks=callbacks)
        return stop

    with pytest.raises(KeyboardInterrupt):
        fit(kill=True)
    assert read_position(backup).epoch == 2  # epoch 1's checkpoint is written; early stopping's state is not
    stop = fit(kill=False)
    assert (stop.best, stop.best_epoch) == (0.5, 1)
    for kept, best in zip(stop.best_weights, at_best[0]):
        np.testing.assert_array_equal(kept, best)


def _scripted_early_stopping_fit(tmp_path, losses, patience, epochs, kill_at=None, said=None, **early_stopping):
    """A plain fit whose val_loss is `losses`, with StepBackup (kept) and ResumableEarlyStopping; returns
    `(stop, history, weights after each epoch)`."""
    import keras
    import tensorflow as tf

    from tftrain.callbacks import ResumableEarlyStopping, StepBackup

    weights = {}

    class Scripted(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = losses[epoch]
            weights[epoch] = [w.copy() for w in self.model.get_weights()]

    class Kill(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == kill_at:
                raise KeyboardInterrupt

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    stop = ResumableEarlyStopping(tmp_path / "backup", tmp_path / "history.csv", say=said.append if said is not None else print,
                                  monitor="val_loss", patience=patience, restore_best_weights=True, **early_stopping)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=epochs, verbose=0,
                        callbacks=[Scripted(), keras.callbacks.CSVLogger(str(tmp_path / "history.csv"), append=True),
                                   StepBackup(tmp_path / "backup", delete_checkpoint=False), Kill(), stop])
    return stop, history, weights, model


@pytest.mark.slow
def test_a_run_resumed_after_early_stopping_stopped_it_trains_no_more_epochs(tmp_path):
    # Killed after the stop (e.g. in the test evaluation): the checkpoint's epoch is the stopped one.
    losses = [1.0, 0.5, 0.7, 0.4, 0.3]
    first, history, weights, _ = _scripted_early_stopping_fit(tmp_path, losses, patience=0, epochs=5)
    assert history.epoch == [0, 1, 2] and first.stopped_epoch == 2
    again, history, _, model = _scripted_early_stopping_fit(tmp_path, losses, patience=0, epochs=5)
    assert history.epoch == [] and again.stopped_epoch == 2 and (again.best, again.best_epoch) == (0.5, 1)
    for restored, best in zip(model.get_weights(), weights[1]):  # on_train_end restored the best epoch's
        np.testing.assert_array_equal(restored, best)


@pytest.mark.slow
def test_damaged_best_weights_of_early_stopping_are_said_and_the_run_resumes(tmp_path):
    losses = [1.0, 0.5, 0.7, 0.8, 0.9, 0.95]
    with pytest.raises(KeyboardInterrupt):
        _scripted_early_stopping_fit(tmp_path, losses, patience=3, epochs=6, kill_at=2)
    best_file = tmp_path / "backup" / "early_stopping_best.npz"
    best_file.write_bytes(best_file.read_bytes()[:40])  # cut by a machine crash
    said = []
    stop, history, _, _ = _scripted_early_stopping_fit(tmp_path, losses, patience=3, epochs=6, said=said)
    assert history.epoch == [3, 4] and stop.stopped_epoch == 4 and stop.best_epoch == 1
    assert len(said) == 1 and "weights of the best epoch (2)" in said[0], said
    (tmp_path / "backup" / "early_stopping.json").write_text("{")  # damaged too: history.csv has the values
    again, history, _, _ = _scripted_early_stopping_fit(tmp_path, losses, patience=3, epochs=6, said=said)
    assert history.epoch == [] and (again.best, again.best_epoch, again.stopped_epoch) == (0.5, 1, 4)


def test_the_nan_guard_watches_a_loss_an_own_train_step_names_otherwise_and_says_when_there_is_none():
    import keras

    from tftrain.callbacks import NanGuard
    from tftrain.errors import TrainingDiverged

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    said = []
    guard = NanGuard(say=said.append)
    guard.set_model(model)
    guard.on_train_batch_end(0, {"my_loss": 1.0, "mae": float("nan")})  # only loss figures are judged
    with pytest.raises(TrainingDiverged, match=r"^my_loss became nan at epoch 1, batch 2"):
        guard.on_train_batch_end(1, {"my_loss": float("nan")})
    guard.on_train_batch_end(2, {"mae": 1.0})
    guard.on_train_batch_end(3, {"mae": 2.0})
    assert said == ["the NaN guard watches no loss: the training logs have none (mae), so a diverging run is not "
                    "stopped"]


def test_no_space_for_the_first_checkpoint_does_not_speak_of_a_previous_one(tmp_path, monkeypatch):
    import collections
    import shutil

    from tftrain.callbacks import StepBackup
    from tftrain.errors import CheckpointSpaceError

    backup = StepBackup(tmp_path)
    backup.set_model(_fresh_model())
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6, 10))
    with pytest.raises(CheckpointSpaceError, match="No checkpoint was written before it: free space on that disk"):
        backup._check_space()


@pytest.mark.slow
@pytest.mark.parametrize("patience, baseline", [(0, None), (2, 0.3)])
def test_a_run_resumed_while_early_stopping_would_go_on_trains_on_as_keras_does(tmp_path, patience, baseline):
    # Epoch 2 (0-based 1) improves; with a baseline of 0.3 no epoch beats it: Keras stops only after patience.
    losses = [1.0, 0.5, 0.45, 0.44, 0.43, 0.42]
    kw = {"baseline": baseline} if baseline is not None else {}
    (tmp_path / "killed").mkdir()
    (tmp_path / "whole").mkdir()
    with pytest.raises(KeyboardInterrupt):
        _scripted_early_stopping_fit(tmp_path / "killed", losses, patience=patience, epochs=6, kill_at=1, **kw)
    resumed, history, _, _ = _scripted_early_stopping_fit(tmp_path / "killed", losses, patience=patience, epochs=6,
                                                          **kw)
    unbroken, whole, _, _ = _scripted_early_stopping_fit(tmp_path / "whole", losses, patience=patience, epochs=6,
                                                         **kw)
    assert history.epoch == [e for e in whole.epoch if e >= 2] and resumed.stopped_epoch == unbroken.stopped_epoch
    assert (resumed.best, resumed.best_epoch) == (unbroken.best, unbroken.best_epoch)


def test_a_model_unbuilt_as_fit_starts_is_warned_of_and_its_resume_refused_in_one_line(tmp_path):
    import keras

    from tftrain.callbacks import StepBackup
    from tftrain.errors import ConfigError

    class Net(keras.Model):  # subclassed, made outside a strategy: fit builds it on its first step
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    def net():
        model = Net()
        model.compile("sgd", "mse")
        return model

    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    said = []
    net().fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
              callbacks=[StepBackup(tmp_path, delete_checkpoint=False, say=said.append)])
    assert said == ["warning: the model is not built as fit starts (a subclassed model builds on its first batch): "
                    "call it on one batch before fit (model(x[:1])), or a resume cannot load its checkpoints"]
    with pytest.raises(ConfigError, match=r"^the model is not built as fit starts, so the checkpoint in .* cannot be "
                                          r"loaded into it"):
        net().fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[StepBackup(tmp_path)])
    shaped = net()
    shaped.build((None, 4))  # Keras 3 marks a subclassed model built, its layers not
    with pytest.raises(ConfigError, match=r"^the model is not built as fit starts"):
        shaped.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[StepBackup(tmp_path)])
    built = net()
    built(x[:1])
    built.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, callbacks=[StepBackup(tmp_path)])
    assert int(built.optimizer.iterations) == 20  # epoch 1 restored, epoch 2 trained


def test_a_model_without_call_whose_own_train_step_builds_nothing_is_backed_up_and_resumed(tmp_path):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import StepBackup

    class VAE(keras.Model):  # keras.io's shape: encoder and decoder built in __init__, no call()
        def __init__(self):
            super().__init__()
            self.encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            self.decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])

        def train_step(self, data):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(data - self.decoder(self.encoder(data))))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
            return {"loss": loss}

    class StopInEpoch2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 13:
                raise KeyboardInterrupt

    def fit(*callbacks):
        model = VAE()
        model.compile("adam")
        model.fit(x, batch_size=8, epochs=2, verbose=0, callbacks=[StepBackup(tmp_path, every_steps=1,
                                                                               say=said.append), *callbacks])
        return model

    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    said = []
    with pytest.raises(KeyboardInterrupt):
        fit(StopInEpoch2())
    assert int(fit().optimizer.iterations) == 20 and not [s for s in said if "warning" in s], said


def test_a_stop_another_callback_asks_for_in_the_resumed_epoch_stops_whatever_the_order_and_a_later_fit_starts_at_0(
        tmp_path):
    import keras

    from tftrain.callbacks import StepBackup

    class KillAt13(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 13:
                raise KeyboardInterrupt

    class StopAtEpochEnd(keras.callbacks.Callback):  # as EarlyStopping deciding to stop
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    model = _fresh_model()
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, x[:, :1], batch_size=8, epochs=3, verbose=0, callbacks=[StepBackup(tmp_path, every_steps=2),
                                                                              KillAt13()])
    model = _fresh_model()
    history = model.fit(x, x[:, :1], batch_size=8, epochs=3, verbose=0,
                        callbacks=[StopAtEpochEnd(), StepBackup(tmp_path, every_steps=2)])
    assert history.epoch == [1] and int(model.optimizer.iterations) == 20  # resumed inside epoch 2, stopped there
    assert model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0).epoch == [0, 1]  # no restoring callback now


def test_a_resume_inside_an_epoch_of_data_of_unknown_length_says_the_epoch_reads_its_data_again(tmp_path):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import StepBackup

    class KillAt13(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 13:
                raise KeyboardInterrupt

    x = np.random.default_rng(0).standard_normal((80, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).filter(lambda *_: True).batch(8)  # length unknown
    said = []
    with pytest.raises(KeyboardInterrupt):
        _fresh_model().fit(data, epochs=2, verbose=0, callbacks=[StepBackup(tmp_path, every_steps=2), KillAt13()])
    _fresh_model().fit(data, epochs=2, verbose=0, callbacks=[StepBackup(tmp_path, every_steps=2, say=said.append)])
    assert said == ["resuming inside epoch 2 after its 2 step(s) on data of unknown length: that epoch reads its whole "
                    "data again on top of them; pass steps_per_epoch to fit and StepBackup to resume it exactly"]
