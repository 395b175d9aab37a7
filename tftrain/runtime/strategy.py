"""Building `tf.distribute` strategies by name.

Source: https://www.tensorflow.org/guide/distributed_training
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tftrain.config import COMMUNICATIONS, STRATEGIES, STRATEGY_ALIASES
from tftrain.errors import ClusterConfigError, ConfigError
from tftrain.runtime.cluster import ClusterInfo
from tftrain.runtime.devices import DeviceInfo

_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


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
            synchronous all-reduce) or `"multi_worker_mirrored"` (alias
            `"multi_worker"`; `MultiWorkerMirroredStrategy` over the workers in
            TF_CONFIG).
        devices: the run's `DeviceInfo` (from `configure_devices`).
        cluster: the parsed TF_CONFIG (`parse_tf_config`); only used by
            `multi_worker_mirrored`, where None means a single worker. Defaults to
            None.
        communication: all-reduce implementation for `multi_worker_mirrored`:
            `"auto"`, `"ring"` or `"nccl"` (GPUs only). Defaults to `"auto"`.

    Returns:
        The strategy. `strategy.num_replicas_in_sync` is the replica count.

    Raises:
        ConfigError: on an unknown name or communication, or `nccl` without GPUs.
        ClusterConfigError: when `cluster` holds ps tasks (use a parameter-server
            strategy) or this task is not a chief/worker.
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
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices.devices[0])
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(list(devices.devices))
    # multi_worker_mirrored
    if communication == "nccl" and devices.kind != "gpu":
        raise ConfigError("communication='nccl' needs GPUs; this run is on the CPU. Use 'ring' or 'auto'.")
    if cluster is not None:
        if cluster.num_ps:
            raise ClusterConfigError(
                "TF_CONFIG has ps tasks, which multi_worker_mirrored does not use. "
                "Remove them, or use a parameter-server strategy."
            )
        if cluster.task_type not in ("chief", "worker"):
            raise ClusterConfigError(
                f"multi_worker_mirrored runs on chief and worker tasks; this task is {cluster.task}."
            )
    options = tf.distribute.experimental.CommunicationOptions(implementation=_COMMUNICATION[communication])
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
