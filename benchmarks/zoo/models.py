"""The zoo's models and their data: eight Keras models of different shapes.

Each `ZooModel` names an uncompiled model builder, a data function returning NumPy
arrays, the loss and metric every contender compiles with, one global batch size a
user would pick, and the realistic dataset size a 10-epoch run is projected on.
MNIST is the bundled real data; the other inputs and labels are random (speed only).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from benchmarks import common

SEQUENCE_LENGTH, TEXT_VOCAB = 64, 5000
"""Token sequences of the Transformer and the LSTM: length and vocabulary size."""

WIDE_VOCAB, WIDE_IDS = 100_000, 16
"""The wide model: vocabulary of its ids and ids per example."""


# --- Models (each a builder `() -> uncompiled keras.Model`) ---------------------------
# No builder takes an argument (ArrayTask would pass a required one the task's hyperparameters).

def mlp():
    """The MNIST recipe's MLP: `(batch, 28, 28)` raw pixels -> `(batch, 10)` probabilities."""
    return common.build_model("mlp")


def cnn():
    """The MNIST recipe's CNN: `(batch, 28, 28)` raw pixels -> `(batch, 10)` probabilities."""
    return common.build_model("cnn")


def _residual_block(x, filters: int, stride: int):
    """Two 3x3 convolutions with BatchNorm, added to the input (a 1x1 projection where the shape changes)."""
    from keras import layers

    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same", use_bias=False)(y))
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.BatchNormalization()(layers.Conv2D(filters, 1, strides=stride, use_bias=False)(x))
    return layers.ReLU()(layers.Add()([y, shortcut]))


def resnet():
    """A small ResNet: stride-2 stem, residual blocks of 16 and 32 filters with BatchNorm, global pooling.

    Returns:
        An uncompiled `keras.Model`: `(batch, 32, 32, 3)` float32 images ->
        `(batch, 10)` class probabilities.
    """
    import keras
    from keras import layers

    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for filters, stride in ((16, 1), (32, 2)):
        x = _residual_block(x, filters, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10, activation="softmax")(x), name="resnet")


@functools.lru_cache(maxsize=None)
def _position_embedding():
    """The `PositionEmbedding` layer class, defined on first use (the parent process imports no Keras)."""
    import keras

    @keras.saving.register_keras_serializable(package="benchmarks.zoo")
    class PositionEmbedding(keras.layers.Layer):
        """Adds a learned vector per position to `(batch, length, dim)` embeddings."""

        def build(self, input_shape):
            self.positions = self.add_weight(shape=tuple(input_shape[1:]), initializer="random_normal",
                                             name="positions")

        def call(self, x):
            return x + self.positions

    return PositionEmbedding


def _encoder_block(x, heads: int, hidden: int):
    """Self-attention and a feed-forward layer, each added to its input and layer-normalised."""
    from keras import layers

    dim = x.shape[-1]
    attention = layers.MultiHeadAttention(heads, key_dim=dim // heads)(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, attention]))
    y = layers.Dense(dim)(layers.Dense(hidden, activation="relu")(x))
    return layers.LayerNormalization()(layers.Add()([x, y]))


def transformer():
    """A Transformer encoder text classifier: token and position embeddings (width 32), two encoder
    blocks (2 attention heads, 64 feed-forward units), average pooling.

    Returns:
        An uncompiled `keras.Model`: `(batch, SEQUENCE_LENGTH)` int32 token ids
        in `[0, TEXT_VOCAB)` -> `(batch, 1)` probability.
    """
    import keras
    from keras import layers

    inputs = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
    x = _position_embedding()()(layers.Embedding(TEXT_VOCAB, 32)(inputs))
    for _ in range(2):
        x = _encoder_block(x, heads=2, hidden=64)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x), name="transformer")


def lstm():
    """An LSTM text classifier: embedding (width 32), one LSTM layer of 32 units, a sigmoid.

    Returns:
        An uncompiled `keras.Model`: `(batch, SEQUENCE_LENGTH)` int32 token ids ->
        `(batch, 1)` probability.
    """
    import keras
    from keras import layers

    inputs = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
    x = layers.LSTM(32)(layers.Embedding(TEXT_VOCAB, 32)(inputs))
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x), name="lstm")


def wide():
    """A wide embedding model: a `WIDE_VOCAB` x 32 embedding table (3.2M weights), flattened, a dense
    layer of 64 units, a sigmoid.

    Returns:
        An uncompiled `keras.Model`: `(batch, WIDE_IDS)` int32 ids in
        `[0, WIDE_VOCAB)` -> `(batch, 1)` probability.
    """
    import keras
    from keras import layers

    inputs = keras.Input((WIDE_IDS,), dtype="int32")
    x = layers.Flatten()(layers.Embedding(WIDE_VOCAB, 32)(inputs))
    x = layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x), name="wide")


def separable():
    """A MobileNet-like image classifier: a stride-2 stem, three depthwise-separable blocks (depthwise 3x3,
    BatchNorm, ReLU6, pointwise 1x1 to 32, 64, 64 channels), global pooling.

    Returns:
        An uncompiled `keras.Model`: `(batch, 32, 32, 3)` float32 images ->
        `(batch, 10)` class probabilities.
    """
    import keras
    from keras import layers

    inputs = keras.Input((32, 32, 3))
    x = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(16, 3, strides=2, padding="same")(inputs)))
    for filters, stride in ((32, 1), (64, 2), (64, 1)):
        x = layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False)(x)
        x = layers.ReLU(6.0)(layers.BatchNormalization()(x))
        x = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(filters, 1, use_bias=False)(x)))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10, activation="softmax")(x), name="separable")


