"""Building `tf.distribute` strategies by name. Source: https://www.tensorflow.org/guide/distributed_training"""

from __future__ import annotations

import contextlib
import logging
from typing import Optional

import tensorflow as tf

from tftrain.config import COMMUNICATIONS, STRATEGIES, STRATEGY_ALIASES
from tftrain.errors import ConfigError, RuntimeStartedError
from tftrain.runtime.cluster import ClusterInfo, check_cluster
from tftrain.runtime.devices import DeviceInfo

_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


class _KerasReduce:
    """A `reduce` Keras 3's `fit` can use: per nested element, scalars across replicas, narrow ints via int32,
    strings and booleans as this worker's first value (Keras reduces those only in the first batch)."""

    def reduce(self, reduce_op, value, axis):
        """Reduces every element of the (possibly nested) `value`."""
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
    """`MultiWorkerMirroredStrategy` with a `reduce` that Keras 3's `fit` can use; otherwise its parent.

    With several workers the collective reduce rejects the first `(x, y)` batch and scalar logs with `axis=0`
    from `fit`/`evaluate` (keras-team/keras#20585). Use it wherever you would build the parent.

    Example:
        >>> strategy = tftrain.runtime.KerasMultiWorkerMirroredStrategy()
    """


_MIRRORED: dict = {}
"""One mirrored strategy per device list: a second one's collectives clash with the first's ("Shape mismatch")."""


class KerasMirroredStrategy(_KerasReduce, tf.distribute.MirroredStrategy):
    """`MirroredStrategy` whose `reduce` accepts strings (its `AddN` fails Keras 3's `fit` on a string column)."""


_NARROW_INTEGERS = (tf.uint8, tf.int8, tf.uint16, tf.int16)
"""Integer dtypes `_KerasReduce.reduce` widens to int32 first."""

_UNREDUCIBLE = (tf.string, tf.bool)
"""Dtypes no reduce adds: `_KerasReduce.reduce` returns the first local value."""


def cluster_resolver(cluster: ClusterInfo, devices: Optional[DeviceInfo] = None):
    """A gRPC `SimpleClusterResolver` for a validated cluster; on GPUs, one replica per visible GPU."""
    gpus = len(tf.config.get_visible_devices("GPU")) if devices is not None and devices.kind == "gpu" else 0
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({k: list(v) for k, v in cluster.cluster.items()}),
        task_type=cluster.task_type,
        task_id=cluster.task_index,
        num_accelerators={"GPU": gpus} if gpus else None,
        rpc_layer="grpc",
    )


class _EagerOverheadFilter(logging.Filter):
    """Drops TensorFlow's "eagerly has significant overhead" warning (only Keras's variable set-up is eager)."""

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
    """Builds a `tf.distribute.Strategy` by name.

    Args:
        name: `"default"`, `"one_device"`, `"mirrored"` (one replica per device), `"multi_worker_mirrored"`
            (alias `"multi_worker"`) or `"parameter_server"` (alias `"ps"`; chief only).
        cluster: the resolved cluster. Defaults to None: TF_CONFIG for `multi_worker_mirrored`, an error for ps.
        communication: `multi_worker_mirrored`'s all-reduce: `"auto"` (default), `"ring"` or `"nccl"` (GPUs).

    Raises:
        ConfigError: an unknown name or communication, `nccl` without GPUs, or ps on a non-chief task.
        ClusterConfigError: when `cluster` does not suit the strategy (`check_cluster`).
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
    if name == "mirrored":  # one per device list: see _MIRRORED
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
        with _refused_once_started(name):
            return tf.distribute.ParameterServerStrategy(cluster_resolver(cluster, devices))
    # multi_worker_mirrored
    if communication == "nccl" and devices.kind != "gpu":
        raise ConfigError("communication='nccl' needs GPUs; this run is on the CPU. Use 'ring' or 'auto'.")
    options = tf.distribute.experimental.CommunicationOptions(implementation=_COMMUNICATION[communication])
    resolver = cluster_resolver(cluster, devices) if cluster is not None else None
    with _refused_once_started(name):
        return KerasMultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


@contextlib.contextmanager
def _refused_once_started(name: str):
    """Turns a multi-process strategy's RuntimeError into `RuntimeStartedError` (setting `"strategy"`) when
    TensorFlow's runtime had started before it: its collective ops and servers are set up at program start
    ("Collective ops must be configured at program startup")."""
    from tftrain.runtime.devices import runtime_started

    started = runtime_started()
    try:
        yield
    except RuntimeError as e:
        if not started:
            raise
        raise RuntimeStartedError(f"{name} cannot set up its cluster: TensorFlow's runtime started before it "
                                  f"({e}). Start the strategy before any TensorFlow op runs.",
                                  setting="strategy") from None


def agree_replicas(model, strategy) -> int:
    """Sets each floating-point variable whose replicas' copies drift apart (Keras's BatchNormalization moving
    statistics under MirroredStrategy and MultiWorkerMirroredStrategy: each replica updates its own) to their mean
    on every replica, so the model evaluates as it saves (one copy). Across workers every such variable is
    averaged by all-reduce, which each worker must call at the same point. Returns how many variables it set."""
    import numpy as np

    drifting = [v for v in model.non_trainable_variables
                if isinstance(getattr(v, "value", v), tf.distribute.DistributedValues)
                and getattr(v, "value", v).dtype.is_floating]
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return 0  # one copy of each variable, on the parameter servers
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        if not drifting:
            return 0
        means = strategy.experimental_local_results(strategy.run(tf.function(lambda: tf.distribute.get_replica_context(
        ).all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(getattr(v, "value", v)) for v in drifting]))))[0]
        with strategy.scope():
            for variable, mean in zip(drifting, means):
                getattr(variable, "value", variable).assign(mean)
        return len(drifting)
    agreed = 0
    for variable in drifting:
        value = getattr(variable, "value", variable)
        local = [np.asarray(t) for t in strategy.experimental_local_results(value)]
        if len(local) > 1 and any(not np.array_equal(local[0], other) for other in local[1:]):
            with strategy.scope():
                value.assign(np.mean(local, axis=0).astype(local[0].dtype))
            agreed += 1
    return agreed
