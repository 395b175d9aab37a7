"""glibc malloc thresholds: keep freed step buffers in the heap instead of the OS.

TensorFlow's `GeneratorDataset` op, the first time it runs in a process, calls
`mallopt(M_TRIM_THRESHOLD, 128 KiB)` (it logs "Memory patch applied:
M_TRIM_THRESHOLD=128 kb was set"). Any explicit `mallopt` also freezes glibc's
dynamic mmap threshold at the value it had reached. From then on freed memory
beyond 128 KiB at the top of a heap goes back to the OS, so each training step's
activation and gradient buffers fault their pages in again. Keras feeds `fit`
under `MirroredStrategy`, `OneDeviceStrategy` and `MultiWorkerMirroredStrategy`
through a multi-device iterator built on `GeneratorDataset`, so their first
`fit` sets the patch (the default strategy never does); a user's
`tf.data.Dataset.from_generator` does too.

Measured on this project's 2-core CPU (MNIST MLP, batch 512, graph): under a
one-device `MirroredStrategy` 13,800 examples/sec with 1.45 million minor page
faults per run, and 24,300 examples/sec with 0.18 million after
`restore_malloc_thresholds` (the default strategy, which never sets the patch:
about 27,000). See glibc's mallopt(3) for the thresholds.
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
"""Allocations below this many bytes come from the heap: glibc's ceiling for its own
dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX), 32 MiB."""

TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""Free bytes at the top of a heap kept before returning them to the OS, 64 MiB:
twice the mmap threshold, the ratio glibc's dynamic rule keeps."""

USER_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")
"""Environment variables by which a user tunes glibc malloc; when one is set (or
`GLIBC_TUNABLES` names a `glibc.malloc.` tunable), `restore_malloc_thresholds`
leaves malloc alone. Setting one is also the way to opt out."""


@dataclasses.dataclass(frozen=True)
class MallocSettings:
    """What `restore_malloc_thresholds` did.

    Attributes:
        applied: True when both thresholds were set.
        mmap_threshold_bytes: the mmap threshold set, in bytes (0 if not set).
        trim_threshold_bytes: the trim threshold set, in bytes (0 if not set).
        reason: why it was not applied ("" when applied).
    """

    applied: bool
    mmap_threshold_bytes: int = 0
    trim_threshold_bytes: int = 0
    reason: str = ""

    def describe(self) -> str:
        """One line for the run's header.

        Returns:
            E.g. "freed buffers kept for reuse (glibc malloc thresholds 32 MiB / 64 MiB)", or "malloc
            thresholds unchanged (<reason>)".
        """
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
    """`(libc, reason)`: glibc when it is the process's allocator, else `(None, why not)`."""
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
    # An allocator preloaded in front of glibc (jemalloc, tcmalloc) serves malloc itself;
    # glibc's mallopt would then change nothing that is used.
    if ctypes.cast(process.malloc, ctypes.c_void_p).value != ctypes.cast(libc.malloc, ctypes.c_void_p).value:
        return None, "another allocator is preloaded in front of glibc"
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc, ""


def _apply_tensorflow_patch_now() -> None:
    """Runs a one-element `GeneratorDataset`, so TensorFlow applies its malloc patch now,
    once per process, rather than at the first step of the next `fit`."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_generator(lambda: iter((0,)), output_signature=tf.TensorSpec((), tf.int32))
    for _ in dataset:
        pass


def restore_malloc_thresholds(
    mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES,
    trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES,
) -> MallocSettings:
    """Lets glibc malloc reuse freed training buffers instead of re-mapping them.

    Runs TensorFlow's one-time `GeneratorDataset` malloc patch now (see the module
    docstring), then sets glibc's mmap and trim thresholds to the values its own
    dynamic rule reaches for large buffers. A later `GeneratorDataset` does not
    reapply the patch. It runs a tiny `tf.data` dataset, so it starts
    TensorFlow's runtime: call it after `set_threads`, `configure_devices` and
    `split_cpu`, and after building a `MultiWorkerMirroredStrategy` (which must
    configure collective ops before the runtime starts). `tftrain.runtime.setup`
    calls it right after building a `mirrored`, `one_device` or
    `multi_worker_mirrored` strategy, the ones whose `fit` input sets the patch.

    The cost: allocations under the mmap threshold now come from malloc's heaps,
    which keep up to `trim_threshold_bytes` of free memory at the top of each
    heap, and free blocks below memory still in use, rather than returning them
    to the OS; for a training loop that reuses the same buffer sizes every step
    this is the memory the next step needs anyway.

    Args:
        mmap_threshold_bytes: allocations of at least this many bytes are
            mmapped; > 0. Defaults to `MMAP_THRESHOLD_BYTES` (32 MiB).
        trim_threshold_bytes: free bytes at the top of a heap kept; > 0.
            Defaults to `TRIM_THRESHOLD_BYTES` (64 MiB).

    Returns:
        A `MallocSettings`. `applied` is False, with the reason, and nothing is
        changed, where the allocator is not glibc (macOS, Windows, musl, a
        preloaded jemalloc or tcmalloc) or where the user set one of
        `USER_MALLOC_SETTINGS` or a `glibc.malloc.` tunable in `GLIBC_TUNABLES`.

    Raises:
        ValueError: when a threshold is not a positive integer below 2**31.

    Example:
        >>> strategy = tf.distribute.MirroredStrategy()
        >>> print(restore_malloc_thresholds().describe())
        freed buffers kept for reuse (glibc malloc thresholds 32 MiB / 64 MiB)
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
