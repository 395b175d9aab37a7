"""XLA's persistent compilation cache: a run that compiles a step XLA compiled before loads it from disk.

TensorFlow can keep the executables XLA compiles for `jit_compile=True` functions in a
directory (`--tf_xla_persistent_cache_directory` in `TF_XLA_FLAGS`, read when TensorFlow's
runtime starts), keyed by the compiled program's fingerprint. tftrain turns it on next to its
execution memory, so that the rerun of a model whose remembered choice is XLA (and the XLA
candidate timed on a later run) skips XLA's compile: measured on a 784-512-256-10 MLP at batch
256 on a 2-core CPU, the XLA step's first call took 2.7 s, and 1.7 s with the cache (the rest
is tracing and graph optimisation, which every run pays).

The directory is `<tftrain cache>/xla/<key>`, the key a hash of the TensorFlow version, the CPU
model and its feature flags and the NVIDIA GPUs' names and driver, so that a cache in a home
directory shared by machines of different CPUs or GPUs never hands one an executable built for
another's instructions. Its files are pruned, oldest first, to `MAX_BYTES`.
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
"""The cache's size in bytes after pruning (a small model's executable is about 1 MB)."""


def cache_key() -> str:
    """A hash of what an executable depends on: TensorFlow's version, the CPU model and its flags, and
    the NVIDIA GPUs' names and driver (read without starting TensorFlow)."""
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
        directory: the cache directory. Defaults to None
            (`<tftrain cache>/xla/<cache_key()>`).
        env: the environment to set `TF_XLA_FLAGS` in. Defaults to None
            (`os.environ`, which TensorFlow reads when its runtime starts).

    Returns:
        The directory in use, or None: when `TF_XLA_FLAGS` already names one (the
        user's, kept), the runtime already started (too late to take effect), or the
        directory cannot be created.
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
