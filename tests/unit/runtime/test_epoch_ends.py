"""One data iterator for the whole run: `EpochEnds`, the `ExecutionTrial`'s short last call of an epoch,
and `FitLoop`'s `one_iterator` (Keras otherwise builds and drops the tf.data pipeline every epoch)."""

import numpy as np
import pytest

from tftrain.runtime.epoch_ends import EpochEnds
from tftrain.runtime.execution_trial import ExecutionTrial
from tftrain.train.loops.fit import FitLoop, _validation_iterator, one_iterator


def _data(batches, batch=8):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batches * batch, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def _model(spe):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=spe)
    return model


def _steps(model) -> int:
    return int(model.optimizer.iterations.numpy())


def test_one_iterator_repeats_only_data_whose_epoch_is_whole_executions_or_ends_itself():
    import tensorflow as tf

    ds = _data(20)
    repeated, steps = one_iterator(ds, None, 4)
    assert int(repeated.cardinality()) == tf.data.INFINITE_CARDINALITY and steps == 20
    assert one_iterator(ds, None, 8) == (ds, None)  # 20 batches end inside the third execution of 8
    repeated, steps = one_iterator(ds, None, 8, epoch_ends_at=20)
    assert int(repeated.cardinality()) == tf.data.INFINITE_CARDINALITY and steps == 20
    endless = ds.repeat()
    assert one_iterator(endless, 20, 8) == (endless, 20)
    unknown = ds.filter(lambda x, y: True)
    assert one_iterator(unknown, None, 1) == (unknown, None)


def test_epoch_ends_runs_each_epoch_s_steps_on_endless_data_where_keras_would_run_past_them():
    # keras-team/keras#20861: on endless data Keras runs the epoch's third execution of 8 whole (24 steps).
    plain = _model(8)
    plain.fit(_data(20).repeat(), steps_per_epoch=20, epochs=3, verbose=0)
    assert _steps(plain) == 72
    model = _model(8)
    assert EpochEnds.applies(model, 20) and not EpochEnds.applies(model, 24)
    ends = EpochEnds(model, 20).install()
    model.fit(_data(20).repeat(), steps_per_epoch=20, epochs=3, verbose=0, callbacks=[ends.epoch_callback()])
    assert _steps(model) == 60 and model.steps_per_execution == 8


def test_the_epoch_marker_restarts_the_count_after_an_epoch_ended_early():
    import keras

    class StopAfter(keras.callbacks.Callback):  # as StepBackup ends a resumed epoch early
        def on_train_batch_end(self, batch, logs=None):
            if self.params and batch >= 7 and not getattr(self, "done", False):
                self.model.stop_training = self.done = True

        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = False

    model = _model(8)
    ends = EpochEnds(model, 20).install()
    model.fit(_data(20).repeat(), steps_per_epoch=20, epochs=3, verbose=0,
              callbacks=[ends.epoch_callback(), StopAfter()])
    assert _steps(model) == 8 + 20 + 20  # without the marker the second epoch would end after 12 steps


def test_fit_loop_keeps_one_iterator_and_trains_each_epoch_s_steps_once(monkeypatch):
    import keras

    model = _model(8)
    seen = {}
    fit = model.fit
    monkeypatch.setattr(model, "fit", lambda dataset, **kw: seen.update(kw, cardinality=int(dataset.cardinality()))
                        or fit(dataset, **kw))
    during = keras.callbacks.LambdaCallback(on_train_end=lambda logs: seen.update(function=model.train_function))
    FitLoop().fit(model, lambda: _data(20), epochs=3, steps_per_epoch=None, callbacks=[during], verbose=0)
    assert seen["cardinality"] < 0 and seen["steps_per_epoch"] == 20  # repeated: Keras keeps its iterator
    assert isinstance(seen["function"], EpochEnds) and _steps(model) == 60
    assert model.train_function is None  # this run's epoch length does not follow the model into a later fit


def test_a_train_function_built_already_is_kept_and_the_data_left_finite(monkeypatch):
    model = _model(8)
    model.make_train_function()  # e.g. a remembered XLA choice, compiled before fit: not compiled again
    built = model.train_function
    FitLoop().fit(model, lambda: _data(20), epochs=2, steps_per_epoch=None, callbacks=[], verbose=0)
    assert model.train_function is built and _steps(model) == 40


@pytest.mark.parametrize("told", [100, 99])  # 99: a task's count off by one (a kept partial batch): the data's wins
def test_the_trial_runs_each_epoch_s_last_steps_on_the_shared_count(told):
    model = _model(8)
    trial = ExecutionTrial(model, ("graph",), (32,), examples_per_step=8, steps_per_epoch=told)
    trial.install()
    assert trial.ends_epochs
    FitLoop().fit(model, lambda: _data(100), epochs=4, steps_per_epoch=None, callbacks=[], verbose=0)
    choice = trial.finish()
    assert _steps(model) == 400 and choice.trial["complete"] and trial.steps_per_epoch == 100
    assert trial.count.value == choice.steps_per_execution  # not left at an epoch's short last call
    for label, timing in choice.timings.items():  # only whole calls are timed: the short ones are not
        assert timing.timed_steps % timing.steps_per_execution == 0, (label, timing)


def test_a_trial_of_one_count_ends_an_epoch_inside_an_execution_itself_under_a_mirrored_strategy(recwarn):
    # At one fixed count (--steps-per-execution 8, not auto), 20 batches end inside the third execution: the trial
    # ends each epoch itself, so the data repeats; left finite, a MirroredStrategy's last short call made Keras
    # warn "Your input ran out of data" at each epoch's end (the MNIST recipe's first run under mirrored).
    import keras
    import tensorflow as tf

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = _model(8)
    trial = ExecutionTrial(model, ("graph",), examples_per_step=8, steps_per_epoch=20)
    trial.install()
    assert trial.ends_epochs and trial.larger == []
    seen = {}
    during = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.setdefault("steps", []).append(
        _steps(model)))
    FitLoop().fit(model, lambda: _data(20), epochs=3, steps_per_epoch=None, callbacks=[during], verbose=0)
    assert seen["steps"] == [20, 40, 60]
    assert not [w for w in recwarn if "ran out of data" in str(w.message)]


def test_validation_data_of_whole_executions_is_repeated_and_scored_over_one_pass(monkeypatch):
    model = _model(4)
    seen = {}
    fit = model.fit
    monkeypatch.setattr(model, "fit", lambda dataset, **kw: seen.update(kw) or fit(dataset, **kw))
    history = FitLoop().fit(model, lambda: _data(20), epochs=2, steps_per_epoch=None, callbacks=[], verbose=0,
                            validation_data=_data(12, batch=5))
    assert seen["validation_steps"] == 12 and int(seen["validation_data"].cardinality()) < 0
    expected = model.evaluate(_data(12, batch=5), verbose=0)  # the same weights, over one pass
    assert history.history["val_loss"][-1] == pytest.approx(expected, rel=1e-5)
    ten = _data(10, batch=5)
    assert _validation_iterator(ten, 4) == (ten, None)  # its last execution would read the next pass
    assert _validation_iterator(None, 4) == (None, None)


def test_installing_the_trial_at_a_new_count_drops_a_test_function_traced_at_the_old_one():
    model = _model(8)
    model.evaluate(_data(4), verbose=0)  # as XLA's test-step check traces it, at 8 steps per call
    assert model.test_function is not None
    ExecutionTrial(model, ("graph",), (32,), examples_per_step=8).install()
    assert model.test_function is None and model.steps_per_execution == 32
