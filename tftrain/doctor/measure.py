"""Short, bounded measurements of this machine: matmul FLOP/s, memory and disk bandwidth, copies (bytes/s).
Each runs fixed work and keeps the best repeat (a disturbance on a shared machine slows one repeat, not all)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

MAX_REPEATS = 200
"""Cap on the timed calls of one measurement, however short each call is."""


def timed_rates(fn: Callable[[], object], work: float, repeats: int, min_seconds: float = 0.0) -> list:
    """Rates (`work / seconds`) of `fn()`, timed at least `repeats` times and `min_seconds` (at most `MAX_REPEATS`)."""
    rates, spent = [], 0.0
    while len(rates) < repeats or (spent < min_seconds and len(rates) < MAX_REPEATS):
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        spent += seconds
        rates.append(work / seconds)
    return rates


def matmul_peak(sizes: Sequence[int], repeats: int, dtype: str = "float32", device: Optional[str] = None,
                min_seconds: float = 0.0) -> dict:
    """Measures n x n matmul FLOP/s (2 n^3 FLOPs per call) for each n in `sizes`.

    Args:
        dtype: TensorFlow dtype name. Defaults to `"float32"`.
        device: e.g. `"/GPU:0"`. Defaults to None (TensorFlow's placement).
        min_seconds: see `timed_rates`. Defaults to 0.

    Returns:
        `{"best_flops": float, "by_size": {n: [FLOP/s per call]}, "dtype": dtype}`.
    """
    import contextlib

    import tensorflow as tf

    def product(x, y):
        return tf.reduce_sum(tf.matmul(x, y))

    by_size = {}
    with tf.device(device) if device else contextlib.nullcontext():
        for n in sizes:
            a = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
            b = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
            matmul = tf.function(product, autograph=False)
            matmul(a, b).numpy()  # trace and warm up
            by_size[n] = timed_rates(lambda: matmul(a, b).numpy(), 2 * n**3, repeats, min_seconds)
    return {"best_flops": max(max(v) for v in by_size.values()), "by_size": by_size, "dtype": dtype}


def memory_bandwidth(nbytes: int, repeats: int, threads: int = 1, min_seconds: float = 0.0) -> dict:
    """Main-memory bandwidth of a STREAM "Copy" of `nbytes` (2 x nbytes moved; use sizes well above the caches),
    split over `threads` (default 1). Source: McCalpin, https://www.cs.virginia.edu/stream/

    Returns:
        `{"bytes_per_s": float, "array_bytes": int, "threads": int}`.
    """
    import numpy as np

    src = np.ones(max(1, nbytes // 8))
    dst = np.zeros_like(src)  # touch every page before timing
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in np.array_split(np.arange(src.size), threads) if c.size]
    with ThreadPoolExecutor(len(bounds)) as pool:
        def copy():
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))

        rates = timed_rates(copy, 2 * src.nbytes, repeats, min_seconds)
    return {"bytes_per_s": max(rates), "array_bytes": int(src.nbytes), "threads": len(bounds)}


def _files_largest_first(path: Path) -> list:
    """`[(size, file), ...]` of a folder's regular files (or of one file), largest first."""
    found = []
    for file in [path] if path.is_file() else (Path(root) / name for root, _, names in os.walk(path) for name in names):
        try:
            if file.is_file() and not file.is_symlink():
                found.append((file.stat().st_size, file))
        except OSError:
            continue
    return sorted(found, key=lambda t: -t[0])


def _read_cold(path: Path, limit: int, buffer: memoryview) -> tuple:
    """Reads up to `limit` bytes after dropping the file's cached pages: (bytes, seconds, dropped)."""
    with open(path, "rb", buffering=0) as f:
        dropped = hasattr(os, "posix_fadvise")
        if dropped:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        done, start = 0, time.perf_counter()
        while done < limit:
            n = f.readinto(buffer[:min(len(buffer), limit - done)])
            if not n:
                break
            done += n
        return done, time.perf_counter() - start, dropped


def _read_round(files: list, max_bytes: int, buffer: memoryview) -> tuple:
    total, seconds, count, dropped = 0, 0.0, 0, True
    for _, file in files:
        if total >= max_bytes:
            break
        try:
            n, s, d = _read_cold(file, max_bytes - total, buffer)
        except OSError:
            continue
        total, seconds, count, dropped = total + n, seconds + s, count + 1, dropped and d
    return total, seconds, count, dropped and count > 0


def disk_read(path, max_bytes: int, repeats: int = 1, chunk_bytes: int = 8 << 20) -> dict:
    """Cold read throughput of the disk holding `path` (folder or file): the fastest of `repeats` (default 1)
    rounds of up to `max_bytes`, largest files first, each file's cached pages dropped first (`posix_fadvise`).

    Returns:
        `{"bytes_per_s", "bytes", "files", "folder_bytes", "cache_dropped"}`; `bytes_per_s` None if nothing read.
    """
    files = _files_largest_first(Path(path))
    buffer = memoryview(bytearray(max(1, min(chunk_bytes, max_bytes))))
    rounds = [_read_round(files, max_bytes, buffer) for _ in range(repeats)]
    total, seconds, count, dropped = min(rounds, key=lambda r: r[1])
    return {"bytes_per_s": total / seconds if total and seconds > 0 else None, "bytes": total, "files": count,
            "folder_bytes": sum(size for size, _ in files), "cache_dropped": dropped}


def gpu_copies(device: str, nbytes: int, repeats: int) -> dict:
    """One GPU's copy bandwidth from pageable memory (`tf.data`'s path): `{"h2d_bytes_per_s", "d2h_bytes_per_s",
    "bytes"}`."""
    import tensorflow as tf

    with tf.device("/CPU:0"):
        host = tf.ones([nbytes // 4], tf.float32)
    with tf.device(device):
        on_gpu = tf.ones([nbytes // 4], tf.float32)

    def to_device():
        with tf.device(device):
            return tf.identity(host)[:1].numpy()

    def to_host():
        return on_gpu.numpy()

    out = {"bytes": (nbytes // 4) * 4}
    for key, copy in (("h2d_bytes_per_s", to_device), ("d2h_bytes_per_s", to_host)):
        copy()  # warm up
        out[key] = max(timed_rates(copy, out["bytes"], repeats))
    return out


def gpu_allreduce(devices: Sequence[str], nbytes: int, repeats: int) -> dict:
    """All-reduce bandwidth of `nbytes` per GPU between two or more local GPUs (MirroredStrategy).

    Bus bandwidth = bytes / time x 2(N-1)/N, comparable with the link's peak (NVIDIA/nccl-tests doc/PERFORMANCE.md).

    Returns:
        `{"bus_bytes_per_s", "algorithm_bytes_per_s", "bytes", "gpus", "median_s"}`.
    """
    import statistics

    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(list(devices))
    n = len(devices)

    def replica_step():
        summed = tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([nbytes // 4], tf.float32))
        return summed[:1]

    @tf.function(autograph=False)
    def step():
        return strategy.experimental_local_results(strategy.run(replica_step))

    def run_once():
        return [t.numpy() for t in step()]  # waits for every GPU

    run_once()  # trace, set up the communicators
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    size = (nbytes // 4) * 4
    return {"bus_bytes_per_s": size / median * 2 * (n - 1) / n, "algorithm_bytes_per_s": size / median,
            "bytes": size, "gpus": n, "median_s": median}
