"""The model shapes of the support matrix: tiny models on tiny data, one `tftrain.Task` each.

`TFTRAIN_MATRIX_SHAPE=NAME python -m tftrain.run tests/matrix/shapes.py:task [flags]` trains one of
them (the multi-process columns); `SHAPES` maps each name to a function returning a fresh task.
"""

import os

import numpy as np

import tftrain

N, FEATURES, SEQ = 192, 8, 6
RNG = np.random.default_rng(0)
X = RNG.standard_normal((N, FEATURES)).astype("float32")
LABEL = (X[:, 0] + X[:, 1] > 0).astype("int32")
VALUE = (X[:, 2:3] * 2).astype("float32")
TOKENS = RNG.integers(1, 50, (N, SEQ)).astype("int32")
TOKEN_LABEL = (TOKENS[:, 0] > 25).astype("int32")
SEQUENCES = np.where(np.arange(SEQ)[None, :, None] < RNG.integers(2, SEQ + 1, (N, 1, 1)),
                     RNG.standard_normal((N, SEQ, 3)), 0.0).astype("float32")
SEQ_LABEL = (SEQUENCES[:, 0, 0] > 0).astype("int32")
CLASSIFY = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def _keras():
    import keras

    return keras


def sequential():
    keras = _keras()
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])


def unbuilt_sequential():
    keras = _keras()
    return keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2, activation="softmax")])


def _two_inputs(as_dict):
    keras = _keras()
    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model({"a": a, "b": b} if as_dict else [a, b], keras.layers.Dense(2, activation="softmax")(hidden))


def _two_outputs(as_dict):
    keras = _keras()
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    label = keras.layers.Dense(2, activation="softmax", name="label")(hidden)
    value = keras.layers.Dense(1, name="value")(hidden)
    return keras.Model(inputs, {"label": label, "value": value} if as_dict else [label, value])


def subclassed():
    keras = _keras()

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.head = keras.layers.Dense(2, activation="softmax", dtype="float32")

        def call(self, x):
            return self.head(self.hidden(x))

    return Classifier()


def custom_train_step():
    keras = _keras()
    import tensorflow as tf

    class OwnStep(keras.Model):
        def train_step(self, data):
            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
                scaled = self.optimizer.scale_loss(loss)
            self.optimizer.apply(tape.gradient(scaled, self.trainable_variables), self.trainable_variables)
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return OwnStep(inputs, keras.layers.Dense(2, activation="softmax", dtype="float32")(hidden))


def rnn_masking():
    keras = _keras()
    return keras.Sequential([keras.Input((SEQ, 3)), keras.layers.Masking(0.0), keras.layers.GRU(8),
                             keras.layers.Dense(2, activation="softmax")])


def embedding():
    keras = _keras()
    return keras.Sequential([keras.Input((SEQ,), dtype="int32"), keras.layers.Embedding(50, 8),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2, activation="softmax")])


def _arrays(build, x, y, **kw):
    return lambda: tftrain.ArrayTask(build, x, y, x, y, name="shape", **{**CLASSIFY, **kw})


def _sample_weights():
    import tensorflow as tf

    weights = np.where(LABEL == 1, 2.0, 1.0).astype("float32")
    return tftrain.DatasetTask(sequential, lambda: tf.data.Dataset.from_tensor_slices((X, LABEL, weights)),
                               test=lambda: tf.data.Dataset.from_tensor_slices((X, LABEL, weights)),
                               name="shape", num_train_examples=N, **CLASSIFY)


SHAPES = {
    "Sequential": _arrays(sequential, X, LABEL),
    "Sequential, unbuilt": _arrays(unbuilt_sequential, X, LABEL),
    "functional, list inputs": _arrays(lambda: _two_inputs(False), (X[:, :5], X[:, 5:]), LABEL),
    "functional, dict inputs": _arrays(lambda: _two_inputs(True), {"a": X[:, :5], "b": X[:, 5:]}, LABEL),
    "two outputs (list)": _arrays(lambda: _two_outputs(False), X, (LABEL, VALUE),
                                  loss=["sparse_categorical_crossentropy", "mse"], metrics=[["accuracy"], ["mae"]]),
    "dict outputs, per-output metrics, loss_weights": _arrays(
        lambda: _two_outputs(True), X, {"label": LABEL, "value": VALUE},
        loss={"label": "sparse_categorical_crossentropy", "value": "mse"},
        metrics={"label": ["accuracy"], "value": ["mae"]}, loss_weights={"label": 1.0, "value": 0.5}),
    "subclassed": _arrays(subclassed, X, LABEL),
    "custom train_step": _arrays(custom_train_step, X, LABEL),
    "RNN with masking": _arrays(rnn_masking, SEQUENCES, SEQ_LABEL),
    "embedding": _arrays(embedding, TOKENS, TOKEN_LABEL),
    "class weights": _arrays(sequential, X, LABEL, class_weight={0: 1.0, 1: 2.0}),
    "sample weights": _sample_weights,
}
"""Row name -> a function returning the task."""

MONITOR = {"two outputs (list)": "val_value_mae", "dict outputs, per-output metrics, loss_weights": "val_value_mae"}
"""The per-output metric `--keep-best` ranks by (others: `val_accuracy`)."""


SHAPE_ENV = "TFTRAIN_MATRIX_SHAPE"
"""The row `task` is (the multi-process columns run one process tree a row; the launcher passes it on)."""

task = SHAPES[os.environ.get(SHAPE_ENV, "Sequential")]()
