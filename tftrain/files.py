"""Writing files whole: through a temporary file and a rename, and on request flushed to disk."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

TEMPORARY = re.compile(r"\.tmp-\d+-.+")
"""The names of `replaced`'s temporary files (`.tmp-<pid>-<name>`), which a kill can leave behind."""


@contextlib.contextmanager
def replaced(path, durable: bool = False):
    """While open, yields the temporary path to write `path`'s new content to: `.tmp-<pid>-<name>` beside it
    (the same ending: Keras and NumPy read the format from it). On a clean exit it is renamed to `path`, so a
    kill or a full disk never leaves a half-written `path`; on an error it is removed. With `durable`, the
    file is flushed to disk (`fsync`) before the rename and the folder after it, so that a machine crash
    leaves the old content or the new, never an empty file. Defaults to False."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        _close_hdf5(tmp)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dir(path.parent)


def _close_hdf5(path) -> None:
    """Closes HDF5 files h5py still holds open on `path`: Keras's `save_weights` closes its file only when the
    write succeeds, and h5py closing it at exit, on a full disk, crashed the process (exit 139)."""
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return
    target = os.path.abspath(path)
    for fid in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        if os.path.abspath(os.fsdecode(fid.name)) == target:
            try:
                h5py.File(fid).close()
            except Exception:  # noqa: BLE001 (a full disk fails the flush; the file is closed all the same)
                pass


def write_text_atomic(path, text: str, durable: bool = False) -> None:
    """Writes `text` to `path` whole (UTF-8, through `replaced`); `durable` as `replaced` takes it."""
    with replaced(path, durable) as tmp:
        tmp.write_text(text, encoding="utf-8")


def fsync_file(path) -> None:
    """Flushes `path`'s content to disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(folder) -> None:
    """Flushes `folder`'s entries (a rename in it) to disk; nothing where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_temporaries(path: Path) -> None:
    """Removes the temporary files of writes a kill cut short (`TEMPORARY`, and earlier versions'
    `.<name>.tmp-<pid>`) in the run directory `path` and its `checkpoints/`, and TensorFlow's `<name>_temp`
    folders of checkpoint writes in `checkpoints/last` and `checkpoints/best`."""
    import shutil

    earlier = re.compile(r"\..+\.tmp-\d+")  # only tftrain's own names
    for folder in (path, path / "checkpoints"):
        for stale in folder.glob(".*"):
            if (TEMPORARY.fullmatch(stale.name) or earlier.fullmatch(stale.name)) and stale.is_file():
                stale.unlink(missing_ok=True)
    for stale in (*path.glob("checkpoints/last/*_temp"), *path.glob("checkpoints/best/*_temp")):
        shutil.rmtree(stale, ignore_errors=True)
