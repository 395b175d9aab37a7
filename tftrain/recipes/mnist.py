"""MNIST recipe: train an MLP or a small CNN on the real MNIST digits.

Launch::

    python -m tftrain.recipes.mnist --strategy mirrored
    python -m tftrain.recipes.mnist --model cnn --epochs 3 --config recipes/mnist.yaml
    python -m tftrain.recipes.mnist --strategy mirrored --cpu-replicas 2   # 2 replicas, no GPU

Smoke size (tests and CI): `--train-examples 2048 --epochs 1`.

Data: the MNIST database (LeCun, Cortes, Burges), bundled with tftrain; `--data-dir`
takes any MNIST-format folder (e.g. Fashion-MNIST) or a Keras-layout `.npz`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

from tftrain.config import RecipeConfig, hparam
from tftrain.train.tasks import ArrayTask

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)


def mlp(width: Optional[int] = None):
    """784-512-512-10 multilayer perceptron with ReLU and dropout 0.2.

    Args:
        width: hidden units per layer. Defaults to None (512).

    Returns:
        An uncompiled functional `keras.Model`: input `(batch, 28, 28)` raw pixels
        0..255 (uint8 or float; scaled to [0, 1] inside the model), output
        float32 `(batch, 10)` class probabilities.
    """
    import keras

    inputs = keras.Input(IMAGE_SHAPE, name="image")
    x = _rescale(inputs)
    x = keras.layers.Flatten()(x)
    for i in range(2):
        x = keras.layers.Dense(width or 512, activation="relu", name=f"dense_{i}")(x)
        x = keras.layers.Dropout(0.2)(x)
    x = keras.layers.Dense(NUM_CLASSES, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="mnist_mlp")


def cnn(width: Optional[int] = None):
    """Two 3x3 conv layers (32, 64 filters) with max pooling, dropout and a softmax.

    The Keras "Simple MNIST convnet" example architecture
    (https://keras.io/examples/vision/mnist_convnet/), 34,826 parameters.

    Args:
        width: filters of the first convolution (the second has twice as
            many). Defaults to None (32).

    Returns:
        An uncompiled functional `keras.Model`: input `(batch, 28, 28)` raw pixels
        0..255 (scaled to [0, 1] inside the model), output float32 `(batch, 10)`
        class probabilities.
    """
    import keras

    inputs = keras.Input(IMAGE_SHAPE, name="image")
    x = keras.layers.Reshape(IMAGE_SHAPE + (1,))(_rescale(inputs))
    width = width or 32
    x = keras.layers.Conv2D(width, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(2 * width, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.5)(x)
    x = keras.layers.Dense(NUM_CLASSES, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="mnist_cnn")


def _rescale(inputs):
    """Pixels 0..255 -> [0, 1], inside the model.

    Scaling in the model instead of the tf.data pipeline moves a cast and a multiply
    from the pipeline's threads into the training step, where they are nearly free;
    the pipeline then only gathers uint8 batches (a quarter of the bytes). With the
    MLP at batch 512 on 2 cores, training fed by the pipeline then ran as fast as on
    batches held in memory, and about 7% faster end to end than scaling in the
    pipeline (README, "Benchmarks").
    """
    import keras

    return keras.layers.Rescaling(1.0 / 255, name="rescale_pixels")(inputs)


MODELS = {"mlp": mlp, "cnn": cnn}
"""Model name -> builder `(width) -> keras.Model`."""

BATCH_SIZES = {"mlp": 256, "cnn": 128}
"""Default global batch size per model, used when neither `--batch-size` nor
`--per-replica-batch-size` is given. The MLP's, with its learning rate, was chosen on a
validation split (`benchmarks/results/recipe_defaults.md`: best mean validation accuracy of
batch 256 / 512 / 1024 x rate 1e-3 / 2e-3 / 4e-3, seeds 0 and 1); the CNN's by measurement
(docs/benchmarks.md)."""

WIDTHS = {"mlp": (128, 256, 512), "cnn": (16, 32, 64)}
"""Widths `--tune` chooses from, per model."""


@dataclasses.dataclass(frozen=True)
class MnistHParams:
    """The MNIST task's own hyperparameters (flags `--model`, `--width`; YAML section `task:`).

    Attributes:
        model: `"mlp"` or `"cnn"`. Defaults to `"mlp"`.
        width: MLP hidden units / CNN first-convolution filters; None keeps the
            model's default (512 / 32). Defaults to None.
    """

    model: str = hparam("mlp", "model architecture", choices=tuple(MODELS))
    width: Optional[int] = hparam(None, "model width: MLP hidden units / CNN first-layer filters", minimum=1)


@functools.lru_cache(maxsize=2)
def _load(data_dir: Optional[str]):
    from tftrain.data.datasets import load_mnist

    return load_mnist(data_dir)


def _integer_labels(images, labels):
    from tftrain.data.pipeline import integer_labels

    return integer_labels(images, labels)


class MnistTask(ArrayTask):
    """MNIST digits (or any MNIST-format data via `--data-dir`) with the MLP or the CNN.

    Sparse categorical cross-entropy, accuracy, Adam at 2e-3 decayed along a
    cosine; batches of raw uint8 pixels (the models scale their own inputs) and
    int32 labels; the 10,000 test images evaluated after training.
    """

    name = "mnist"
    hparams = MnistHParams()
    learning_rate = 2e-3
    defaults = {"execution": "auto", "steps_per_execution": 8, "epochs": 10, "learning_rate": 2e-3,
                "lr_schedule": "cosine"}

    def __init__(self):  # the arrays are loaded by bind(), once --data-dir is known
        self.loss, self.optimizer, self.metrics = "sparse_categorical_crossentropy", "adam", ["accuracy"]
        self.preprocess, self.validation, self.test = _integer_labels, None, None
        self.x = self.y = None

    @property
    def default_batch_size(self) -> int:
        """256 for the MLP, 128 for the CNN (`BATCH_SIZES`)."""
        return BATCH_SIZES[self.hparams.model]

    def bind(self, config: RecipeConfig) -> "MnistTask":
        """Binds the config and loads the data of `config.data.data_dir` (bundled MNIST by default)."""
        bound = super().bind(config)
        data = _load(config.data.data_dir)
        bound.x, bound.y, bound.test = data.x_train, data.y_train, (data.x_test, data.y_test)
        return bound

    def build_model(self):
        """The MLP or the CNN at `hparams.width`."""
        return MODELS[self.hparams.model](self.hparams.width)

    def tune_space(self):
        """The widths of the chosen model (`WIDTHS`)."""
        return {"width": WIDTHS[self.hparams.model]}


TASK = MnistTask()
"""The MNIST task; `python -m tftrain.run tftrain.recipes.mnist:TASK` runs it too."""

DEFAULTS = TASK.default_config()
"""The recipe's defaults; `recipes/mnist.yaml` holds the same values.

Chosen by measurement (`python -m benchmarks`; docs/benchmarks.md): the batch size
per model (`BATCH_SIZES`: the MLP's batch 256 and Adam's learning rate 2e-3, decayed to 0
along a cosine over the run, scored best on a validation split of the training set; the
CNN gains little from large batches on a CPU and needs more epochs with them); `steps_per_execution` 8 (one tf.function call, and one host
sync, per 8 steps); `execution` auto (graph or XLA, timed on the run's own model
and batch); the tf.data options all on.
"""

PROG = "python -m tftrain.recipes.mnist"
DESCRIPTION = "Train an MLP or CNN on the real MNIST digits and evaluate on the 10,000 test images."


def train(config: Optional[RecipeConfig] = None, **overrides) -> dict:
    """Trains from Python (notebooks, scripts) instead of the command line.

    Args:
        config: a full `RecipeConfig`. Defaults to the recipe's `DEFAULTS`.
        **overrides: config fields by name, e.g. `epochs=2, strategy="mirrored"`
            (the same names as the flags, with underscores).

    Returns:
        The run's metrics dict (as written to `metrics.json`, with `run_dir`).

    Raises:
        ConfigError: on an unknown field or bad value, or any bad input the
            command line would report with exit code 2.

    Example:
        >>> from tftrain.recipes import mnist
        >>> metrics = mnist.train(epochs=1, train_examples=4096, run_dir="runs/try")
        >>> metrics["test_accuracy"]
    """
    from tftrain.train.trainer import Trainer

    command = [*PROG.split(), *(f"--{k.replace('_', '-')}={v}" for k, v in overrides.items())]
    return Trainer(TASK, config or DEFAULTS, command=command, **overrides).fit().to_dict()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the MNIST recipe from the command line; returns the exit code (see `tftrain.run.main`)."""
    from tftrain import run

    return run.main(argv, task=TASK, prog=PROG, description=DESCRIPTION, default_config="recipes/mnist.yaml")


if __name__ == "__main__":
    from tftrain import run

    run.run_module(main)
