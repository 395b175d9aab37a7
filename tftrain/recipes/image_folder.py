"""Image-folder recipe: a Keras Applications model trained from scratch on any folder of images.

    python -m tftrain.recipes.image_folder --data-dir path/to/images
    python -m tftrain.recipes.image_folder --data-dir flowers --model resnet50 --image-size 128 --epochs 20
    python -m tftrain.recipes.image_folder --data-dir flowers --test-dir flowers_test --strategy mirrored

One sub-folder per class; 10% of the images held out for validation; random initial weights (no download).
Smoke size (tests and CI): `--model small_cnn --image-size 32 --epochs 1`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from tftrain.config import hparam
from tftrain.errors import ConfigError
from tftrain.train.tasks import ImageFolderTask

MODELS = ("mobilenet_v2", "resnet50", "efficientnet_b0", "small_cnn")
"""Models `--model` accepts."""


@dataclasses.dataclass(frozen=True)
class ImageFolderHParams:
    """The recipe's own hyperparameters."""

    model: str = hparam("mobilenet_v2", "Keras Applications model, from random weights", choices=MODELS)
    image_size: int = hparam(96, "images are resized to SIZE x SIZE pixels (under 32: --model small_cnn)", minimum=12)
    channels: int = hparam(3, "image channels: 1 grayscale, 3 RGB", choices=(1, 3))
    test_dir: Optional[str] = hparam(None, "a folder of the same classes to evaluate after training")
    augment: bool = hparam(True, "random horizontal flips and shifts of the training images")


BATCH_NORM_MOMENTUM = 0.9
"""BatchNormalization momentum of the models here: from random weights, MobileNetV2's 0.999 leaves evaluation at
chance in short runs (Keras's default: 0.99)."""


def build_model(hp: ImageFolderHParams, num_classes: int):
    """The chosen model for `(size, size, channels)` images, pixels 0..255 scaled inside the model."""
    import keras

    shape = (hp.image_size, hp.image_size, hp.channels)
    inputs = keras.Input(shape, name="image")
    if hp.model == "small_cnn":
        x = keras.layers.Rescaling(1 / 255)(inputs)
        for filters in (32, 64):
            x = keras.layers.Conv2D(filters, 3, activation="relu")(x)
            x = keras.layers.MaxPooling2D(2)(x)
        features = keras.layers.GlobalAveragePooling2D()(x)
    else:
        apps = keras.applications
        backbone = {"mobilenet_v2": apps.MobileNetV2, "resnet50": apps.ResNet50,
                    "efficientnet_b0": apps.EfficientNetB0}[hp.model]
        x = inputs if hp.model == "efficientnet_b0" else keras.layers.Rescaling(1 / 127.5, offset=-1)(inputs)
        network = backbone(include_top=False, weights=None, input_shape=shape, pooling="avg")
        for layer in network.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = BATCH_NORM_MOMENTUM
        features = network(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="probabilities")(features)
    return keras.Model(inputs, outputs, name=f"image_folder_{hp.model}")


class ImageFolderRecipe(ImageFolderTask):
    """`ImageFolderTask` whose folder is `--data-dir` and whose model is a Keras Application."""

    hparams = ImageFolderHParams()
    # The file order is shuffled up front, so a small buffer mixes the classes.
    defaults = {"validation_split": 0.1, "epochs": 10, "learning_rate": 1e-3, "shuffle_buffer": 1024}

    def __init__(self):
        super().__init__(build_model, None, image_size=(96, 96), name="image_folder", default_batch_size=64,
                         hparams=ImageFolderHParams(), defaults=self.defaults, learning_rate=1e-3)

    def build_model(self):
        return build_model(self.hparams, len(self.class_names))

    def bind(self, config):
        """Needs `--data-dir` (else `ConfigError`); applies the recipe's hyperparameters."""
        from tftrain.data.image_folder import random_flip_and_translate

        if not config.data.data_dir:
            raise ConfigError("Pass --data-dir DIR: a folder with one sub-folder of images per class.")
        hp = config.task
        if hp.image_size < 32 and hp.model != "small_cnn":
            raise ConfigError(f"--image-size {hp.image_size}: Keras Applications models take 32 x 32 pixels and "
                              "larger. Pass --image-size 32 or more, or --model small_cnn.")
        if hp.channels == 1 and hp.model == "efficientnet_b0":
            raise ConfigError("--channels 1: EfficientNet normalises 3 channels. Pass --model small_cnn, "
                              "mobilenet_v2 or resnet50, or --channels 3.")
        bound = super().bind(config)
        bound.image_size = (hp.image_size, hp.image_size)
        bound.num_channels = hp.channels
        bound.augment = random_flip_and_translate(seed=config.seed) if hp.augment else None
        if hp.test_dir:
            bound.set_test_directory(hp.test_dir)
        return bound


TASK = ImageFolderRecipe()
"""The recipe's task; `python -m tftrain.run tftrain.recipes.image_folder:TASK --data-dir DIR` runs it too."""

PROG = "python -m tftrain.recipes.image_folder"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the recipe from the command line; returns the exit code."""
    from tftrain import run

    return run.main(argv, task=TASK, prog=PROG, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    from tftrain import run

    run.run_module(main)
