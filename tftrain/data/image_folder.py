"""A folder of images, one sub-folder per class, as Keras's `image_dataset_from_directory` (classes: sorted non-hidden
sub-folders; examples: files below with an `IMAGE_EXTENSIONS` extension). `list_image_files` imports no TensorFlow."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Tuple, Union

import numpy as np

from tftrain.config import DataConfig
from tftrain.errors import ConfigError, DataError, check_int

if TYPE_CHECKING:  # TensorFlow is imported only when a dataset is built
    import tensorflow as tf

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
"""File extensions read as images (compared in lower case), as Keras reads them."""

SUBSETS = ("training", "validation")
"""Values of `list_image_files(subset=...)` besides None (all files)."""


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """Image file paths, their labels (indices into `class_names`) and the sorted class names."""

    paths: Tuple[str, ...]
    labels: Tuple[int, ...]
    class_names: Tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)


def _class_folders(directory: Union[str, os.PathLike]) -> Tuple[Path, Tuple[str, ...]]:
    """Checks `directory`; returns it as a `Path` with its sorted class names."""
    root = Path(directory)
    if not root.exists():
        raise DataError(
            f"Image folder {str(root)!r} does not exist. Expected a folder with one sub-folder per class. "
            "Check the path."
        )
    if not root.is_dir():
        raise DataError(
            f"Image folder {str(root)!r} is a file, not a folder. Expected a folder with one sub-folder "
            "per class, e.g. photos/cat/1.jpg and photos/dog/2.jpg. Pass the folder that holds the class folders."
        )
    class_names = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if not class_names:
        loose = sum(1 for p in root.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        found = f" It holds {loose} image file(s) directly." if loose else ""
        raise DataError(
            f"Image folder {str(root)!r} has no class sub-folders.{found} Expected one sub-folder per class, "
            "e.g. photos/cat/1.jpg and photos/dog/2.jpg. Move the images into one folder per class."
        )
    return root, class_names


def _files_of_class(folder: Path) -> list:
    """Image files under `folder` (recursively), sorted, as Keras walks them."""
    found = []
    for parent, _, names in sorted(os.walk(folder), key=lambda walk: walk[0]):
        found += [os.path.join(parent, n) for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)]
    return found


def _check_split(validation_split, subset) -> None:
    if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)) \
            or not 0 <= validation_split < 1:
        raise DataError(
            f"validation_split must be a fraction in [0, 1). Received: validation_split={validation_split!r}. "
            "Pass e.g. validation_split=0.2 to hold out 20% of the files."
        )
    if subset is not None and subset not in SUBSETS:
        raise DataError(
            f"Invalid subset {subset!r}. Expected one of: None, 'training', 'validation'. Received: subset={subset!r}."
        )
    if subset is not None and not validation_split:
        raise DataError(
            f"subset={subset!r} needs a validation split, but validation_split=0. "
            "Pass validation_split=0.2 (for example), or subset=None for all files."
        )
    if subset is None and validation_split:
        raise DataError(
            f"validation_split={validation_split} needs a subset. Received: subset=None. "
            "Pass subset='training' or subset='validation' (one call each), or validation_split=0 for all files."
        )


def list_image_files(
    directory: Union[str, os.PathLike],
    *,
    validation_split: float = 0.0,
    subset: Optional[str] = None,
    seed: int = 1337,
) -> ImageFiles:
    """Lists a class-per-sub-folder folder's images, sorted (the same on every machine); imports no TensorFlow.
    A split shuffles once with `numpy.random.default_rng(seed)` and holds out the last fraction (rounded down).

    Args:
        validation_split: fraction held out, in [0, 1). Defaults to 0.0 (no split).
        subset: `"training"` or `"validation"` with a split, None without. Defaults to None.
        seed: the split's seed; the same for both subsets keeps them disjoint. Defaults to 1337.

    Raises:
        DataError: a missing folder, no class folders or images, or split arguments invalid or leaving it empty.

    Example:
        >>> train = list_image_files("photos", validation_split=0.2, subset="training")
    """
    _check_split(validation_split, subset)
    root, class_names = _class_folders(directory)
    paths, labels = [], []
    for label, name in enumerate(class_names):
        files = _files_of_class(root / name)
        paths += files
        labels += [label] * len(files)
    if not paths:
        raise DataError(
            f"Image folder {str(root)!r} has {len(class_names)} class folder(s) ({', '.join(class_names[:5])}"
            f"{', ...' if len(class_names) > 5 else ''}) but no image files. Expected files ending in "
            f"{', '.join(IMAGE_EXTENSIONS)} (any case) inside the class folders."
        )
    if subset is None:
        return ImageFiles(tuple(paths), tuple(labels), class_names)
    order = np.random.default_rng(seed).permutation(len(paths))
    num_validation = int(validation_split * len(paths))
    if num_validation == 0:
        raise DataError(
            f"validation_split={validation_split} of {len(paths)} files holds out no file. "
            f"Pass validation_split >= {1 / len(paths):.3g}, or add images."
        )
    chosen = order[:-num_validation] if subset == "training" else order[-num_validation:]
    return ImageFiles(tuple(paths[i] for i in chosen), tuple(labels[i] for i in chosen), class_names)


def _check_dataset_args(files, image_size, batch_size, num_channels) -> None:
    if not isinstance(files, ImageFiles):
        raise ConfigError(
            f"files must be an ImageFiles (from list_image_files). Received: files of type {type(files).__name__}."
        )
    if not len(files):
        raise DataError("files holds no image. Expected at least one file; check the folder and the split.")
    check_int(batch_size, "batch_size", error=ConfigError)
    size_ok = isinstance(image_size, (tuple, list)) and len(image_size) == 2 and all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in image_size)
    if not size_ok:
        raise ConfigError(
            f"image_size must be (height, width), two positive integers. Received: image_size={image_size!r}. "
            "Pass e.g. image_size=(224, 224)."
        )
    if num_channels not in (1, 3, 4):
        raise ConfigError(
            f"num_channels must be 1 (grayscale), 3 (RGB) or 4 (RGBA). Received: num_channels={num_channels!r}."
        )


def decode_and_resize(path, label, image_size: Tuple[int, int], num_channels: int = 3):
    """Reads, decodes (a GIF's first frame) and resizes (bilinear) one image: `(float32 image 0..255, label)`."""
    import tensorflow as tf

    image = tf.io.decode_image(tf.io.read_file(path), channels=num_channels, expand_animations=False)
    image = tf.image.resize(image, image_size)  # bilinear, float32, as Keras resizes
    return tf.ensure_shape(image, (*image_size, num_channels)), label


def undecodable(paths, num_channels: int = 3) -> list:
    """The paths among `paths` that `decode_and_resize` cannot decode (reads and decodes every file once)."""
    import tensorflow as tf

    decoded = tf.data.Dataset.from_tensor_slices(list(paths)).map(
        lambda path: (path, tf.shape(tf.io.decode_image(tf.io.read_file(path), channels=num_channels,
                                                        expand_animations=False))),
        num_parallel_calls=tf.data.AUTOTUNE).ignore_errors()
    good = {path.decode() for path, _ in decoded.as_numpy_iterator()}
    return [path for path in paths if path not in good]


def _training_order(files: ImageFiles, seed: Optional[int]):
    """Paths and labels in one seeded order (the same in every worker), so a small shuffle buffer mixes classes."""
    order = np.random.default_rng(0 if seed is None else seed).permutation(len(files))
    return [files.paths[i] for i in order], np.asarray(files.labels, np.int32)[order]


def image_folder_dataset(
    files: ImageFiles,
    image_size: Tuple[int, int],
    batch_size: int,
    *,
    training: bool,
    config: Optional[DataConfig] = None,
    seed: Optional[int] = None,
    augment: Optional[Callable] = None,
    input_context: Optional["tf.distribute.InputContext"] = None,
    num_channels: int = 3,
) -> "tf.data.Dataset":
    """A batched `tf.data.Dataset` of decoded images and labels: paths -> shard -> decode and resize -> cache ->
    shuffle -> batch -> `augment` -> prefetch.

    Args:
        image_size: `(height, width)`, resized bilinearly.
        batch_size: the global batch size, also with `input_context`.
        training: True shuffles, drops the last partial batch and applies `augment`.
        config: pipeline options; `cache` takes `height x width x num_channels x 4` bytes an image (a full shuffle
            buffer as much again). Defaults to `DataConfig()`.
        seed: makes the order (and seeded augmentation) repeatable. Defaults to None.
        augment: `(images, labels) -> (images, labels)` on float32 training batches, e.g. `random_flip_and_translate()`;
            sequential with a `seed` (Keras's random layers share one seed state). Defaults to None.
        input_context: shards the files and batches per replica. Defaults to None.
        num_channels: 1, 3 or 4. Defaults to 3.

    Returns:
        `(float32 images (batch, height, width, num_channels) 0..255, int32 labels)`, auto-shard OFF with
        `input_context`, else DATA.

    Raises:
        ConfigError: `files` is not an `ImageFiles`, or a size is out of range.
        DataError: `files` is empty.

    Example:
        >>> ds = image_folder_dataset(files, (160, 160), 64, training=True, seed=0,
        ...                           augment=random_flip_and_translate(seed=0))
    """
    import tensorflow as tf

    _check_dataset_args(files, image_size, batch_size, num_channels)
    config = config or DataConfig()
    image_size = tuple(image_size)
    parallel = tf.data.AUTOTUNE if config.parallel_map else None
    if training:
        paths, labels = _training_order(files, seed)
    else:
        paths, labels = list(files.paths), np.asarray(files.labels, np.int32)
    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    ds = ds.map(lambda path, label: decode_and_resize(path, label, image_size, num_channels),
                num_parallel_calls=parallel)
    if config.cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(config.shuffle_buffer or len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=training)
    if training and augment is not None:
        ds = ds.map(augment, num_parallel_calls=parallel if seed is None else None)
    if config.prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    from tftrain.data.pipeline import dataset_options

    policy = tf.data.experimental.AutoShardPolicy
    return ds.with_options(dataset_options(policy.OFF if input_context is not None else policy.DATA,
                                           seed is not None or not training, config.private_threads))


def random_flip_and_translate(
    flip: Optional[str] = "horizontal",
    translation: float = 0.1,
    seed: Optional[int] = None,
) -> Callable:
    """A default `image_folder_dataset(augment=...)`: Keras random flip and shift layers on float32 batches.

    Args:
        flip: `"horizontal"`, `"vertical"`, `"horizontal_and_vertical"`, or None. Defaults to "horizontal".
        translation: largest shift, a fraction of height and width in [0, 1); edges reflect. Defaults to 0.1.
        seed: the layers' seed. Defaults to None.

    Raises:
        ConfigError: `flip` or `translation` is invalid.
    """
    import keras

    flips = ("horizontal", "vertical", "horizontal_and_vertical")
    if flip is not None and flip not in flips:
        raise ConfigError(
            f"Invalid flip {flip!r}. Expected one of: {', '.join(flips)}, or None. Received: flip={flip!r}."
        )
    if isinstance(translation, bool) or not isinstance(translation, (int, float)) or not 0 <= translation < 1:
        raise ConfigError(
            f"translation must be a fraction in [0, 1). Received: translation={translation!r}. Pass e.g. 0.1."
        )
    layers = []  # float32 whatever the global dtype policy: the pipeline's contract
    if flip is not None:
        layers.append(keras.layers.RandomFlip(flip, seed=seed, dtype="float32"))
    if translation:
        shift_seed = None if seed is None else seed + 1  # not the flip's draws
        layers.append(keras.layers.RandomTranslation(translation, translation, seed=shift_seed, dtype="float32"))

    def augment(images, labels):
        for layer in layers:
            images = layer(images, training=True)
        return images, labels

    return augment
