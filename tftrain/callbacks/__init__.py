"""Callbacks for any Keras 3 `model.fit`, with or without a strategy; names are imported on first use. Each only
wires Keras hooks; the algorithms are plain code tested alone (`tftrain.metering`, `StepWindow`, `tftrain.tuning`)."""

__all__ = ["BatchSizeFinder", "ChanceWatch", "EpochTensorBoard", "KeepBest", "NanGuard", "NvtxSteps", "PreemptionWatch", "ProfileSteps", "ProfilerServer",
           "ProfilerWindow", "ResumableEarlyStopping", "ScalarLogs", "StepBackup", "ThroughputMonitor", "start_profiler_server"]

_LAZY = {
    "BatchSizeFinder": "tftrain.tuning.finder",  # lives with the search it runs (the tuning layer)
    "ChanceWatch": "tftrain.callbacks.chance",
    "EpochTensorBoard": "tftrain.callbacks.tensorboard",
    "KeepBest": "tftrain.callbacks.keep_best",
    "NanGuard": "tftrain.callbacks.nan_guard",
    "NvtxSteps": "tftrain.callbacks.nvtx",
    "PreemptionWatch": "tftrain.callbacks.preemption",
    "StepBackup": "tftrain.callbacks.backup",
    "ProfileSteps": "tftrain.callbacks.profile_steps",
    "ProfilerServer": "tftrain.callbacks.profiler",
    "ProfilerWindow": "tftrain.callbacks.profiler",
    "ResumableEarlyStopping": "tftrain.callbacks.early_stopping",
    "ScalarLogs": "tftrain.callbacks.scalar_logs",
    "start_profiler_server": "tftrain.callbacks.profiler",
    "ThroughputMonitor": "tftrain.callbacks.throughput",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tftrain.callbacks' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
