"""Writing files whole: through a temporary file and a rename, and on request flushed to disk."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path, text: str, durable: bool = False) -> None:
    """Writes `text` to `path` through a temporary file and a rename (no half-written files); with
    `durable`, the file is flushed to disk (`fsync`) before the rename and the folder after it, so that a
    machine crash leaves the old content or the new, never an empty file. Defaults to False."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no part file left beside `path`
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


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
