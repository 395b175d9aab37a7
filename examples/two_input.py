"""A two-input classifier outside the package: which of two MNIST digits is larger?

Each example is a pair of real MNIST images, fed as two model inputs (a dict of
arrays: `{"left": ..., "right": ...}`); the label is 1 when the left digit is
larger than the right one, else 0 (binary cross-entropy, accuracy). One shared
encoder reads both images (a siamese layout). Pairs are drawn with a fixed seed
from the bundled MNIST: 30,000 training pairs from the training images and 5,000
test pairs from the test images. Equal digits (about 10% of pairs) are label 0, so
a model must rank, not only compare.

    python -m tftrain.run examples/two_input.py:task --epochs 3
    python -m tftrain.run examples/two_input.py:task --strategy mirrored --cpu-replicas 2
"""

import dataclasses

import numpy as np

import tftrain
from tftrain.data import load_mnist


def make_pairs(images, labels, num_pairs: int, seed: int):
    """`({"left": uint8 (n, 28, 28), "right": ...}, float32 (n,) labels)`: 1 where left > right."""
    rng = np.random.default_rng(seed)
    left, right = rng.integers(0, len(images), num_pairs), rng.integers(0, len(images), num_pairs)
    x = {"left": images[left], "right": images[right]}
    return x, (labels[left] > labels[right]).astype("float32")


@dataclasses.dataclass(frozen=True)
class HParams:
    """The encoder's width (`--embedding`)."""

    embedding: int = tftrain.hparam(64, "units of the shared image encoder", minimum=1)


def build_model(hp: HParams):
    """Shared encoder (rescale, flatten, 256 ReLU, `embedding` ReLU) on both images, then
    the two embeddings concatenated -> 64 ReLU -> 1 sigmoid (float32)."""
    import keras

    encoder = keras.Sequential([
        keras.Input((28, 28)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"), keras.layers.Dense(hp.embedding, activation="relu"),
    ], name="encoder")
    left, right = keras.Input((28, 28), name="left"), keras.Input((28, 28), name="right")
    x = keras.layers.Concatenate()([encoder(left), encoder(right)])
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="left_is_larger")(x)
    return keras.Model({"left": left, "right": right}, outputs, name="two_input_classifier")


_mnist = load_mnist()
x_train, y_train = make_pairs(_mnist.x_train, _mnist.y_train, 30_000, seed=0)
x_test, y_test = make_pairs(_mnist.x_test, _mnist.y_test, 5_000, seed=1)

task = tftrain.ArrayTask(
    build_model, x_train, y_train, x_test, y_test,
    loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"], learning_rate=1e-3,
    name="two_input", hparams=HParams(), default_batch_size=256, defaults={"epochs": 5},
)
