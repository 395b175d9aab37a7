"""glibc malloc thresholds: keep freed step buffers in the heap instead of returning them to the OS.

TensorFlow's `GeneratorDataset` op (Keras's `fit` under `MirroredStrategy`, `OneDeviceStrategy` and
`MultiWorkerMirroredStrategy`; `Dataset.from_generator`) sets `mallopt(M_TRIM_THRESHOLD, 128 KiB)` on its first
run, which freezes glibc's dynamic mmap threshold: each step's buffers then go back to the OS and fault in again.
Source: glibc's mallopt(3).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys

from tftrain.errors import check_int

M_TRIM_THRESHOLD = -1
"""glibc's `mallopt` parameter number for the trim threshold (malloc.h)."""

M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter number for the mmap threshold (malloc.h)."""

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""32 MiB: glibc's ceiling for its dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""

TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""64 MiB: twice the mmap threshold, the ratio glibc's dynamic rule keeps."""

USER_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")
"""The opt-out: when one is set (or a `glibc.malloc.` tunable in `GLIBC_TUNABLES`), malloc is left alone."""


@dataclasses.dataclass(frozen=True)
class MallocSettings:
    """What `restore_malloc_thresholds` did: thresholds in bytes (0 if not set), or why not."""

    applied: bool
    mmap_threshold_bytes: int = 0
    trim_threshold_bytes: int = 0
    reason: str = ""

    def describe(self) -> str:
        """One line for the run's header."""
        if not self.applied:
            return f"malloc thresholds unchanged ({self.reason})"
        return (f"freed buffers kept for reuse (glibc malloc thresholds {self.mmap_threshold_bytes / 2**20:.0f} MiB / "
                f"{self.trim_threshold_bytes / 2**20:.0f} MiB)")


def _user_malloc_setting() -> str:
    """The first malloc setting the user made in the environment, or ""."""
    for name in USER_MALLOC_SETTINGS:
        if name in os.environ:
            return name
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return ""


def _glibc():
    """`(libc, "")` when glibc is the process's allocator, else `(None, why not)`."""
    if not sys.platform.startswith("linux"):
        return None, f"no glibc on {sys.platform}"
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        version = None
    if not version:
        return None, "the C library is not glibc"
    try:
        libc = ctypes.CDLL("libc.so.6")
        process = ctypes.CDLL(None)
    except OSError as e:
        return None, f"cannot load glibc ({e})"
    # A preloaded allocator (jemalloc, tcmalloc) ignores mallopt.
    if ctypes.cast(process.malloc, ctypes.c_void_p).value != ctypes.cast(libc.malloc, ctypes.c_void_p).value:
        return None, "another allocator is preloaded in front of glibc"
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc, ""


def _apply_tensorflow_patch_now() -> None:
    """Runs a one-element `GeneratorDataset`, so TensorFlow's one-time malloc patch happens now."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_generator(lambda: iter((0,)), output_signature=tf.TensorSpec((), tf.int32))
    for _ in dataset:
        pass


def restore_malloc_thresholds(
    mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES,
    trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES,
) -> MallocSettings:
    """Lets glibc malloc reuse freed training buffers: triggers TensorFlow's patch now, then sets the thresholds.

    Starts TensorFlow's runtime: call it after threads, devices and any `MultiWorkerMirroredStrategy` are set up.

    Args:
        mmap_threshold_bytes: allocations from this size on are mmapped. Defaults to 32 MiB.
        trim_threshold_bytes: free bytes each heap keeps (the cost). Defaults to 64 MiB.

    Returns:
        A `MallocSettings`; not applied without glibc or if the user tuned malloc (`USER_MALLOC_SETTINGS`).

    Raises:
        ValueError: when a threshold is not a positive integer below 2**31.
    """
    for name, value in (("mmap_threshold_bytes", mmap_threshold_bytes),
                        ("trim_threshold_bytes", trim_threshold_bytes)):
        check_int(value, name, maximum=2**31 - 1)
    user_setting = _user_malloc_setting()
    if user_setting:
        return MallocSettings(False, reason=f"{user_setting} is set: malloc keeps the user's settings")
    libc, reason = _glibc()
    if libc is None:
        return MallocSettings(False, reason=reason)
    _apply_tensorflow_patch_now()
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes) == 1
    trim_ok = libc.mallopt(M_TRIM_THRESHOLD, trim_threshold_bytes) == 1
    if not (mmap_ok and trim_ok):
        failed = " and ".join(n for n, ok in (("M_MMAP_THRESHOLD", mmap_ok), ("M_TRIM_THRESHOLD", trim_ok)) if not ok)
        return MallocSettings(False, mmap_threshold_bytes if mmap_ok else 0, trim_threshold_bytes if trim_ok else 0,
                              reason=f"glibc refused mallopt({failed}); TensorFlow's 128 KiB trim patch may be in force")
    return MallocSettings(True, mmap_threshold_bytes, trim_threshold_bytes)
