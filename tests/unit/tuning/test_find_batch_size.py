"""find_batch_size and BatchSizeFinder on a real (small) model: restore, fake OOM, budget, LR scaling."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.callbacks import BatchSizeFinder, StepBackup
from tftrain.errors import BatchSizeSearchError, ConfigError
from tftrain.tuning import find_batch_size
from tftrain.runtime.execution_probe import ModelState
from tftrain.tuning.trial_memory import default_memory_budget


def data(n=512):
    rng = np.random.default_rng(0)
    x = rng.random((n, 8)).astype("float32")
    return x, (x[:, 0] > 0.5).astype("int32")


def trained_model(lr=0.01):
    """A compiled model that has taken one step, so its optimizer state is not zero."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.1), keras.layers.Dense(2),
    ])
    model.compile(keras.optimizers.Adam(lr), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x, y = data(64)
    model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=1, verbose=0)
    return model


def state_values(model):
    return [np.array(v) for v in ModelState(model).values]


def assert_same_state(before, after):
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def oom_above(model, threshold):
    """Makes model.fit raise ResourceExhaustedError for batches above `threshold`, as an accelerator would."""
    real_fit = model.fit

    def fit(dataset, *args, **kwargs):
        batch = dataset.element_spec[0].shape[0]
        if batch > threshold:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor for batch {batch}")
        return real_fit(dataset, *args, **kwargs)

    model.fit = fit


@pytest.mark.slow
def test_search_restores_weights_optimizer_state_and_iterations():
    model = trained_model()
    before = state_values(model)
    weights_before = model.get_weights()
    iterations = int(model.optimizer.iterations.numpy())
    result = find_batch_size(model, data(), init_val=16, max_val=64, steps_per_trial=2, verbose=0)
    assert [t.batch_size for t in result.trials][:3] == [16, 32, 64]
    assert all(t.status == "ok" and t.examples_per_sec > 0 for t in result.trials)
    for a, b in zip(weights_before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert_same_state(before, state_values(model))
    assert int(model.optimizer.iterations.numpy()) == iterations == 1


@pytest.mark.parametrize("mode, expected", [("power", 128), ("binsearch", 200)])
@pytest.mark.slow
def test_fake_oom_above_a_threshold_picks_the_right_size(mode, expected):
    model = trained_model()
    before = state_values(model)
    oom_above(model, 200)
    result = find_batch_size(model, data(), mode=mode, objective="largest", init_val=32, max_val=512,
                             steps_per_trial=1, margin=0.0, multiple_of=8, memory_budget=None, verbose=0)
    assert result.batch_size == expected == result.largest_fitting
    statuses = {t.batch_size: t.status for t in result.trials}
    assert statuses[256] == "oom" and statuses[128] == "ok"
    assert_same_state(before, state_values(model))  # restored after the OOMs too


@pytest.mark.slow
def test_cpu_memory_budget_in_bytes():
    model = trained_model()
    with pytest.raises(BatchSizeSearchError, match=r"over_budget"):
        find_batch_size(model, data(), init_val=16, max_val=64, steps_per_trial=1, memory_budget=1, verbose=0)
    assert default_memory_budget() > 0
    result = find_batch_size(model, data(), init_val=16, max_val=32, steps_per_trial=1, verbose=0)
    assert result.device_kind == "cpu" and result.memory_budget_bytes > 0  # default: half the free memory
    assert all(t.peak_memory_bytes is not None for t in result.trials)


@pytest.mark.slow
def test_trial_time_limit_ends_growth():
    model = trained_model()
    # Every trial overruns a zero time limit: each stops after one execution, and nothing fits.
    with pytest.raises(BatchSizeSearchError, match=r"tried 16 \(timeout\), 8 \(timeout\)"):
        find_batch_size(model, data(), objective="largest", init_val=16, max_val=64, steps_per_trial=3,
                        trial_timeout_s=0.0, max_trials=2, verbose=0, memory_budget=None)


@pytest.mark.slow
def test_linear_learning_rate_scaling_is_opt_in_and_reported():
    model = trained_model(lr=0.01)
    result = find_batch_size(model, data(), init_val=16, max_val=64, steps_per_trial=1, objective="largest",
                             scale_learning_rate=True, base_batch_size=32, verbose=0)
    assert result.batch_size == 64
    assert result.learning_rate == pytest.approx(0.02) and result.base_learning_rate == pytest.approx(0.01)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.02)
    assert "learning rate scaled 0.01 -> 0.02" in result.describe()
    with pytest.raises(ConfigError, match="base_batch_size"):
        find_batch_size(model, data(), scale_learning_rate=True, verbose=0)


@pytest.mark.slow
def test_learning_rate_scaling_reads_the_inner_optimizer_under_mixed_float16():
    model = trained_model(lr=0.01)
    model.optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))
    assert "learning_rate" not in model.optimizer.get_config()  # the rate lives on the inner optimizer
    result = find_batch_size(model, data(), init_val=16, max_val=64, steps_per_trial=1, objective="largest",
                             scale_learning_rate=True, base_batch_size=32, verbose=0)
    assert result.base_learning_rate == pytest.approx(0.01) and result.learning_rate == pytest.approx(0.02)
    assert float(model.optimizer.inner_optimizer.learning_rate.numpy()) == pytest.approx(0.02)


