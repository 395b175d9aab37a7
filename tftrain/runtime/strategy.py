"""Building `tf.distribute` strategies by name.

Source: https://www.tensorflow.org/guide/distributed_training
"""

from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from tftrain.config import COMMUNICATIONS, STRATEGIES, STRATEGY_ALIASES
from tftrain.errors import ConfigError
from tftrain.runtime.cluster import ClusterInfo, check_cluster
from tftrain.runtime.devices import DeviceInfo

_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


class _KerasReduce:
    """A `reduce` for the Mirrored strategies that Keras 3's `fit` can use (see
    `KerasMultiWorkerMirroredStrategy`): each element of a nested structure on its own, scalars
    across replicas, narrow integers through int32, strings and booleans as this worker's first
    value (whatever the reduce op: Keras only reduces them in the first batch, for their shapes)."""

    def reduce(self, reduce_op, value, axis):
        """Reduces every element of the (possibly nested) `value`; see `tf.distribute.Strategy.reduce`."""
        parent = super()

        def reduce_one(v):
            if v is None:
                return None
            local = self.experimental_local_results(v)
            scalar = bool(local) and getattr(local[0], "shape", None) is not None and local[0].shape.rank == 0
            dtype = getattr(local[0], "dtype", None) if local else None
            if dtype in _UNREDUCIBLE:  # "Value for attr 'T' of string is not in the list of allowed values"
                return local[0]
            if dtype in _NARROW_INTEGERS:  # CollectiveReduceV2 takes bfloat16/half/float/double/int32/int64
                wide = self.run(lambda t: tf.cast(t, tf.int32), args=(v,))
                return tf.cast(parent.reduce(reduce_op, wide, None if scalar else axis), dtype)
            return parent.reduce(reduce_op, v, None if scalar else axis)

        return tf.nest.map_structure(reduce_one, value)


class KerasMultiWorkerMirroredStrategy(_KerasReduce, tf.distribute.MultiWorkerMirroredStrategy):
    """`MultiWorkerMirroredStrategy` with a `reduce` that Keras 3's `fit` can use.

    Keras 3's `Model.fit` / `evaluate` call `strategy.reduce` in two ways that
    TensorFlow's collective reduce rejects once there are several workers
    (https://github.com/keras-team/keras/issues/20585):

    * on the first `(x, y)` batch, a tuple, before building the model: the
      collective reduce takes one distributed value, not a structure of them
      ("Attempt to convert a value (PerReplica...) to a Tensor");
    * on each step's scalar logs with `axis=0`, which a scalar does not have
      ("Invalid reduction dimension 0 for input with 0 dimensions").

    This subclass reduces each element of a nested structure on its own, and
    reduces scalars across replicas (`axis=None`, the only reading `axis=0` can
    have for them). Integer types the collective reduce does not take (such as
    uint8 images, which that first batch can hold) are reduced as int32 and cast
    back; strings and booleans (a table's categorical column, a mask), which no
    collective reduces, are this worker's own first value (Keras reads that batch
    only for its structure, shapes and dtypes, to build the model). Everything
    else is its parent's: the same constructor arguments, the same TF_CONFIG
    reading, the same `scope()`.

    Use it in your own script where you would build
    `tf.distribute.MultiWorkerMirroredStrategy()`; that line, and
    `import tftrain.runtime`, are the only change. `python -m tftrain.launch --workers N -- python your_script.py`
    runs the script on N local workers, each with its own TF_CONFIG.
    `make_strategy("multi_worker_mirrored", ...)` returns this class too.

    Args:
        cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`,
            or None to read TF_CONFIG. Defaults to None.
        communication_options: a
            `tf.distribute.experimental.CommunicationOptions` (e.g. RING or
            NCCL all-reduce), or None for `AUTO`. Defaults to None.

    Example:
        >>> import tftrain.runtime
        >>> # was: strategy = tf.distribute.MultiWorkerMirroredStrategy()
        >>> strategy = tftrain.runtime.KerasMultiWorkerMirroredStrategy()
        >>> with strategy.scope():
        ...     model = build_and_compile_model()
        >>> model.fit(dataset, epochs=3, steps_per_epoch=70)
    """


_MIRRORED: dict = {}
"""`make_strategy("mirrored")`'s strategy per device list, made once a process: two MirroredStrategy objects
on the same devices number their collective all-reduces alike, so the second model's gradients meet the
first's in one collective instance ("Shape mismatch in the collective instance 100"), and every later
step of the process fails; one strategy serves any number of models."""


class KerasMirroredStrategy(_KerasReduce, tf.distribute.MirroredStrategy):
    """`MirroredStrategy` (one process, several replicas) whose `reduce` takes the first batch Keras 3's
    `fit` reduces before building the model when it holds strings (a table's categorical column):
    `MirroredStrategy.reduce` adds the replicas' values (`AddN`), which takes no strings ("Value for
    attr 'T' of string is not in the list of allowed values"), and plain Keras fails alike. The
    constructor is `tf.distribute.MirroredStrategy`'s; `make_strategy("mirrored", ...)` returns it.
    """


_NARROW_INTEGERS = (tf.uint8, tf.int8, tf.uint16, tf.int16)
"""Integer dtypes `_KerasReduce.reduce` widens to int32 first."""

_UNREDUCIBLE = (tf.string, tf.bool)
"""Dtypes no reduce adds: `_KerasReduce.reduce` returns the first local value (with any reduce op)."""


