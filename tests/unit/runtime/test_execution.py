import pytest

from tftrain.runtime.execution import compile_options


@pytest.mark.parametrize(
    "mode, eager, jit",
    [("eager", True, False), ("graph", False, False), ("xla", False, True)],
)
def test_modes_map_to_compile_arguments(mode, eager, jit):
    assert compile_options(mode, 4) == {"run_eagerly": eager, "jit_compile": jit, "steps_per_execution": 4}


@pytest.mark.parametrize("mode, spe", [("jit", 1), ("graph", 0), ("graph", 1.5)])
def test_bad_values(mode, spe):
    with pytest.raises(ValueError):
        compile_options(mode, spe)


def test_options_are_accepted_by_keras_compile():
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", **compile_options("graph", 2))
    model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=2, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4
