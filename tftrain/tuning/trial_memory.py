"""Memory a batch-size trial uses (RAM on a CPU, the allocator's peak on a GPU) and its budget."""

from __future__ import annotations

import threading
from typing import Optional

import tensorflow as tf

from tftrain.errors import ConfigError

DEFAULT_CPU_BUDGET_FRACTION = 0.5
"""Default CPU memory budget: this fraction of the memory available at the start."""


def available_memory_bytes() -> int:
    """Memory available to new allocations on this machine, in bytes."""
    import psutil

    return int(psutil.virtual_memory().available)


def default_memory_budget(fraction: float = DEFAULT_CPU_BUDGET_FRACTION) -> int:
    """The default CPU budget: `fraction` of the available memory, in bytes."""
    return int(available_memory_bytes() * fraction)


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _read_vm_hwm() -> Optional[int]:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_vm_hwm() -> bool:
    """Resets Linux's peak-RSS counter (VmHWM) to the current RSS; False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return _read_vm_hwm() is not None
    except OSError:
        return False


class PeakMemory:
    """Peak memory of a trial above a fixed baseline, in bytes.

    CPU: peak RSS, from Linux's VmHWM counter (reset per trial), else sampled every
    5 ms. GPU: TensorFlow's allocator peak, reset per trial.
    """

    def __init__(self, device_kind: str):
        self.kind = device_kind
        self.gpus = [d.name for d in tf.config.list_logical_devices("GPU")] if device_kind == "gpu" else []
        self.baseline = _rss() if device_kind == "cpu" else 0
        self._peak = 0
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.kind == "gpu":
            for name in self.gpus:
                tf.config.experimental.reset_memory_stats(name)
        elif not _reset_vm_hwm():
            self._peak = _rss()
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self._peak = max(self._peak, _rss())

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return False

    @property
    def used(self) -> Optional[int]:
        """Bytes used above the baseline at the peak of the last trial."""
        if self.kind == "gpu":
            peaks = [tf.config.experimental.get_memory_info(name)["peak"] for name in self.gpus]
            return int(max(peaks)) if peaks else None
        peak = _read_vm_hwm() if self._peak == 0 else self._peak
        return None if peak is None else max(0, int(peak) - self.baseline)


def memory_budget_bytes(memory_budget, device_kind: str) -> Optional[int]:
    """The budget in bytes: "auto" is half the free memory on a CPU, None (OOM errors only) on a GPU.

    Raises ConfigError on anything but "auto", None or a positive int.
    """
    if memory_budget == "auto":
        return default_memory_budget() if device_kind == "cpu" else None
    if memory_budget is None or (isinstance(memory_budget, int) and not isinstance(memory_budget, bool)
                                 and memory_budget > 0):
        return memory_budget
    raise ConfigError(
        f"memory_budget must be 'auto', None or a positive number of bytes. Received: memory_budget={memory_budget!r}."
    )
