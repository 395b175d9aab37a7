"""`ImageFolderTask`: a task over a folder of images with one sub-folder per class."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tftrain.train.tasks.files import FileSplitTask


def _random_subset(files, count: int, seed: int):
    """`count` seeded random files, so a small subset still holds every class."""
    import numpy as np

    if count >= len(files):
        return files
    keep = np.sort(np.random.default_rng(seed).permutation(len(files))[:count])
    return dataclasses.replace(files, paths=tuple(files.paths[i] for i in keep),
                               labels=tuple(files.labels[i] for i in keep))


class ImageFolderTask(FileSplitTask):
    """A task over a folder of images with one sub-folder per class.

    As `keras.utils.image_dataset_from_directory`; `--validation-split` and `--train-examples` pick seeded random files.

    Args:
        build_model: `() -> keras.Model` or `(hparams) -> ...`, taking float32 images `(batch, height, width,
            num_channels)`, pixels 0..255.
        directory: the training folder; `--data-dir` replaces it.
        image_size: `(height, width)` every image is resized to.
        test_directory: a folder of the same classes, evaluated after training. Defaults to None.
        augment: training batch map `(images, labels) -> (images, labels)`. Defaults to None.
        num_channels: 1 or 3. Defaults to 3.
        split_seed: Defaults to 1337.
        loss: Defaults to `"sparse_categorical_crossentropy"`.
        metrics: Defaults to `["accuracy"]`.
        **task_args: `optimizer`, `learning_rate`, ...: see `FunctionTask`. `name` defaults to `"image_folder"`.

    Raises:
        DataError: when bound, a folder is missing or holds no images.
    """

    def __init__(self, build_model, directory, *, image_size, test_directory=None, augment=None, num_channels=3,
                 split_seed=1337, loss="sparse_categorical_crossentropy", metrics=("accuracy",), name="image_folder",
                 **task_args):
        super().__init__(build_model, loss=loss, metrics=list(metrics or ()), name=name, **task_args)
        self.directory, self.test_directory = directory, test_directory
        self.image_size, self.augment, self.num_channels = tuple(image_size), augment, num_channels
        self.split_seed = split_seed
        self.example_unit = "images"
        self._files = None

    def bind(self, config):
        """Binds the config and lists the files of `--data-dir` (or `directory`)."""
        from tftrain.data.image_folder import list_image_files

        bound = super().bind(config)
        directory = config.data.data_dir or self.directory
        split = config.data.validation_split
        kwargs = {"validation_split": split, "seed": self.split_seed}
        train = list_image_files(directory, subset="training" if split else None, **kwargs)
        if config.data.train_examples is not None:
            train = _random_subset(train, config.data.train_examples, self.split_seed)
        val = list_image_files(directory, subset="validation", **kwargs) if split else None
        bound._files = {"train": train, "validation": val, "test": None}
        if self.test_directory:
            bound.set_test_directory(self.test_directory)
        return bound

    def set_test_directory(self, directory) -> None:
        """Lists a test folder on a bound task; `DataError` unless its classes are the training folder's."""
        from tftrain.data.image_folder import list_image_files
        from tftrain.errors import DataError

        test = list_image_files(directory)
        if test.class_names != self.class_names:
            raise DataError(
                f"Test folder {str(directory)!r} has classes {list(test.class_names)[:5]}..., the training folder "
                f"{list(self.class_names)[:5]}...: labels would not match. Give both folders the same sub-folders."
            )
        self.test_directory = directory
        self._files = {**self._files, "test": test}

    @property
    def class_names(self) -> tuple:
        """The sorted sub-folder names of the bound training folder."""
        return self._files["train"].class_names

    @property
    def num_train_examples(self) -> Optional[int]:
        """Training images (None before `bind`)."""
        return None if self._files is None else len(self._files["train"])

    @property
    def num_test_examples(self) -> Optional[int]:
        test = None if self._files is None else self._files["test"]
        return None if test is None else len(test)

    def _dataset(self, split, global_batch_size, training, input_context=None, config=None):
        from tftrain.data.image_folder import image_folder_dataset

        files = self._files[split]
        if files is None:
            return None
        return image_folder_dataset(files, self.image_size, global_batch_size, training=training,
                                    config=config or self._data, seed=self._seed,
                                    augment=self.augment if training else None, input_context=input_context,
                                    num_channels=self.num_channels)

    def input_bound_hint(self) -> str:
        if not self._data.cache:
            return ("decoding and resizing the image files is the likely cost: turn --cache back on, so epochs after "
                    "the first read decoded images from memory")
        return ("decoding and resizing the image files is the likely cost (the first epoch decodes every file; "
                "later ones read the cache): store the images at the training size, train more epochs per run, "
                "or raise --private-threads")

    def data_error_hint(self, error: BaseException) -> str:
        if "decode_image" not in str(error) or self._files is None:
            return ""
        from tftrain.data.image_folder import undecodable

        bad = [path for files in self._files.values() if files is not None
               for path in undecodable(files.paths, self.num_channels)]
        if not bad:
            return ""
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        return f"{bad[0]}{more} cannot be decoded as an image: remove or replace {'them' if more else 'it'}"

    def describe_data(self) -> list:
        files = self._files
        counts = ", ".join(f"{len(v):,} {k}" for k, v in files.items() if v is not None)
        h, w = self.image_size
        return [f"data:      image folder: {counts} images, {len(self.class_names)} classes, resized to {h}x{w}; "
                "pipeline: parallel decode" + (", cache" if self._data.cache else "") + ", shuffle, batch"
                + (", augment" if self.augment else "") + (", prefetch" if self._data.prefetch else "")]
