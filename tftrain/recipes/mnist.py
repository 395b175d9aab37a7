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

from typing import Optional, Sequence

from tftrain.config import DataConfig, RecipeConfig, RuntimeConfig, TrainConfig
from tftrain.data.datasets import load_mnist
from tftrain.recipes._runner import Recipe, main as run_recipe, run_module

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)


def _width(cfg: Optional[RecipeConfig], default: int) -> int:
    return cfg.train.width if cfg is not None and cfg.train.width else default


def mlp(cfg: Optional[RecipeConfig] = None):
    """784-512-512-10 multilayer perceptron with ReLU and dropout 0.2.

    Args:
        cfg: the run's config; `cfg.train.width` replaces the 512 hidden units.
            Defaults to None (512).

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
        x = keras.layers.Dense(_width(cfg, 512), activation="relu", name=f"dense_{i}")(x)
        x = keras.layers.Dropout(0.2)(x)
    x = keras.layers.Dense(NUM_CLASSES, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="mnist_mlp")


def cnn(cfg: Optional[RecipeConfig] = None):
    """Two 3x3 conv layers (32, 64 filters) with max pooling, dropout and a softmax.

    The Keras "Simple MNIST convnet" example architecture
    (https://keras.io/examples/vision/mnist_convnet/), 34,826 parameters.

    Args:
        cfg: the run's config; `cfg.train.width` replaces the 32 filters of the
            first convolution (the second has twice as many). Defaults to None.

    Returns:
        An uncompiled functional `keras.Model`: input `(batch, 28, 28)` raw pixels
        0..255 (scaled to [0, 1] inside the model), output float32 `(batch, 10)`
        class probabilities.
    """
    import keras

    inputs = keras.Input(IMAGE_SHAPE, name="image")
    x = keras.layers.Reshape(IMAGE_SHAPE + (1,))(_rescale(inputs))
    width = _width(cfg, 32)
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


def _integer_labels(images, labels):
    from tftrain.data.pipeline import integer_labels

    return integer_labels(images, labels)


DEFAULTS = RecipeConfig(
    runtime=RuntimeConfig(execution="auto", steps_per_execution=8),
    data=DataConfig(batch_size=None, cache=True, parallel_map=True, prefetch=True, private_threads=0),
    train=TrainConfig(model="mlp", epochs=10, learning_rate=2e-3, lr_schedule="cosine"),
)
"""The recipe's defaults; `recipes/mnist.yaml` holds the same values.

Chosen by measurement (`python -m benchmarks`; README, "Why the recipe's defaults are
what they are"): the batch size per model (`BATCH_SIZES`: the MLP trains several
times more examples/sec at 512 than at 64-128; the CNN gains little from large
batches on a CPU and needs more epochs with them); Adam's learning rate scaled up
to 2e-3 and decayed to 0 along a cosine over the run (the MLP reaches 98% test
accuracy in about 4 epochs and ends near 98.5%); `steps_per_execution` 8 (one tf.function call, and one host sync, per 8
steps); `execution` auto (graph or XLA, timed on the run's own model and batch); the
tf.data options all on.
"""

BATCH_SIZES = {"mlp": 512, "cnn": 128}
"""Default global batch size per model, used when neither `--batch-size` nor
`--per-replica-batch-size` is given (measured: README, "Benchmarks")."""

RECIPE = Recipe(
    name="mnist",
    models={"mlp": mlp, "cnn": cnn},
    batch_sizes=BATCH_SIZES,
    load_data=load_mnist,
    defaults=DEFAULTS,
    preprocess=_integer_labels,
    default_config="recipes/mnist.yaml",
    widths={"mlp": (128, 256, 512), "cnn": (16, 32, 64)},
    description="Train an MLP or CNN on the real MNIST digits and evaluate on the 10,000 test images.",
)


def train(config: Optional[RecipeConfig] = None, **overrides) -> dict:
    """Trains from Python (notebooks, scripts) instead of the command line.

    Args:
        config: a full `RecipeConfig`. Defaults to the recipe's `DEFAULTS`.
        **overrides: config fields by name, e.g. `epochs=2, strategy="mirrored"`
            (the same names as the flags, with underscores).

    Returns:
        The run's metrics dict (as written to `metrics.json`), plus `run_dir`.

    Raises:
        ConfigError: on an unknown field or bad value, or any bad input the
            command line would report with exit code 2.

    Example:
        >>> from tftrain.recipes import mnist
        >>> metrics = mnist.train(epochs=1, train_examples=4096, run_dir="runs/try")
        >>> metrics["test_accuracy"]
    """
    from tftrain.recipes._runner import run

    cfg = (config or DEFAULTS).override(overrides)
    return run(cfg, RECIPE, argv=[f"--{k.replace('_', '-')}={v}" for k, v in overrides.items()])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the MNIST recipe; returns the exit code (see `tftrain.recipes._runner.main`)."""
    return run_recipe(argv, RECIPE)


if __name__ == "__main__":
    run_module(RECIPE)
