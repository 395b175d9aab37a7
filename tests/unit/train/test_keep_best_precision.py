"""Kept checkpoints hold the user's model, whatever policy trained it: a Sequential model trained under a mixed
policy (which the run wraps for float32 outputs) is read back as built and fine-tuned from its run directory."""

import numpy as np
import pytest

import tftrain


def _sequential():
    import keras

    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])


def _task():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 8)).astype("float32")
    return tftrain.ArrayTask(_sequential, x, (x[:, 0] > 0).astype("int64"), loss="sparse_categorical_crossentropy",
                             metrics=["accuracy"], name="seq")


def _run(run_dir, precision, **kw):
    return tftrain.Trainer(_task(), epochs=2, verbose=0, seed=0, execution="graph", batch_size=32,
                           validation_split=0.25, precision=precision, run_dir=str(run_dir), **kw).fit()


@pytest.mark.slow
def test_a_mixed_policy_run_s_kept_checkpoint_reads_back_into_the_model_as_built(tmp_path, capsys):
    import keras
    import tensorflow as tf

    record = _run(tmp_path / "a", "mixed_bfloat16", keep_best=1)
    kept = record.to_dict()["keep_best"]["kept"][0]["checkpoint"]
    keras.mixed_precision.set_global_policy("float32")
    model = _sequential()
    initial = [w.copy() for w in model.get_weights()]
    tf.train.Checkpoint(model=model).read(kept).expect_partial()  # as the user guide says
    assert all(not np.array_equal(a, b) for a, b in zip(model.get_weights(), initial))
    capsys.readouterr()
    for precision in ("float32", "mixed_bfloat16"):  # fine-tuned from its own run directory, in either policy
        tuned = _run(tmp_path / f"tuned_{precision}", precision, init_from=str(tmp_path / "a"))
        assert tuned.to_dict()["init_from"]["kind"] == "checkpoint"
    _run(tmp_path / "b", "float32", keep_best=1)  # and the other way
    assert _run(tmp_path / "tuned_b", "mixed_bfloat16", init_from=str(tmp_path / "b")).epochs_trained == 2
    assert "could not be found" not in capsys.readouterr().err


def test_weights_of_another_model_name_the_weight_that_does_not_fit(tmp_path):
    import keras

    from tftrain.errors import ConfigError
    from tftrain.train import init_weights

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.first, self.second = keras.layers.Dense(3), keras.layers.Dense(5)

        def call(self, x):
            return self.second(self.first(x))

    keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)]).save_weights(
        tmp_path / "other.weights.h5")
    model = Sub()
    model(np.zeros((1, 4), "float32"))
    with pytest.raises(ConfigError, match=r"Example error message for object <Dense .*>: \w"):  # Keras's cause
        init_weights.load(model, "keras", str(tmp_path / "other.weights.h5"))
