"""Runtime set-up: threads -> devices -> precision -> strategy -> malloc, in that order.

Each step is usable on its own from any Keras script; `setup` runs them in the only
order TensorFlow accepts: thread counts and logical devices must be fixed before its
runtime starts, and multi-process strategies read the cluster (`resolve_cluster`)
and start the runtime themselves. Parameter-server worker and ps tasks `serve`
instead of calling `setup`.
"""

import importlib

_EXPORTS = {
    "MULTI_PROCESS_STRATEGIES": "cluster",
    "ClusterInfo": "cluster",
    "parse_slurm_step": "cluster",
    "parse_tf_config": "cluster",
    "resolve_cluster": "cluster",
    "slurm_cluster": "cluster",
    "DeviceInfo": "devices",
    "configure_devices": "devices",
    "runtime_started": "devices",
    "select_devices": "devices",
    "split_cpu": "devices",
    "ExecutionChoice": "execution",
    "ModelState": "execution_probe",
    "StepTiming": "execution",
    "choose_execution": "execution_probe",
    "compile_options": "execution",
    "time_training_steps": "execution_probe",
    "MallocSettings": "memory",
    "restore_malloc_thresholds": "memory",
    "PrecisionInfo": "precision",
    "current_precision": "precision",
    "ensure_float32_outputs": "precision",
    "precision_policy": "precision",
    "set_precision": "precision",
    "serve": "server",
    "start_server": "server",
    "telling_servers": "server",
    "KerasMirroredStrategy": "strategy",
    "KerasMultiWorkerMirroredStrategy": "strategy",
    "cluster_resolver": "strategy",
    "make_strategy": "strategy",
    "ThreadSettings": "threads",
    "set_threads": "threads",
    "GENERATOR_INPUT_STRATEGIES": "core",
    "Runtime": "core",
    "setup": "core",
}
"""Name -> module. Names load on first use, so reading the cluster does not import TensorFlow."""

__all__ = [
    # What a user's script needs; the rest of _EXPORTS stays importable for tftrain itself.
    "ExecutionChoice",
    "KerasMirroredStrategy",
    "KerasMultiWorkerMirroredStrategy",
    "ModelState",
    "Runtime",
    "choose_execution",
    "compile_options",
    "configure_devices",
    "ensure_float32_outputs",
    "make_strategy",
    "resolve_cluster",
    "restore_malloc_thresholds",
    "set_precision",
    "set_threads",
    "setup",
    "time_training_steps",
]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"tftrain.runtime.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tftrain.runtime' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