def test_uncompiled_model_is_refused():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with pytest.raises(ConfigError, match="compiled model"):
        find_batch_size(model, data(), verbose=0)


@pytest.mark.slow
def test_batch_size_finder_callback_searches_then_leaves_the_model_and_the_other_callbacks_untouched(tmp_path):
    model = trained_model()
    before = state_values(model)
    x, y = data()
    finder = BatchSizeFinder((x, y), init_val=16, max_val=64, steps_per_trial=1, verbose=0)
    seen = []
    epochs_seen = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
    backup = StepBackup(tmp_path / "backup", delete_checkpoint=False)
    history = model.fit(x, y, batch_size=16, epochs=3, callbacks=[backup, finder, epochs_seen], verbose=0)
    assert finder.batch_size in (16, 32, 64) and finder.result.trials
    assert history.epoch == [] and seen == [] and not (tmp_path / "backup").exists()  # no epoch, no checkpoint
    assert_same_state(before, state_values(model))
    assert model.fit(x, y, batch_size=finder.batch_size, epochs=2, verbose=0).epoch == [0, 1]  # the real fit


def test_describe_names_the_fastest_trial_when_the_choice_is_another(capfd):
    from tftrain.tuning.batch_size import BatchSizeResult
    from tftrain.tuning.search import Trial

    trials = [Trial(32, "ok", examples_per_sec=1000.0), Trial(64, "ok", examples_per_sec=1030.0)]
    result = BatchSizeResult(batch_size=32, objective="throughput", mode="power", trials=tuple(trials),
                             best_throughput=32, best_examples_per_sec=1000.0, largest_fitting=None,
                             largest_tried_ok=64, limit="plateau")
    assert "smallest batch within the min_gain tolerance of the fastest trial (64: 1,030/s)" in result.describe()


@pytest.mark.slow
def test_arrays_search_prints_no_partial_cache_warning(capfd):
    x, y = data()
    find_batch_size(trained_model(), (x, y), init_val=16, max_val=64, steps_per_trial=1, verbose=0)
    assert "did not fully read the dataset being cached" not in capfd.readouterr().err


@pytest.mark.slow
def test_largest_objective_proposes_accumulation_when_the_target_does_not_fit():
    model = trained_model()
    oom_above(model, 200)
    result = find_batch_size(model, data(), mode="binsearch", objective="largest", init_val=32, target_batch_size=1024,
                             steps_per_trial=1, margin=0.0, multiple_of=8, memory_budget=None, verbose=0)
    assert result.largest_fitting == 200 and max(t.batch_size for t in result.trials) <= 1024
    assert (result.micro_batch_size, result.gradient_accumulation_steps) == (128, 8)  # 8 x 128 = 1024
    assert "--batch-size 128 --gradient-accumulation-steps 8" in result.describe()
    fits = find_batch_size(model, data(), objective="largest", init_val=32, target_batch_size=64, steps_per_trial=1,
                           multiple_of=8, memory_budget=None, verbose=0)
    assert (fits.batch_size, fits.gradient_accumulation_steps, fits.micro_batch_size) == (64, 1, None)
    with pytest.raises(ConfigError, match="target_batch_size needs objective='largest'"):
        find_batch_size(model, data(), target_batch_size=64, verbose=0)


def test_arrays_of_a_dict_input_model_cap_the_search_at_their_examples_not_their_inputs():
    keras.utils.set_random_seed(0)
    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(2)(keras.layers.Concatenate()([a, b])))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(256)
    result = find_batch_size(model, ({"a": x[:, :5], "b": x[:, 5:]}, y), init_val=16, steps_per_trial=1, verbose=0)
    assert result.largest_tried_ok >= 16  # capped at the 2 inputs it tried batch 2 only; 256 examples allow 16+


def test_an_unbuilt_subclassed_model_of_dict_inputs_is_built_on_a_batch_as_fit_would():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.body, self.head = keras.layers.Dense(4), keras.layers.Dense(1)

        def call(self, inputs):
            return self.head(self.body(tf.concat([inputs["a"], inputs["b"]], -1)))

    x = {"a": np.ones((64, 2), "float32"), "b": np.ones((64, 3), "float32")}
    model = Net()
    model.compile(optimizer="adam", loss="mse")
    result = find_batch_size(model, (x, np.ones((64, 1), "float32")), max_val=16, verbose=0)
    assert model.built and result.batch_size in (8, 16) and int(model.optimizer.iterations.numpy()) == 0


def test_a_model_that_does_not_build_on_the_features_is_refused_in_one_line():
    class Net(keras.Model):
        def call(self, inputs):
            raise ValueError("takes noise, not features\nsecond line")

    model = Net()
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ConfigError, match=r"^find_batch_size builds the model on a batch's features, which failed "
                                          r"\(ValueError: takes noise, not features\)\. Build it first"):
        find_batch_size(model, (np.ones((64, 2), "float32"), np.ones((64, 1), "float32")), max_val=16, verbose=0)


def test_arrays_cap_a_max_val_above_their_length():
    from tftrain.tuning.batch_size import _dataset_source

    x, y = np.zeros((40, 8), "float32"), np.zeros((40, 2), "float32")
    assert _dataset_source((x, y), 1, 256)[1] == 40 and _dataset_source((x, y), 1, 16)[1] == 16
    assert _dataset_source((x, y), 1, None)[1] == 40
