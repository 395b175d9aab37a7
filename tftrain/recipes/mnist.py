"""MNIST recipe: train an MLP or a small CNN on the real MNIST digits.

    python -m tftrain.recipes.mnist --strategy mirrored
    python -m tftrain.recipes.mnist --model cnn --epochs 3 --config recipes/mnist.yaml
    python -m tftrain.recipes.mnist --strategy mirrored --cpu-replicas 2   # 2 replicas, no GPU

Smoke size (tests and CI): `--train-examples 2048 --epochs 1`. Data: MNIST (LeCun, Cortes, Burges), bundled;
`--data-dir` takes any MNIST-format folder (e.g. Fashion-MNIST) or a Keras-layout `.npz`.
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
    """Uncompiled 784-512-512-10 MLP (`width` hidden units, default None: 512), ReLU, dropout 0.2: `(batch, 28, 28)`
    pixels 0..255 in, float32 class probabilities out."""
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
    """Uncompiled two 3x3 conv layers (`width`, 2 x `width` filters; default None: 32), inputs and outputs as `mlp`.
    Source: https://keras.io/examples/vision/mnist_convnet/"""
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
    """Pixels 0..255 -> [0, 1] in the model, so the pipeline moves uint8 batches."""
    import keras

    return keras.layers.Rescaling(1.0 / 255, name="rescale_pixels")(inputs)


MODELS = {"mlp": mlp, "cnn": cnn}
"""Model name -> builder `(width) -> keras.Model`."""

BATCH_SIZES = {"mlp": 256, "cnn": 128}
"""Default global batch size per model; see benchmarks/results/recipe_defaults.md."""

WIDTHS = {"mlp": (128, 256, 512), "cnn": (16, 32, 64)}
"""Widths `--tune` chooses from, per model."""


@dataclasses.dataclass(frozen=True)
class MnistHParams:
    """The MNIST task's own hyperparameters (YAML section `task:`)."""

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
    """MNIST digits (or any MNIST-format data via `--data-dir`) with the MLP or the CNN; test images evaluated last."""

    name = "mnist"
    hparams = MnistHParams()
    learning_rate = 2e-3
    defaults = {"execution": "auto", "steps_per_execution": 8, "epochs": 10, "learning_rate": 2e-3,
                "lr_schedule": "cosine"}

    def __init__(self):  # bind() loads the arrays, once --data-dir is known
        self.loss, self.optimizer, self.metrics = "sparse_categorical_crossentropy", "adam", ["accuracy"]
        self.preprocess, self.validation, self.test = _integer_labels, None, None
        self.x = self.y = None

    @property
    def default_batch_size(self) -> int:
        """`BATCH_SIZES` of the chosen model."""
        return BATCH_SIZES[self.hparams.model]

    def bind(self, config: RecipeConfig) -> "MnistTask":
        """Binds the config and loads `config.data.data_dir` (bundled MNIST by default)."""
        bound = super().bind(config)
        data = _load(config.data.data_dir)
        bound.x, bound.y, bound.test = data.x_train, data.y_train, (data.x_test, data.y_test)
        return bound

    def build_model(self):
        return MODELS[self.hparams.model](self.hparams.width)

    def tune_space(self):
        return {"width": WIDTHS[self.hparams.model]}


TASK = MnistTask()
"""The MNIST task; `python -m tftrain.run tftrain.recipes.mnist:TASK` runs it too."""

DEFAULTS = TASK.default_config()
"""The recipe's defaults, chosen by measurement (docs/benchmarks.md); `recipes/mnist.yaml` holds the same."""

PROG = "python -m tftrain.recipes.mnist"
DESCRIPTION = "Train an MLP or CNN on the real MNIST digits and evaluate on the 10,000 test images."


def train(config: Optional[RecipeConfig] = None, **overrides) -> dict:
    """Trains from Python (notebooks, scripts): `config` defaults to `DEFAULTS`; `**overrides` are config fields
    (`epochs=2`). Returns the metrics dict (as `metrics.json`, with `run_dir`); `ConfigError` where the CLI exits 2.

    Example:
        >>> metrics = mnist.train(epochs=1, train_examples=4096, run_dir="runs/try")
    """
    from tftrain.train.trainer import Trainer

    command = [*PROG.split(), *(f"--{k.replace('_', '-')}={v}" for k, v in overrides.items())]
    return Trainer(TASK, config or DEFAULTS, command=command, **overrides).fit().to_dict()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the MNIST recipe from the command line; returns the exit code."""
    from tftrain import run

    return run.main(argv, task=TASK, prog=PROG, description=DESCRIPTION, default_config="recipes/mnist.yaml")


if __name__ == "__main__":
    from tftrain import run

    run.run_module(main)
