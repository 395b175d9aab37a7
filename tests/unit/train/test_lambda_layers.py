"""A `Lambda` layer (Keras's own class) that `keras.models.load_model` will not read back is said before training,
with what does read it (`tftrain.train.sanity.not_rebuilt`)."""

import keras
import numpy as np
import pytest

from tftrain.train.sanity import not_rebuilt


def _model(function, **lambda_args):
    inputs = keras.Input((4,))
    scores = keras.layers.Dense(3)(inputs)
    return keras.Model(inputs, [scores, keras.layers.Lambda(function, **lambda_args)(scores)])


def test_a_python_lambda_is_said_and_loads_as_the_line_says(tmp_path):
    model = _model(lambda p: p * 2)
    assert "holds a Python lambda, which keras.models.load_model reads only with safe_mode=False" in not_rebuilt(model)
    model.save(tmp_path / "model.keras")
    with pytest.raises(ValueError, match="Python lambda"):
        keras.models.load_model(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras", safe_mode=False)
    x = np.ones((2, 4), "float32")
    assert np.allclose(loaded.predict(x, verbose=0)[1], model.predict(x, verbose=0)[1])


def test_a_lambda_that_cannot_be_made_again_at_all_is_said_with_its_cause():
    why = not_rebuilt(_model(lambda p: keras.ops.argmax(p, -1)))  # an integer output: no shape inferred
    assert why.startswith("its Lambda layer 'lambda") and "could not automatically infer the shape" in why


def test_a_model_without_lambda_or_own_classes_is_rebuilt():
    inputs = keras.Input((4,))
    assert not_rebuilt(keras.Model(inputs, keras.layers.Dense(3)(inputs))) is None
