"""The keras-tuner adapter: strategy checks, output directory, clear_session per trial."""

import keras
import keras_tuner as kt
import numpy as np
import pytest
import tensorflow as tf

from tftrain.errors import ConfigError, TuningError
from tftrain.tuning import TrainingHyperModel, make_tuner
from tftrain.tuning.keras_tuner import check_strategy


def hypermodel(widths=(4, 8), batch_sizes=(16, 32)):
    rng = np.random.default_rng(0)
    x = rng.random((128, 6)).astype("float32")
    y = (x[:, 0] > 0.5).astype("int32")

    def model_fn(width):
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(width, activation="relu"),
                                 keras.layers.Dense(2, activation="softmax")])

    def make_dataset(batch_size):
        return tf.data.Dataset.from_tensor_slices((x[:96], y[:96])).batch(batch_size, drop_remainder=True)

    val = tf.data.Dataset.from_tensor_slices((x[96:], y[96:])).batch(32)
    return TrainingHyperModel(model_fn, make_dataset, val, widths=widths, batch_sizes=batch_sizes)


def uninitialised(cls):
    """An instance that passes isinstance() without starting a real multi-worker runtime."""
    return cls.__new__(cls)


@pytest.mark.parametrize(
    "cls", [tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.experimental.ParameterServerStrategy]
)
def test_multi_worker_strategies_are_refused(tmp_path, cls):
    expected = r"one worker; it cannot use (MultiWorkerMirrored|ParameterServer)Strategy.*--strategy mirrored"
    with pytest.raises(TuningError, match=expected) as err:
        make_tuner(hypermodel(), directory=tmp_path, strategy=uninitialised(cls))
    assert isinstance(err.value, ConfigError)
    assert not any(tmp_path.iterdir())


def test_tuner_is_refused_inside_a_strategy_scope(tmp_path):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        with pytest.raises(TuningError, match="outside strategy.scope"):
            make_tuner(hypermodel(), directory=tmp_path, strategy=strategy)


def test_default_strategy_is_passed_as_none_and_others_through():
    assert check_strategy(None) is None
    assert check_strategy(tf.distribute.get_strategy()) is None
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert check_strategy(one) is one


def test_unknown_algorithm_and_bad_trials(tmp_path):
    with pytest.raises(TuningError, match=r"Invalid tuner 'grid'"):
        make_tuner(hypermodel(), directory=tmp_path, algorithm="grid")
    with pytest.raises(TuningError, match="max_trials"):
        make_tuner(hypermodel(), directory=tmp_path, max_trials=0)


@pytest.mark.parametrize("algorithm, cls, kwargs", [
    # One random point, then the Gaussian process (scipy, scikit-learn) proposes the second trial.
    ("bayesian", kt.BayesianOptimization, {"num_initial_points": 1}),
    # max_epochs=3 gives Hyperband a first bracket of 1-epoch trials; uncapped it would run 6 trials here.
    ("hyperband", kt.Hyperband, {"max_epochs": 3}),
])
@pytest.mark.slow
def test_bayesian_and_hyperband_searches_run_and_stop_at_max_trials(tmp_path, algorithm, cls, kwargs):
    tuner = make_tuner(hypermodel(), directory=tmp_path / "tuning", algorithm=algorithm, max_trials=2, seed=0,
                       **kwargs)
    assert isinstance(tuner, cls)
    tuner.search(epochs=1, verbose=0)
    trials = list(tuner.oracle.trials.values())
    assert len(trials) == 2
    assert all(t.status == "COMPLETED" and t.score is not None for t in trials), [(t.status, t.score) for t in trials]
    if algorithm == "hyperband":
        assert all(t.hyperparameters.values["tuner/epochs"] == 1 for t in trials)
    best = tuner.get_best_hyperparameters(1)[0].values
    assert best["width"] in (4, 8) and best["batch_size"] in (16, 32)
    assert (tmp_path / "tuning" / "tuner" / "oracle.json").is_file()


@pytest.mark.slow
def test_search_runs_each_trial_from_clear_session_under_the_strategy(tmp_path, monkeypatch):
    calls = []
    real_clear = keras.backend.clear_session
    monkeypatch.setattr(keras.backend, "clear_session", lambda *a, **k: (calls.append(1), real_clear(*a, **k))[1])
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    run_dir = tmp_path / "run"
    tuner = make_tuner(hypermodel(), directory=run_dir / "tuning", max_trials=2, strategy=strategy, seed=0)
    assert isinstance(tuner, kt.RandomSearch) and tuner.distribution_strategy is strategy
    tuner.search(epochs=1, verbose=0)
    assert len(tuner.oracle.trials) == 2
    assert len(calls) >= 2  # one clear_session per trial at least
    best = tuner.get_best_hyperparameters(1)[0].values
    assert best["width"] in (4, 8) and best["batch_size"] in (16, 32)
    assert 1e-4 <= best["learning_rate"] <= 1e-2
    # Everything keras-tuner wrote is under the run directory.
    assert (run_dir / "tuning" / "tuner" / "oracle.json").is_file()
    assert list(tmp_path.iterdir()) == [run_dir]


def test_hypermodel_validates_its_space():
    with pytest.raises(TuningError, match="learning_rate"):
        hypermodel().__class__(lambda w: None, lambda b: None, learning_rate=(0.1, 0.01))
    with pytest.raises(TuningError, match="widths"):
        hypermodel(widths=(0, 4))


def test_the_tune_objective_is_checked_against_the_validation_logs_before_any_trial():
    from tftrain.config import RecipeConfig
    from tftrain.errors import ConfigError
    from tftrain.train.search import check_objective

    cfg = RecipeConfig().override({"tune": 2})
    with pytest.raises(ConfigError, match=r"scores its trials by val_loss, which .* \(they have val_my_loss\)"):
        check_objective(cfg, {"loss": None}, ("val_my_loss",))  # a model's own test_step names its loss
    check_objective(cfg.override({"monitor": "val_my_loss", "monitor_mode": "min"}), {"loss": None}, ("val_my_loss",))
    check_objective(cfg, {"loss": "mse", "metrics": ["accuracy"]}, ("val_accuracy", "val_loss"))


@pytest.mark.parametrize("mapping", [dict, __import__("types").MappingProxyType])
def test_metrics_per_output_reach_compile_as_given(mapping):
    inputs = keras.Input((6,))
    outputs = {"label": keras.layers.Dense(2, activation="softmax", name="label")(inputs),
               "value": keras.layers.Dense(1, name="value")(inputs)}
    metrics = {"label": ["accuracy"], "value": ["mae"]}
    hm = TrainingHyperModel(lambda width: keras.Model(inputs, outputs), lambda b: None, None, widths=(4,),
                            loss={"label": "sparse_categorical_crossentropy", "value": "mse"},
                            metrics=mapping(metrics))
    model = hm.build(kt.HyperParameters())
    x = np.zeros((4, 6), "float32")
    logs = model.evaluate(x, {"label": np.zeros(4, "int32"), "value": np.zeros((4, 1), "float32")}, verbose=0,
                          return_dict=True)
    assert {"label_accuracy", "value_mae"} <= set(logs) and metrics == {"label": ["accuracy"], "value": ["mae"]}


def test_an_objective_per_output_gets_its_direction_from_its_name(tmp_path):
    tuner = make_tuner(hypermodel(), directory=tmp_path, max_trials=1, objective="val_label_accuracy")
    assert tuner.oracle.objective.name == "val_label_accuracy" and tuner.oracle.objective.direction == "max"