def autoencoder():
    """A dense autoencoder (regression): 784 raw pixels -> 256 -> 32 -> 256 -> 784 sigmoid outputs.

    Returns:
        An uncompiled `keras.Model`: `(batch, 28, 28)` uint8 pixels ->
        `(batch, 784)` float32 in (0, 1), the pixels / 255 it reconstructs.
    """
    import keras
    from keras import layers

    inputs = keras.Input((28, 28))
    x = layers.Flatten()(layers.Rescaling(1 / 255)(inputs))
    for units in (256, 32, 256):
        x = layers.Dense(units, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(784, activation="sigmoid")(x), name="autoencoder")


# --- Data (each `(n, seed) -> (x, y)` NumPy arrays of n examples) ---------------------

def mnist_data(n: int, seed: int = 0):
    """The first `n` real MNIST training images: uint8 `(n, 28, 28)`, uint8 labels 0..9."""
    data = common.mnist_arrays()
    return data.x_train[:n], data.y_train[:n]


def reconstruction_data(n: int, seed: int = 0):
    """The first `n` real MNIST training images as inputs (uint8 `(n, 28, 28)`) and as targets
    (float32 `(n, 784)`, pixels / 255)."""
    import numpy as np

    x, _ = mnist_data(n, seed)
    return x, (x.reshape(len(x), -1) / np.float32(255)).astype(np.float32)


def image_data(n: int, seed: int = 0):
    """Synthetic CIFAR-like images: float32 `(n, 32, 32, 3)` uniform in [0, 1), int32 labels 0..9."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n, dtype=np.int32)


def token_data(n: int, seed: int = 0):
    """Synthetic IMDB-like token sequences: int32 `(n, SEQUENCE_LENGTH)` ids, float32 0/1 labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(1, TEXT_VOCAB, (n, SEQUENCE_LENGTH), dtype=np.int32)
    return x, rng.integers(0, 2, n).astype(np.float32)


def id_data(n: int, seed: int = 0):
    """Synthetic categorical ids: int32 `(n, WIDE_IDS)` in `[0, WIDE_VOCAB)`, float32 0/1 labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.integers(0, WIDE_VOCAB, (n, WIDE_IDS), dtype=np.int32)
    return x, rng.integers(0, 2, n).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo and how it is timed.

    Attributes:
        name: short name (table rows, `--models`).
        build: `() -> keras.Model`, uncompiled.
        data: `(n, seed) -> (x, y)` NumPy arrays.
        loss: the Keras loss name every contender compiles with.
        metric: the Keras metric name every contender compiles with.
        batch_size: the global batch size of every contender.
        timed_examples: examples per epoch at full size (a multiple of 64 x
            `batch_size`, so every steps_per_execution of the grid divides each epoch).
        dataset_size: a realistic training set size, for the probe's share of
            a 10-epoch run.
        dataset: what `dataset_size` stands for.
    """

    name: str
    build: Callable
    data: Callable
    loss: str
    metric: str
    batch_size: int
    timed_examples: int
    dataset_size: int
    dataset: str


_SPARSE, _BINARY, _ACC = "sparse_categorical_crossentropy", "binary_crossentropy", "accuracy"
_EPOCH = 128 * 64
ZOO = (
    ZooModel("mlp", mlp, mnist_data, _SPARSE, _ACC, 128, _EPOCH, 60_000, "MNIST, real"),
    ZooModel("cnn", cnn, mnist_data, _SPARSE, _ACC, 128, _EPOCH, 60_000, "MNIST, real"),
    ZooModel("resnet", resnet, image_data, _SPARSE, _ACC, 128, _EPOCH, 50_000, "CIFAR-10-like, synthetic"),
    ZooModel("separable", separable, image_data, _SPARSE, _ACC, 128, _EPOCH, 50_000, "CIFAR-10-like, synthetic"),
    ZooModel("transformer", transformer, token_data, _BINARY, _ACC, 128, _EPOCH, 25_000, "IMDB-like, synthetic"),
    ZooModel("lstm", lstm, token_data, _BINARY, _ACC, 128, _EPOCH, 25_000, "IMDB-like, synthetic"),
    ZooModel("wide", wide, id_data, _BINARY, _ACC, 128, _EPOCH, 100_000, "categorical ids, synthetic"),
    ZooModel("autoencoder", autoencoder, reconstruction_data, "mse", "mae", 128, _EPOCH, 60_000, "MNIST, real"),
)
"""The zoo, in running order."""


QUICK_MODELS = ("wide",)
"""Models timed at `--quick` (the suite's test checks the machinery on one): the wide embedding model."""


def zoo_models(args) -> list:
    """The `ZooModel`s to time: `--models`, else `QUICK_MODELS` at `--quick`, else all.

    Raises:
        SystemExit: on an unknown model name.
    """
    by_name = {m.name: m for m in ZOO}
    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else tuple(by_name))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"Unknown model(s) {', '.join(unknown)}. Expected some of: {', '.join(by_name)}.")
    return [by_name[n] for n in names]


def examples_per_epoch(spec: ZooModel, quick: bool) -> int:
    """Examples in each timed epoch: `timed_examples`, or 8 batches at `--quick`."""
    return spec.batch_size * 8 if quick else spec.timed_examples