def cluster_resolver(cluster: ClusterInfo, devices: Optional[DeviceInfo] = None):
    """A `tf.distribute.cluster_resolver.SimpleClusterResolver` for a validated cluster.

    Args:
        cluster: the `ClusterInfo` (from TF_CONFIG or SLURM).
        devices: the run's `DeviceInfo`; on a GPU run the resolver reports the
            visible GPUs as this task's accelerators (`MultiWorkerMirroredStrategy`
            places one replica on each). Defaults to None (no accelerators).

    Returns:
        The resolver, with gRPC as its RPC layer.
    """
    gpus = len(tf.config.get_visible_devices("GPU")) if devices is not None and devices.kind == "gpu" else 0
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({k: list(v) for k, v in cluster.cluster.items()}),
        task_type=cluster.task_type,
        task_id=cluster.task_index,
        num_accelerators={"GPU": gpus} if gpus else None,
        rpc_layer="grpc",
    )


class _EagerOverheadFilter(logging.Filter):
    """Drops TensorFlow's "Using <Strategy> eagerly has significant overhead" warning.

    Keras builds optimizer and metric variables with one eager
    `strategy.run`; the training steps themselves run in a `tf.function`, so the
    warning (printed up to 5 times per process) says nothing about the run.
    """

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: A003 (logging API)
        return "eagerly has significant overhead" not in record.getMessage()


def _quiet_eager_overhead_warning() -> None:
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _EagerOverheadFilter) for f in logger.filters):
        logger.addFilter(_EagerOverheadFilter())


def make_strategy(
    name: str,
    devices: DeviceInfo,
    cluster: Optional[ClusterInfo] = None,
    communication: str = "auto",
) -> tf.distribute.Strategy:
    """Builds a `tf.distribute.Strategy`.

    Args:
        name: `"default"` (`tf.distribute.get_strategy()`, no distribution),
            `"one_device"` (`OneDeviceStrategy` on the first device),
            `"mirrored"` (`MirroredStrategy`: one replica per device of `devices`,
            synchronous all-reduce), `"multi_worker_mirrored"` (alias
            `"multi_worker"`; `MultiWorkerMirroredStrategy`: synchronous
            all-reduce over every chief/worker task of `cluster`) or
            `"parameter_server"` (alias `"ps"`; `ParameterServerStrategy`:
            variables on the ps tasks, round-robin, updated asynchronously by the
            workers; build it on the chief, which coordinates with
            `tf.distribute.coordinator.ClusterCoordinator`).
        devices: the run's `DeviceInfo` (from `configure_devices`, which does
            not start TensorFlow's runtime: `MultiWorkerMirroredStrategy` must be
            built before it starts).
        cluster: the parsed cluster (`tftrain.runtime.cluster.resolve_cluster`);
            used by the multi-process strategies. None means a single worker for
            `multi_worker_mirrored` (TensorFlow then reads TF_CONFIG itself) and
            is an error for `parameter_server`. Defaults to None.
        communication: all-reduce implementation for `multi_worker_mirrored`:
            `"auto"`, `"ring"` (gRPC ring all-reduce) or `"nccl"` (GPUs only).
            Defaults to `"auto"`.

    Returns:
        The strategy. `strategy.num_replicas_in_sync` is the replica count (1
        for `parameter_server`, whose workers do not step in sync).

    Raises:
        ConfigError: on an unknown name or communication, or `nccl` without GPUs.
        ClusterConfigError: when `cluster` does not suit the strategy (see
            `tftrain.runtime.cluster.check_cluster`) or `parameter_server` runs
            on a task other than the chief.

    Example:
        >>> strategy = make_strategy("multi_worker_mirrored", DeviceInfo("cpu", ()),
        ...                          resolve_cluster("multi_worker_mirrored"), "ring")
    """
    name = STRATEGY_ALIASES.get(name, name)
    if name not in STRATEGIES:
        raise ConfigError(
            f"Invalid strategy {name!r}. Expected one of: {', '.join(STRATEGIES + tuple(STRATEGY_ALIASES))}. "
            f"Received: strategy={name!r}."
        )
    if communication not in COMMUNICATIONS:
        raise ConfigError(
            f"Invalid communication {communication!r}. Expected one of: {', '.join(COMMUNICATIONS)}. "
            f"Received: communication={communication!r}."
        )
    _quiet_eager_overhead_warning()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices.devices[0])
    if name == "mirrored":  # one a process per device list: see _MIRRORED
        key = tuple(devices.devices)
        if key not in _MIRRORED:
            _MIRRORED[key] = KerasMirroredStrategy(list(key))
        return _MIRRORED[key]
    check_cluster(name, cluster)
    if name == "parameter_server":
        if cluster.task_type != "chief":
            raise ConfigError(
                f"ParameterServerStrategy is built on the chief; this task is {cluster.task}. "
                "Worker and ps tasks run tftrain.runtime.serve(cluster) instead."
            )
        return tf.distribute.ParameterServerStrategy(cluster_resolver(cluster, devices))
    # multi_worker_mirrored
    if communication == "nccl" and devices.kind != "gpu":
        raise ConfigError("communication='nccl' needs GPUs; this run is on the CPU. Use 'ring' or 'auto'.")
    options = tf.distribute.experimental.CommunicationOptions(implementation=_COMMUNICATION[communication])
    resolver = cluster_resolver(cluster, devices) if cluster is not None else None
    return KerasMultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
