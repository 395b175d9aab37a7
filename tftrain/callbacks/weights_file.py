"""Writing a model's weights file (`.weights.h5`, Keras's format) again and again, fast.

Keras's `Model.save_weights` walks every layer, optimizer and metric in Python at each save: about
12 ms for a three-layer MLP on a 2-core CPU, while its values take 0.6 ms to read and 2 ms to
write. A backup at each epoch end of a small model paid that walk every epoch (a 64 ms epoch of a
64-256-128-10 MLP trained 10-15 ms slower than plain Keras's; measured by disabling each of the
`Trainer`'s callbacks in turn: the backup was most of it). `WeightsFile` lets Keras write the file
once, recording which bytes of the file hold which variable; later saves copy that file and
overwrite those bytes with the current values, so every file keeps Keras's own layout (groups,
attributes, dtypes), and `Model.load_weights` reads it as it reads Keras's. A file this object wrote
under the current layout is rewritten in place, with no copy: on the zoo's wide model (a 3.2M-weight
embedding with Adam, a 39 MB file) a save took 49 ms with the copy and byte strings, 10 ms in place
from the arrays' own buffers.
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import Optional


KEPT_FILES = 4
"""Files a `WeightsFile` remembers having written, newest last: `StepBackup` cycles through three."""


class WeightsFile:
    """Saves `model`'s weights (and its optimizer's state) in Keras's `.weights.h5` format.

    The first `save` (and any save after the model's variables changed in number) is Keras's own
    (`keras.src.saving.saving_lib`'s walk, as `Model.save_weights`), recording the variable behind
    each dataset and where its bytes lie; later saves copy the previous file (`template`) and write
    each value over its dataset's bytes, or write them straight into `path` when it is a file this
    object wrote under the current layout that nothing else links to (`StepBackup` hands it the
    oldest of its files). A value Keras stores that is not a variable and not an optimizer's `variables[i]` (a layer
    that saves computed arrays) keeps every save Keras's own.

    Args:
        model: a built Keras model.

    Example:
        >>> weights = WeightsFile(model)
        >>> weights.save("a.weights.h5")                           # Keras's walk, recorded
        >>> weights.save("b.weights.h5", template="a.weights.h5")  # copy, values in place
        >>> weights.save("b.weights.h5", template="a.weights.h5")  # b is its own: values in place, no copy
    """

    def __init__(self, model):
        self.model = model
        self.layout: Optional[list] = None  # (byte offset, shape, dtype, variable) per dataset, once recorded
        self._signature: Optional[tuple] = None
        self._files: list = []  # (device, inode, size) of the last files written under the current layout

    def save(self, path: str, template: Optional[str] = None) -> None:
        """Writes the weights to `path`: in place when it is a file this object wrote under the current
        layout that no other name links to, else as a new file (a file already there is unlinked first,
        so another name that links to it keeps its content).

        Args:
            path: the `.weights.h5` file to write.
            template: a file this object wrote before for the same model (same layout), or None.

        Raises:
            OSError: when the file cannot be written (a full disk, a missing directory).
            ValueError: what `Model.save_weights` raises (an unbuilt model).
        """
        own = self._own(path)
        if not own and os.path.lexists(path):
            os.remove(path)  # another name may link to it: write a new file, never over that one
        if template is None or self.layout is None or self._signature != self._variables_signature():
            self._record(path)
            return
        if not own:
            shutil.copyfile(template, path)
        if not self._write_values(path):
            self._record(path)
            return
        self._remember(path)

    def _remember(self, path: str) -> None:
        """Notes `path` as written under the current layout (the last `KEPT_FILES` of them)."""
        self._files = [*(f for f in self._files if f != _identity(path)), _identity(path)][-KEPT_FILES:]

    def _own(self, path: str) -> bool:
        """Whether `path` is a file this object wrote under the current layout, linked from nowhere else."""
        try:
            return _identity(path) in self._files and os.stat(path).st_nlink == 1
        except FileNotFoundError:
            return False

    def _variables_signature(self) -> tuple:
        optimizer = getattr(self.model, "optimizer", None)
        return len(self.model.weights), len(getattr(optimizer, "variables", None) or ())

    def _write_values(self, path: str) -> bool:
        """Overwrites each recorded dataset's bytes in `path` with its variable's value; False when a
        shape or dtype no longer matches (the caller writes the file Keras's way)."""
        import numpy as np

        with open(path, "r+b") as file:
            for offset, shape, dtype, variable in self.layout:
                value = np.asarray(variable.numpy())
                if value.shape != shape or value.dtype != dtype:  # the dtype and shape Keras's save wrote
                    return False
                file.seek(offset)
                file.write(np.ascontiguousarray(value).reshape(-1).view(np.uint8))  # its own buffer, no copy
        return True

    def _record(self, path: str) -> None:
        """Keras's save, through a store that notes the variable behind each dataset."""
        from keras.src.saving import saving_lib

        if not self.model.built:  # as Model.save_weights
            raise ValueError("You are saving a model that has not yet been built. Try building the model first "
                             "by calling it on some data or by using `build()`.")
        store = _recording_store_class()(self.model, path, mode="w")
        try:
            saving_lib._save_state(self.model, weights_store=store, assets_store=None, inner_path="",
                                   visited_saveables=set())
        finally:
            store.close()
        self.layout = _byte_layout(path, store.layout) if store.complete else None
        self._signature = self._variables_signature()
        self._files = [_identity(path)] if self.layout is not None else []


def _identity(path: str) -> tuple:
    """`(device, inode, size)` of the file at `path`."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size


def _byte_layout(path: str, datasets: list) -> Optional[list]:
    """`(byte offset, shape, dtype, variable)` of each dataset in the file Keras wrote, or None when the
    file holds a dataset the record lacks (a Keras whose stores write through another object) or one
    not stored as one contiguous run of its value's raw bytes (chunked, filtered, compact, another
    byte order or item size). HDF5 keeps a contiguous dataset's raw data unchecksummed at a fixed
    offset (checksums need chunking), so a value of the same shape and dtype can be written over it.
    Keras stores bfloat16 as 2-byte opaque data marked `dtype: bfloat16`: the same bytes. Empty
    datasets hold no bytes and are left out."""
    import h5py
    import numpy as np

    layout, names = [], []
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
        if len(names) != len(datasets):
            return None
        for name, variable in datasets:
            dataset, value = file[name], np.asarray(variable.numpy())
            if value.size == 0 and dataset.size == 0:
                continue
            same_bytes = dataset.dtype == value.dtype or (
                dataset.attrs.get("dtype") == "bfloat16" and dataset.dtype.itemsize == value.dtype.itemsize == 2)
            offset = dataset.id.get_offset()
            if offset is None or dataset.chunks is not None or dataset.compression is not None \
                    or dataset.dtype.byteorder == ">" or dataset.shape != value.shape or not same_bytes:
                return None
            layout.append((offset, value.shape, value.dtype, variable))
    return layout


@functools.lru_cache(maxsize=None)
def _recording_store_class():
    """`H5IOStore` with a record of the variable behind each dataset it writes (built on first use:
    Keras is imported only then)."""
    import numpy as np
    from keras.src.saving import saving_lib

    class RecordingStore(saving_lib.H5IOStore):
        def __init__(self, model, path, mode):
            super().__init__(path, mode=mode)
            self.model, self.layout, self.complete, self._path = model, [], True, ""

        def make(self, path, metadata=None):
            self._path = path
            return super().make(path, metadata=metadata)

        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            variable = value if hasattr(value, "assign") and hasattr(value, "numpy") else self._owned(key, value)
            if variable is None:
                self.complete = False
            else:
                self.layout.append((f"{self._h5_entry_group.name}/{key}", variable))

        def _owned(self, key, value):
            """The variable `value` was read from, for a Keras optimizer (its `save_own_variables` stores
            `variables[i].numpy()` under `str(i)`) whose `variables[i]` holds those bytes now; else None."""
            import keras

            owner = self.model
            for part in filter(None, self._path.split("/")):
                owner = getattr(owner, part, None)
            saves = getattr(type(owner), "save_own_variables", None)
            variables = list(owner.variables) if saves is keras.optimizers.Optimizer.save_own_variables else []
            index = int(key) if str(key).isdigit() else -1
            if not 0 <= index < len(variables):
                return None
            current = np.asarray(variables[index].numpy())
            value = np.asarray(value)
            same = current.shape == value.shape and current.dtype == value.dtype and current.tobytes() == value.tobytes()
            return variables[index] if same else None

    return RecordingStore


