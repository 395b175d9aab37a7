"""WeightsFile: Keras's `.weights.h5`, written by Keras once and then by overwriting its values' bytes."""

import numpy as np
import pytest

from tftrain.callbacks.weights_file import WeightsFile


def _trained(layer=None):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(8, activation="relu")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)((layer or keras.layers.Identity())(hidden)))
    model.compile("adam", "mse")
    model.fit(np.ones((16, 4), "float32"), np.ones((16, 1)), verbose=0)
    return model


def _contents(path):
    """Every group and dataset of an HDF5 file: name -> (raw bytes or None, attributes)."""
    import h5py

    found = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, item: found.__setitem__(
            name, (item[()].tobytes() if isinstance(item, h5py.Dataset) else None, dict(item.attrs))))
    return found


def _state(model):
    return [v.numpy() for v in [*model.weights, *model.optimizer.variables]]


def test_later_saves_write_what_keras_writes_and_load_back(tmp_path, monkeypatch):
    from keras.src.saving import saving_lib

    model = _trained()
    weights = WeightsFile(model)
    weights.save(str(tmp_path / "first.weights.h5"))
    assert weights.layout is not None  # every dataset holds a variable: later saves take the byte path
    model.fit(np.random.default_rng(0).random((16, 4), "float32"), np.zeros((16, 1)), verbose=0)  # new values
    walk = saving_lib._save_state
    monkeypatch.setattr(saving_lib, "_save_state", lambda *a, **k: pytest.fail("Keras's walk ran again"))
    weights.save(str(tmp_path / "second.weights.h5"), template=str(tmp_path / "first.weights.h5"))
    monkeypatch.setattr(saving_lib, "_save_state", walk)
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    ours, keras_own = _contents(tmp_path / "second.weights.h5"), _contents(tmp_path / "keras.weights.h5")
    assert ours == keras_own and any(name.startswith("optimizer") for name in ours)
    fresh = _trained()
    fresh.load_weights(str(tmp_path / "second.weights.h5"))
    assert all(np.array_equal(a, b) for a, b in zip(_state(fresh), _state(model)))


def test_a_file_it_wrote_is_rewritten_in_place_and_one_linked_elsewhere_is_not(tmp_path, monkeypatch):
    import os
    import shutil

    model = _trained()
    weights = WeightsFile(model)
    first, second = str(tmp_path / "first.weights.h5"), str(tmp_path / "second.weights.h5")
    weights.save(first)
    weights.save(second, template=first)  # a new name: copied, then its values written
    copy = shutil.copyfile
    monkeypatch.setattr(shutil, "copyfile", lambda *a: pytest.fail("a file of its own was copied"))
    model.fit(np.random.default_rng(0).random((16, 4), "float32"), np.zeros((16, 1)), verbose=0)  # new values
    weights.save(second, template=first)  # its own file, linked nowhere else: in place
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    assert _contents(second) == _contents(tmp_path / "keras.weights.h5")
    # The same file also reachable by another name (a snapshot, StepBackup's previous checkpoint) is left
    # whole: the save writes a new file at its name, by the copy path and by Keras's walk alike.
    monkeypatch.setattr(shutil, "copyfile", copy)
    for n, template in enumerate((first, None)):
        snapshot = str(tmp_path / f"snapshot{n}.weights.h5")
        os.link(second, snapshot)
        kept = _contents(snapshot)
        model.fit(np.random.default_rng(n + 1).random((16, 4), "float32"), np.ones((16, 1)), verbose=0)
        weights.save(second, template=template)
        assert _contents(snapshot) == kept and _contents(second) != kept and os.stat(second).st_nlink == 1
    fresh = _trained()
    fresh.load_weights(second)
    assert all(np.array_equal(a, b) for a, b in zip(_state(fresh), _state(model)))


def test_a_layer_that_saves_computed_values_keeps_every_save_keras_own(tmp_path):
    import keras

    class Counted(keras.layers.Layer):  # saves an array that is not a variable
        calls = 0

        def call(self, x):
            return x

        def save_own_variables(self, store):
            Counted.calls += 1
            store["calls"] = np.array(Counted.calls)

        def load_own_variables(self, store):
            pass

    model = _trained(Counted())
    weights = WeightsFile(model)
    weights.save(str(tmp_path / "a.weights.h5"))
    weights.save(str(tmp_path / "b.weights.h5"), template=str(tmp_path / "a.weights.h5"))
    assert weights.layout is None and Counted.calls == 2  # Keras's walk both times: the value is fresh
    assert _contents(tmp_path / "b.weights.h5")["layers/counted/vars/calls"][0] == np.array(2).tobytes()


def test_a_model_whose_variables_changed_in_number_is_saved_keras_way_again(tmp_path):
    model = _trained()
    weights = WeightsFile(model)
    weights.save(str(tmp_path / "a.weights.h5"))
    model.add_weight(shape=(3,), initializer="ones", name="late")  # a variable the first save did not see
    weights.save(str(tmp_path / "b.weights.h5"), template=str(tmp_path / "a.weights.h5"))
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    assert _contents(tmp_path / "b.weights.h5") == _contents(tmp_path / "keras.weights.h5")


def test_bfloat16_variables_take_the_byte_path_too(tmp_path, monkeypatch):
    import keras
    from keras.src.saving import saving_lib

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, dtype="bfloat16")])
    model.compile("sgd", "mse")
    weights = WeightsFile(model)
    weights.save(str(tmp_path / "a.weights.h5"))
    assert weights.layout is not None  # stored as 2-byte opaque data marked bfloat16: the same bytes
    model.layers[0].kernel.assign(model.layers[0].kernel * 2)
    monkeypatch.setattr(saving_lib, "_save_state", lambda *a, **k: pytest.fail("Keras's walk ran again"))
    weights.save(str(tmp_path / "b.weights.h5"), template=str(tmp_path / "a.weights.h5"))
    monkeypatch.undo()
    model.save_weights(str(tmp_path / "keras.weights.h5"))
    assert _contents(tmp_path / "b.weights.h5") == _contents(tmp_path / "keras.weights.h5")


def test_a_keras_whose_store_writes_elsewhere_is_not_trusted(tmp_path, monkeypatch):
    """Older Keras 3 stores wrote through an entry object, past the recording store: a record that
    misses a dataset of the file turns the byte path off."""
    from tftrain.callbacks import weights_file

    model = _trained()
    record = weights_file._recording_store_class()
    real = record.__setitem__
    monkeypatch.setattr(record, "__setitem__", lambda self, key, value: _write_unrecorded(self, key, value, real))
    weights = WeightsFile(model)
    weights.save(str(tmp_path / "a.weights.h5"))
    assert weights.layout is None


def _write_unrecorded(store, key, value, real):
    from keras.src.saving import saving_lib

    if key == "0":  # this dataset is written, but not recorded
        saving_lib.H5IOStore.__setitem__(store, key, value)
    else:
        real(store, key, value)
