"""XLA's persistent compilation cache: a run that compiles a step XLA compiled before loads it from disk.

TensorFlow keeps XLA's executables in the directory `--tf_xla_persistent_cache_directory` in
`TF_XLA_FLAGS` names (read when its runtime starts); tftrain turns it on beside its execution
memory, so a rerun whose choice is XLA skips the compile (not the tracing). The directory is keyed
by `cache_key()`, so a cache shared by different machines never hands one an executable built for
another's CPU or GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

FLAG = "--tf_xla_persistent_cache_directory"
"""The `TF_XLA_FLAGS` flag naming the cache directory."""

MAX_BYTES = 512 * 2**20
"""The cache's size in bytes after pruning, oldest files first."""


def cache_key() -> str:
    """A hash of what an executable depends on (TensorFlow's version, CPU model and flags, NVIDIA GPUs
    and driver), read without starting TensorFlow's runtime."""
    import tensorflow as tf

    from tftrain.host import cpu_flags, cpu_model, nvidia_hardware

    gpus = nvidia_hardware()
    facts = json.dumps([tf.__version__, cpu_model(), sorted(cpu_flags()[0]),
                        [g.get("name") for g in gpus.get("gpus", [])], gpus.get("driver")])
    return hashlib.sha256(facts.encode()).hexdigest()[:16]


def prune(directory: Path, max_bytes: int = MAX_BYTES) -> int:
    """Deletes the oldest files (by modification time) until `directory` holds at most `max_bytes`;
    returns the bytes deleted. Files another process removes meanwhile are skipped."""
    files = []
    for path in directory.glob("*"):
        try:
            stat = path.stat()
        except OSError:
            continue
        files.append((stat.st_mtime, stat.st_size, path))
    total, freed = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files):
        if total - freed <= max_bytes:
            break
        try:
            path.unlink()
            freed += size
        except OSError:
            continue
    return freed


def enable(directory: Optional[Path] = None, env: Optional[dict] = None) -> Optional[Path]:
    """Points XLA's persistent compilation cache at `directory`, before TensorFlow's runtime starts.

    Args:
        directory: Defaults to `<tftrain cache>/xla/<cache_key()>`.
        env: where to set `TF_XLA_FLAGS`. Defaults to `os.environ`.

    Returns:
        The directory in use, or None when `TF_XLA_FLAGS` already names one (kept), the runtime
        already started, or the directory cannot be created.
    """
    env = os.environ if env is None else env
    flags = env.get("TF_XLA_FLAGS", "")
    if FLAG in flags:
        return None
    from tftrain.runtime.devices import runtime_started

    if env is os.environ and runtime_started():
        return None
    try:
        if directory is None:
            from tftrain.runtime.execution_memory import cache_dir

            directory = cache_dir() / "xla" / cache_key()
        directory.mkdir(parents=True, exist_ok=True)
        prune(directory)
    except Exception:  # noqa: BLE001 (no cache is only slower: an unwritable folder, an unreadable fact)
        return None
    env["TF_XLA_FLAGS"] = f'{flags} {FLAG}="{directory}"'.strip()  # quoted: TensorFlow splits the flags on spaces
    return directory
