"""StepBackup and ResumableEarlyStopping in a plain `model.fit`, without the Trainer.

80 examples in batches of 8: 10 batches per epoch. A "kill" raises KeyboardInterrupt from a
callback placed after the backup, once the optimizer has taken a chosen number of steps.
"""

import json

import numpy as np
import pytest


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
        saved = json.loads((backup / "training_metadata.json").read_text())
        total, restored = _fit(backup, spe, endless)
        assert total == whole, (kill_after, saved)
        assert restored.optimizer_iterations == saved["optimizer_iterations"]


@pytest.mark.slow
def test_finite_epochs_not_a_multiple_of_steps_per_execution_take_at_most_spe_minus_1_extra_steps(tmp_path):
    # 10 batches per epoch in executions of 4: an epoch's last execution runs 2 steps; a resumed
    # epoch (from step 8) reads a whole new pass and its execution runs 4.
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 4, False, kill_after=5)
    assert json.loads((tmp_path / "training_metadata.json").read_text())["steps_in_epoch"] == 8
    total, _ = _fit(tmp_path, 4, False)
    assert total == 30 + 2


def test_every_steps_must_be_a_positive_integer(tmp_path):
    from tftrain.callbacks import StepBackup

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="every_steps must be an integer >= 1 or None"):
            StepBackup(tmp_path, every_steps=bad)


def test_early_stopping_state_round_trips_through_its_directory(tmp_path):
    import keras

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
    again.on_train_begin()
    assert (again.best, again.best_epoch, again.wait) == (0.5, 1, 1)
    for loaded, saved in zip(again.best_weights, best):
        np.testing.assert_array_equal(loaded, saved)


def test_the_previous_checkpoint_is_kept_whole_beside_the_latest(tmp_path, monkeypatch):
    import os
    import shutil

    import keras

    copied = []
    copy = shutil.copyfile
    monkeypatch.setattr(shutil, "copyfile", lambda src, dst: copied.append(dst) or copy(src, dst))
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 1, False, kill_after=13)  # saves at steps 4, 8, 10 (epoch end), 14 > 13: killed after 13
    # Keras writes the first, the second is a copy of it, the third rewrites the first's file in place.
    assert [os.path.basename(p) for p in copied] == ["latest.tmp.weights.h5"]
    latest = json.loads((tmp_path / "training_metadata.json").read_text())
    previous = json.loads((tmp_path / "training_metadata.json.bkp").read_text())
    assert (latest["optimizer_iterations"], previous["optimizer_iterations"]) == (10, 8)
    weights, kept = tmp_path / "latest.weights.h5", tmp_path / "latest.weights.h5.bkp"
    assert weights.stat().st_ino != kept.stat().st_ino  # the new save replaced the file the previous one links
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    copy = tmp_path / "previous.weights.h5"  # Keras reads weights by their file name's ending
    copy.write_bytes(kept.read_bytes())
    model.load_weights(copy)  # a whole checkpoint, not a half-written one
    assert int(model.optimizer.iterations) == 8
    model.load_weights(weights)
    assert int(model.optimizer.iterations) == 10


@pytest.mark.parametrize("damage", ["truncated weights", "truncated metadata"])
@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_resumes_at_its_own_position(tmp_path, damage):
    import keras
    import tensorflow as tf

    from tftrain.callbacks import StepBackup

    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 1, False, kill_after=13)  # newest: the end of epoch 1 (step 10); previous: step 8
    victim = tmp_path / ("latest.weights.h5" if damage == "truncated weights" else "training_metadata.json")
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    said = []
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    backup = StepBackup(tmp_path, every_steps=4, say=said.append)
    x = np.zeros((80, 4), "float32")
    model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=3, verbose=0, callbacks=[backup])
    assert len(said) == 1 and "skipped the newest checkpoint" in said[0] and victim.name in said[0], said
    assert said[0].endswith("resuming from the previous one at epoch 1, batch 8 (optimizer step 8)"), said
    assert backup.restored.optimizer_iterations == 8 and int(model.optimizer.iterations) == 30  # nothing lost twice
