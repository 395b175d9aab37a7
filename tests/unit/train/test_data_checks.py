"""What cannot work is refused before the run directory is written: the task's datasets (`tftrain.train.data_checks`),
before any model is built, and a model that does not build."""

import numpy as np
import pytest

import tftrain
from tftrain.errors import ConfigError

X = np.random.default_rng(0).standard_normal((96, 8)).astype("float32")
Y = X.sum(1, keepdims=True)


@pytest.mark.parametrize("endless", ["validation", "test"])
def test_validation_or_test_data_that_never_end_are_refused_before_the_run_directory(tmp_path, endless):
    import keras
    import tensorflow as tf

    def data(start, stop, repeat):
        dataset = tf.data.Dataset.from_tensor_slices((X[start:stop], Y[start:stop]))
        return lambda: dataset.repeat() if repeat else dataset

    task = tftrain.DatasetTask(lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]), data(0, 64, True),
                               validation=data(64, 80, endless == "validation"), test=data(80, 96, endless == "test"),
                               loss="mse", name="endless", default_batch_size=16, num_train_examples=64)
    with pytest.raises(ConfigError, match=rf"^The task's {endless} data never ends \(an endless \.repeat\(\)\)"):
        tftrain.Trainer(task, epochs=1, verbose=0, run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()


def test_a_model_that_does_not_build_fails_with_its_own_error_before_the_run_directory(tmp_path):
    import keras

    def build():
        a, b = keras.Input((8,)), keras.Input((3, 2))
        return keras.Model(a, keras.layers.Concatenate()([a, b]))  # shapes that do not concatenate

    task = tftrain.ArrayTask(build, X, Y, loss="mse", name="unbuilt")
    with pytest.raises(ValueError, match="Concatenate"):
        tftrain.Trainer(task, epochs=1, verbose=0, run_dir=str(tmp_path / "run")).fit()
    assert not (tmp_path / "run").exists()
