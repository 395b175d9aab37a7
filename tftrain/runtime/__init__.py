"""Runtime set-up: threads -> devices -> precision -> strategy, in that order.

Each step is usable on its own from any Keras script (`set_threads`,
`configure_devices`, `set_precision`, `make_strategy`, `compile_options`);
`setup` runs them in the only order TensorFlow accepts, because thread counts and
logical devices must be fixed before its runtime initialises.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tftrain.config import RuntimeConfig
from tftrain.errors import ConfigError
from tftrain.runtime.cluster import ClusterInfo, parse_tf_config
from tftrain.runtime.devices import DeviceInfo, configure_devices, split_cpu
from tftrain.runtime.execution import compile_options
from tftrain.runtime.precision import (
    PrecisionInfo,
    current_precision,
    ensure_float32_outputs,
    precision_policy,
    set_precision,
)
from tftrain.runtime.strategy import make_strategy
from tftrain.runtime.threads import ThreadSettings, set_threads

__all__ = [
    "ClusterInfo",
    "DeviceInfo",
    "PrecisionInfo",
    "Runtime",
    "ThreadSettings",
    "compile_options",
    "configure_devices",
    "current_precision",
    "ensure_float32_outputs",
    "make_strategy",
    "parse_tf_config",
    "precision_policy",
    "set_precision",
    "set_threads",
    "setup",
    "split_cpu",
]


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What `setup` configured.

    Attributes:
        config: the `RuntimeConfig` it was built from.
        threads: `ThreadSettings` in effect.
        devices: `DeviceInfo` of the devices in use.
        precision: `PrecisionInfo` of the global dtype policy.
        strategy: the `tf.distribute.Strategy`.
        cluster: parsed TF_CONFIG, or None for a single process.
    """

    config: RuntimeConfig
    threads: ThreadSettings
    devices: DeviceInfo
    precision: PrecisionInfo
    strategy: tf.distribute.Strategy
    cluster: Optional[ClusterInfo]

    @property
    def num_replicas(self) -> int:
        """Replicas training in sync (all workers together)."""
        return self.strategy.num_replicas_in_sync

    def compile_options(self) -> dict:
        """`compile()` keyword arguments for the configured execution mode."""
        return compile_options(self.config.execution, self.config.steps_per_execution)

    def describe(self) -> list:
        """Human-readable lines: threads, devices, replicas, precision, execution."""
        lines = [
            f"threads:   {self.threads.describe()}"
            + ("" if self.threads.applied else " (requested values not applied: TF already running)"),
            f"devices:   {self.devices.describe()}",
            f"strategy:  {self.config.strategy} ({type(self.strategy).__name__}), "
            f"{self.num_replicas} replica(s) in sync",
            f"precision: {self.precision.describe()}",
            f"execution: {self.config.execution}, steps_per_execution={self.config.steps_per_execution}",
        ]
        if self.cluster is not None:
            lines.append(f"cluster:   {self.cluster.task} of {self.cluster.num_workers} worker(s)")
        return lines


def setup(config: RuntimeConfig, env: Optional[dict] = None) -> Runtime:
    """Configures threads, devices, precision and the strategy, in that order.

    Args:
        config: a validated `RuntimeConfig`.
        env: environment holding TF_CONFIG. Defaults to `os.environ`.

    Returns:
        A `Runtime`. Build and compile the model inside `runtime.strategy.scope()`.

    Raises:
        ClusterConfigError: when TF_CONFIG is malformed (checked before any
            strategy is built).
        DeviceError: when the requested devices are unavailable.
        ConfigError: on an invalid combination (`nccl` on CPU, `xla` with more
            than one replica).
    """
    cluster = parse_tf_config(env=env) if config.strategy == "multi_worker_mirrored" else None
    threads = set_threads(config.intra_op_threads, config.inter_op_threads)
    devices = configure_devices(config.device, config.cpu_replicas)
    precision = set_precision(config.precision, devices)
    strategy = make_strategy(config.strategy, devices, cluster, config.communication)
    if config.execution == "xla" and strategy.num_replicas_in_sync > 1:
        raise ConfigError(
            f"execution='xla' does not work with {strategy.num_replicas_in_sync} replicas: Keras 3 "
            "compiles the whole cross-replica step with XLA, which cannot span devices. "
            "Use --execution graph, or train on one replica."
        )
    return Runtime(config, threads, devices, precision, strategy, cluster)
