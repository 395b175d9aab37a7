"""`--tune` over every tuner and every kind of choice: the best values apply to the run's config as they are."""

import dataclasses

import numpy as np
import pytest

import tftrain

X = np.random.default_rng(0).standard_normal((256, 4)).astype("float32")
Y = (X[:, :1] * 2).astype("float32")


@dataclasses.dataclass(frozen=True)
class HP:
    wide: bool = tftrain.hparam(False, "a wider hidden layer")


class Toggled(tftrain.ArrayTask):
    def tune_space(self):
        return {"wide": (False, True)}


def _build(seen):
    import keras

    def build(hp):
        seen.append(hp.wide)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16 if hp.wide else 4), keras.layers.Dense(1)])

    return build


def test_a_boolean_choice_reaches_the_model_as_a_boolean():
    import keras_tuner as kt

    from tftrain.tuning.keras_tuner import _choice

    hp = kt.HyperParameters()
    assert _choice(hp, "wide", (False, True)) is False and _choice(hp, "only", (True,)) is True
    assert _choice(hp, "units", (4, 8)) == 4


@pytest.mark.slow
@pytest.mark.parametrize("tuner", ["random", "hyperband"])
def test_the_best_trial_trains_whatever_the_tuner_and_a_boolean_choice(tmp_path, tuner):
    seen = []
    task = Toggled(_build(seen), X, Y, loss="mse", hparams=HP(), name="toggled")
    record = tftrain.Trainer(task, tune=2, tuner=tuner, validation_split=0.25, epochs=2, verbose=0,
                             execution="graph", run_dir=str(tmp_path / "run")).fit()
    best = record.extras["tuning"]["best"]
    assert not [k for k in best if k.startswith("tuner/")] and isinstance(best["wide"], bool), best
    assert record.epochs_trained == 2 and set(seen) <= {False, True} and all(isinstance(s, bool) for s in seen)


@dataclasses.dataclass(frozen=True)
class Sized:
    hidden: int = tftrain.hparam(4, "hidden units", minimum=1)


class Spaced(tftrain.ArrayTask):
    space = {}

    def tune_space(self):
        return self.space


@pytest.mark.parametrize("space, said", [({"hiden": (4, 8)}, r"tune_space\(\) hiden=4 does not fit its config: "
                                                             "Unknown config field 'hiden'"),
                                         ({"hidden": (4, 0)}, r"tune_space\(\) hidden=0 does not fit its config"),
                                         ({"hidden": ()}, "gives 'hidden' no values")])
def test_a_tune_space_the_config_refuses_is_refused_before_the_run_directory(tmp_path, space, said):
    import keras

    def build(hp):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(hp.hidden), keras.layers.Dense(1)])

    task = Spaced(build, X, Y, loss="mse", hparams=Sized(), name="spaced")
    task.space = space
    with pytest.raises(tftrain.ConfigError, match=said):
        tftrain.Trainer(task, tune=2, validation_split=0.25, epochs=1, verbose=0, run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()


def test_a_build_that_fails_as_the_tuner_is_made_keeps_the_finished_trials(tmp_path):
    from tftrain.train.search import _reloaded

    folder = tmp_path / "tuning"
    folder.mkdir()
    (folder / "oracle.json").write_text("{}")

    def tuner_of():
        raise ValueError("Could not interpret activation function identifier: nope")

    class Console:
        def warn(self, line):
            raise AssertionError(f"warned: {line}")

    with pytest.raises(ValueError, match="nope"):
        _reloaded(tuner_of, folder, Console(), build_failed=lambda: True)
    assert (folder / "oracle.json").is_file()


@pytest.mark.slow
def test_the_final_fit_after_tune_drops_the_retracing_warning_the_trials_traces_would_raise(tmp_path):
    import keras
    import tensorflow as tf

    from tftrain.callbacks.keep_best import _Retracing

    class Filters(keras.callbacks.Callback):
        seen = []

        def on_train_begin(self, logs=None):
            self.seen.append(any(isinstance(f, _Retracing) for f in tf.get_logger().filters))

    seen = []
    task = Toggled(_build(seen), X, Y, loss="mse", hparams=HP(), name="toggled")
    probe = Filters()
    tftrain.Trainer(task, tune=2, validation_split=0.25, epochs=1, verbose=0, execution="graph",
                    callbacks=[probe], run_dir=str(tmp_path / "run")).fit()
    assert probe.seen[-1] is True and not any(isinstance(f, _Retracing) for f in tf.get_logger().filters)


@pytest.mark.slow
def test_a_given_batch_size_is_kept_by_tune(tmp_path, capsys):
    task = Toggled(_build([]), X, Y, loss="mse", hparams=HP(), name="toggled")
    record = tftrain.Trainer(task, tune=2, batch_size=64, validation_split=0.25, epochs=1, verbose=1,
                             execution="graph", run_dir=str(tmp_path / "run")).fit()
    assert record.extras["tuning"]["best"]["batch_size"] == 64 and record.global_batch_size == 64
    assert "trial(s) over learning rate, wide at the given batch size 64" in capsys.readouterr().out
