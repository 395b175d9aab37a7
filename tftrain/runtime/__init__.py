"""Runtime set-up: threads -> devices -> precision -> strategy -> malloc, in that order.

Each step is usable on its own from any Keras script (`set_threads`,
`configure_devices`, `set_precision`, `make_strategy`, `compile_options`);
`setup` runs them in the only order TensorFlow accepts, because thread counts and
logical devices must be fixed before its runtime initialises. Multi-process
strategies also read the cluster first (`resolve_cluster`: TF_CONFIG or SLURM),
and nothing before the strategy starts the runtime, because
`MultiWorkerMirroredStrategy` configures collective ops as it starts it. The
worker and ps tasks of a parameter-server job do not call `setup`: they `serve`.

`KerasMultiWorkerMirroredStrategy` stands in for
`tf.distribute.MultiWorkerMirroredStrategy()` in any Keras 3 script whose
`model.fit` fails under the plain strategy (keras-team/keras#20585), and
`KerasMirroredStrategy` for `tf.distribute.MirroredStrategy()` where the data
holds strings.
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
"""Name -> module of this package. Names load on first use, so reading the cluster
(`tftrain.runtime.cluster`, no TensorFlow) does not start TensorFlow."""

__all__ = [
    # What a user's own script needs; the other names of _EXPORTS stay importable from
    # here for tftrain's own modules and tests.
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
