"""`released_off_thread`: `fit`'s input iterator is kept past `fit` and freed on a background thread."""

import gc
import weakref

import numpy as np

from tftrain.runtime import input_release
from tftrain.runtime.input_release import released_off_thread


def _model_and_data():
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    x = np.random.default_rng(0).standard_normal((32, 4)).astype("float32")
    return model, tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).repeat()


def test_the_fit_iterator_outlives_fit_and_is_freed_on_a_release_thread():
    model, data = _model_and_data()
    with released_off_thread() as release:
        model.fit(data, steps_per_epoch=4, epochs=2, callbacks=[release], verbose=0)
        kinds = [type(t).__name__ for t in release.taken]
        epoch_iterator = weakref.ref(next(t for t in release.taken if type(t).__name__ == "TFEpochIterator"))
    assert "TFEpochIterator" in kinds and len(kinds) == 2, kinds  # the epoch iterator and the one it yielded
    thread = input_release._pending[-1]
    assert thread.name == "tftrain-input-release"
    thread.join(10)
    assert not thread.is_alive() and release.taken == []
    gc.collect()
    assert epoch_iterator() is None  # freed, not leaked


def test_a_fit_that_fails_takes_nothing_and_starts_no_thread():
    model, data = _model_and_data()
    before = list(input_release._pending)
    try:
        with released_off_thread() as release:
            model.fit(data.map(lambda x, y: (x[:, :3], y)), steps_per_epoch=2, epochs=1, callbacks=[release],
                      verbose=0)
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a model of 4 inputs trained on 3")
    assert release.taken == [] and all(t in before for t in input_release._pending)
