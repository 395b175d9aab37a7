"""EpochTensorBoard: Keras's TensorBoard without the per-batch summary calls that write nothing at
update_freq="epoch"."""

import numpy as np
import pytest


def _fit(callback, epochs=2):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=epochs, verbose=0, callbacks=[callback])


def _counting(callback):
    """Wraps the callback's summary module so that every `scalar` call is counted by its tag."""
    import types

    real, tags = callback.summary, []

    def scalar(name, *args, **kwargs):
        tags.append(name)
        return real.scalar(name, *args, **kwargs)

    callback._summary_module = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
    callback._summary_module.scalar = scalar
    return tags


def _event_tags(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = EventAccumulator(str(log_dir / "train"), size_guidance={"tensors": 0})
    run.Reload()
    return {tag: len(run.Tensors(tag)) for tag in run.Tags()["tensors"]}


def test_at_update_freq_epoch_it_makes_no_batch_calls_and_writes_what_keras_writes(tmp_path):
    import keras

    from tftrain.callbacks import EpochTensorBoard

    ours, theirs = EpochTensorBoard(str(tmp_path / "ours")), keras.callbacks.TensorBoard(str(tmp_path / "keras"))
    our_calls, their_calls = _counting(ours), _counting(theirs)
    _fit(ours)
    _fit(theirs)
    assert any(tag.startswith("batch_") for tag in their_calls)  # Keras's own: 2 logs x 8 batches x 2 epochs
    assert not any(tag.startswith("batch_") for tag in our_calls)
    assert _event_tags(tmp_path / "ours") == _event_tags(tmp_path / "keras")  # epoch scalars, same counts
    assert _event_tags(tmp_path / "ours")["epoch_loss"] == 2


@pytest.mark.parametrize("update_freq", [1, "batch"])
def test_at_any_other_update_freq_batch_scalars_are_written_as_keras_writes_them(tmp_path, update_freq):
    from tftrain.callbacks import EpochTensorBoard

    callback = EpochTensorBoard(str(tmp_path / "logs"), update_freq=update_freq)
    _fit(callback)
    assert _event_tags(tmp_path / "logs")["batch_loss"] == 16  # 8 batches x 2 epochs


def test_a_default_writer_the_user_set_still_gets_the_batch_scalars(tmp_path):
    import tensorflow as tf

    from tftrain.callbacks import EpochTensorBoard

    writer = tf.summary.create_file_writer(str(tmp_path / "mine" / "train"))
    with writer.as_default(step=0):
        _fit(EpochTensorBoard(str(tmp_path / "logs")))
    writer.flush()
    assert _event_tags(tmp_path / "mine")["batch_loss"] == 16  # as Keras's own TensorBoard writes them
