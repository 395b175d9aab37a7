"""The backup directory's checkpoints: numbered pairs, each committed by its metadata file.

Checkpoint N is `ckpt-N.weights.h5` (`Model.save_weights`) and `ckpt-N.json` (its position), each written
under a temporary name, fsynced and renamed, the metadata last; older ones are deleted after that and the
newest `KEEP` stay, so a kill or crash at any moment leaves a complete checkpoint (the scheme of
`tf.train.CheckpointManager`). Keras's own `BackupAndRestore` files read as the oldest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import List, Optional

from tftrain.files import write_text_atomic

KEEP = 2
"""Checkpoints kept: the newest and the one before it (the fallback when the newest cannot be read)."""

_NAME = re.compile(r"^ckpt-(\d+)\.(json|weights\.h5)$")
KERAS_WEIGHTS, KERAS_METADATA = "latest.weights.h5", "training_metadata.json"
"""The files of Keras's own `BackupAndRestore` (read as checkpoint -1)."""


@dataclasses.dataclass(frozen=True)
class BackupPosition:
    """Where a checkpoint stands in the run: `epoch`s completed, batches of the next epoch done
    (`steps_in_epoch`, 0 at an epoch end), `optimizer_iterations` (None from Keras's `BackupAndRestore`), and the
    run's `batch_size` and dtype policy (`precision`) it trained at, and the CRC-32 of its weights file (`crc32`:
    HDF5 checks none of its data) (None where not recorded)."""

    epoch: int
    steps_in_epoch: int = 0
    optimizer_iterations: Optional[int] = None
    batch_size: Optional[int] = None
    precision: Optional[str] = None
    crc32: Optional[int] = None

    def where(self) -> str:
        """`the end of epoch 2` or `epoch 3, batch 16`, with the optimizer step when known."""
        at = f"the end of epoch {self.epoch}" if not self.steps_in_epoch else \
            f"epoch {self.epoch + 1}, batch {self.steps_in_epoch}"
        return at + (f" (optimizer step {self.optimizer_iterations})" if self.optimizer_iterations is not None else "")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One committed checkpoint: its number (-1: Keras's own pair), weights file and position
    (None when its metadata cannot be read)."""

    number: int
    weights: Path
    metadata: Path
    position: Optional[BackupPosition]

    @property
    def name(self) -> str:
        return self.metadata.name


def crc32(path) -> int:
    """The CRC-32 of the file at `path` (zlib's), read in 16 MiB blocks."""
    import zlib

    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            crc = zlib.crc32(block, crc)
    return crc


def _metadata_crc(data: dict) -> int:
    """The CRC-32 of a checkpoint's metadata fields (its `"metadata_crc32"` aside), as `commit` writes them."""
    import zlib

    return zlib.crc32(json.dumps({k: v for k, v in data.items() if k != "metadata_crc32"}, sort_keys=True).encode())


def _position(meta: Path, numbered: bool = True) -> Optional[BackupPosition]:
    """The position `meta` holds; None when it cannot be read, a byte of it changed (`metadata_crc32`), or a
    numbered checkpoint's lacks the step count `commit` always writes."""
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
        if ("metadata_crc32" in data and data["metadata_crc32"] != _metadata_crc(data)) or \
                (numbered and "optimizer_iterations" not in data):
            return None
        precision, crc = data.get("precision"), data.get("crc32")
        return BackupPosition(int(data["epoch"]), int(data.get("steps_in_epoch", 0)),
                              data.get("optimizer_iterations"), data.get("batch_size"),
                              precision if isinstance(precision, str) else None, crc if isinstance(crc, int) else None)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def checkpoints(backup_dir) -> List[Checkpoint]:
    """The committed checkpoints in `backup_dir`, newest first (empty when there is none), and the weights whose
    metadata was lost (position None): all but the newest uncommitted one, which a kill before its commit leaves
    above every committed one."""
    folder = Path(backup_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    committed = _committed(names)
    uncommitted = sorted({int(m.group(1)) for m in map(_NAME.match, names) if m} - set(committed))
    lost = [n for n in uncommitted if n != uncommitted[-1] or n < max(committed, default=-1)]
    found = [Checkpoint(number, folder / f"ckpt-{number}.weights.h5", folder / f"ckpt-{number}.json",
                        _position(folder / f"ckpt-{number}.json")) for number in committed + lost]
    if KERAS_METADATA in names:
        meta = folder / KERAS_METADATA
        found.append(Checkpoint(-1, folder / KERAS_WEIGHTS, meta, _position(meta, numbered=False)))
    return sorted(found, key=lambda c: c.number, reverse=True)


def _committed(names) -> List[int]:
    """The numbers of the committed checkpoints among a folder's file `names` (those with a metadata file)."""
    return [int(m.group(1)) for m in map(_NAME.match, names) if m and m.group(2) == "json"]


def read_position(path) -> Optional[BackupPosition]:
    """The position of the newest readable checkpoint in backup directory `path` (its metadata read, its
    weights file opening as HDF5; a truncated one does not), or of metadata file `path`; None when there is none."""
    path = Path(path)
    if not path.is_dir():
        return _position(path, numbered=_NAME.match(path.name) is not None)
    return next((c.position for c in checkpoints(path) if c.position is not None and _whole(c)), None)


def diverged_note(backup_dir) -> str:
    """Where the last good checkpoint in `backup_dir` is, and what to do about a run whose loss diverged."""
    position = read_position(backup_dir)
    at = None if position is None else (f"end of epoch {position.epoch}" if not position.steps_in_epoch else
                                        f"epoch {position.epoch + 1}, batch {position.steps_in_epoch}")
    kept = ("no checkpoint was written before it" if at is None else
            f"the last good checkpoint ({at}) is kept in {backup_dir}")
    return f"{kept}. Lower --learning-rate (or check the data), then train into a new --run-dir."


def _whole(checkpoint: Checkpoint) -> bool:
    """Whether the weights file has the CRC-32 saved with it (where saved) and opens as an HDF5 file, without
    TensorFlow (the restore reads it whole later)."""
    import h5py

    weights = checkpoint.weights
    if not weights.is_file():  # Keras's own pair: its restore names it
        return checkpoint.number < 0
    try:
        if checkpoint.position.crc32 is not None and crc32(weights) != checkpoint.position.crc32:
            return False
        with h5py.File(weights, "r"):
            return True
    except Exception:  # noqa: BLE001 (h5py raises OSError or others on a damaged file)
        return False


def next_number(backup_dir) -> int:
    """The number the next checkpoint takes: one more than the newest numbered one (0 when none)."""
    return max((c.number for c in checkpoints(backup_dir)), default=-1) + 1


def weights_path(backup_dir, number: int) -> Path:
    """Where checkpoint `number`'s weights go (write them through `tftrain.files.replaced`, then `commit`)."""
    return Path(backup_dir) / f"ckpt-{number}.weights.h5"


def commit(backup_dir, number: int, position: BackupPosition) -> Checkpoint:
    """Commits checkpoint `number`, whose weights are written (`weights_path`, durably): writes its metadata durably,
    then deletes what no longer counts (`prune`)."""
    folder = Path(backup_dir)
    weights, meta = weights_path(folder, number), folder / f"ckpt-{number}.json"
    data = dataclasses.asdict(position)
    write_text_atomic(meta, json.dumps({**data, "metadata_crc32": _metadata_crc(data)}), durable=True)
    prune(folder, keep_from=number)
    return Checkpoint(number, weights, meta, position)


def prune(backup_dir, keep_from: int) -> None:
    """Deletes checkpoints older than the `KEEP` newest (counted down from `keep_from`), Keras's own pair
    once `KEEP` numbered ones exist, temporary files, and weights whose metadata was never written."""
    folder = Path(backup_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    kept = set(sorted((n for n in _committed(names) if n <= keep_from), reverse=True)[:KEEP])
    for name in names:
        match = _NAME.match(name)
        stale = (match is not None and int(match.group(1)) not in kept and int(match.group(1)) <= keep_from) \
            or name.endswith(".tmp.weights.h5") or (name.startswith(".") and ".tmp-" in name) \
            or (len(kept) >= KEEP and name in (KERAS_WEIGHTS, KERAS_METADATA))
        if stale:
            try:
                os.remove(folder / name)
            except OSError:
                pass
