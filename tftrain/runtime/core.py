"""`Runtime` and `setup`: threads -> devices -> precision -> strategy -> malloc, in that order."""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tftrain.config import AUTO_STEPS_PER_EXECUTION, RuntimeConfig, xla_replicas_error
from tftrain.errors import ConfigError
from tftrain.runtime.cluster import MULTI_PROCESS_STRATEGIES, ClusterInfo, drop_blank_tf_config, resolve_cluster
from tftrain.runtime.devices import DeviceInfo, configure_devices
from tftrain.runtime.execution import compile_options
from tftrain.runtime.memory import MallocSettings, restore_malloc_thresholds
from tftrain.runtime.nvtx import NvtxSettings, enable_nvtx_ranges, settle_nvtx
from tftrain.runtime.precision import PrecisionInfo, set_precision
from tftrain.runtime.strategy import make_strategy
from tftrain.runtime.threads import ThreadSettings, set_threads


GENERATOR_INPUT_STRATEGIES = ("mirrored", "one_device", "multi_worker_mirrored")
"""Strategies whose `fit` input runs TensorFlow's `GeneratorDataset`, which lowers glibc's
malloc thresholds; `setup` calls `restore_malloc_thresholds` for these."""


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What `setup` configured; `cluster`, `malloc` and `nvtx` are None where not used."""

    config: RuntimeConfig
    threads: ThreadSettings
    devices: DeviceInfo
    precision: PrecisionInfo
    strategy: tf.distribute.Strategy
    cluster: Optional[ClusterInfo]
    malloc: Optional[MallocSettings] = None
    nvtx: Optional[NvtxSettings] = None

    @property
    def num_replicas(self) -> int:
        """Replicas training in sync (all workers together)."""
        return self.strategy.num_replicas_in_sync

    @property
    def requested_steps_per_execution(self) -> int:
        """The configured steps per execution, `"auto"` resolved to `AUTO_STEPS_PER_EXECUTION`."""
        requested = self.config.steps_per_execution
        return AUTO_STEPS_PER_EXECUTION if requested == "auto" else requested

    @property
    def steps_per_execution(self) -> int:
        """Optimizer steps per `tf.function` call: the requested value with one replica, else 1.

        Keras 3's multi-step loop fails inside a replica context:
        https://github.com/keras-team/keras/issues/19246
        """
        return self.requested_steps_per_execution if self.num_replicas == 1 else 1

    def compile_options(self) -> dict:
        """`compile()` keyword arguments; `auto` compiles for graph (`choose_execution` may switch to XLA)."""
        execution = "graph" if self.config.execution == "auto" else self.config.execution
        return compile_options(execution, self.steps_per_execution)

    def _describe_precision(self) -> str:
        """The policy in force and, under `--precision auto`, what the build stage will do with it."""
        if self.config.precision != "auto" or self.precision.policy == "float32":
            return self.precision.describe()
        if self.devices.kind == "cpu":
            return ("auto: float32 or mixed_bfloat16, whichever trains faster on this CPU (the line "
                    "'precision: auto -> ...' says which)")
        return f"{self.precision.describe()} by auto's rule (float32 if the model does not build under it)"

    def describe(self) -> list:
        """Human-readable lines: threads, devices, replicas, precision, execution."""
        lines = [
            f"threads:   {self.threads.describe()}"
            + ("" if self.threads.applied else " (requested values not applied: TF already running)"),
            f"devices:   {self.devices.describe()}",
            f"strategy:  {self.config.strategy} ({type(self.strategy).__name__}), "
            f"{self.num_replicas} replica(s) in sync",
            f"precision: {self._describe_precision()}",
            f"execution: {self.config.execution}, steps_per_execution={self.steps_per_execution}"
            + ("" if self.steps_per_execution == self.requested_steps_per_execution else
               f" ({self.config.steps_per_execution} requested; Keras 3 runs one step per call across replicas)")
            + (" (auto)" if self.config.steps_per_execution == "auto" and self.num_replicas == 1 else ""),
        ]
        if self.malloc is not None:
            lines.append(f"memory:    {self.malloc.describe()}")
        if self.nvtx is not None:
            lines.append(self.nvtx.describe())
        if self.cluster is not None:
            ps = f" and {self.cluster.num_ps} ps task(s)" if self.cluster.num_ps else ""
            lines.append(
                f"cluster:   {self.cluster.task} of {self.cluster.num_workers} chief/worker task(s){ps} "
                f"(from {self.cluster.source}); chief: {self.cluster.is_chief}"
            )
        return lines


def _threads(config: RuntimeConfig) -> ThreadSettings:
    """Sets the config's thread counts, else the doctor's remembered choice, else TensorFlow's defaults."""
    intra, inter, source = config.intra_op_threads, config.inter_op_threads, ""
    if (intra, inter) == (0, 0) and config.threads == "auto" and config.remember_execution:
        from tftrain.runtime.thread_choice import remembered

        measured = remembered()
        if measured is not None and (measured.intra_op, measured.inter_op) != (0, 0):
            intra, inter = measured.intra_op, measured.inter_op
            source = (f"measured by python -m tftrain.doctor on {measured.measured_at}: "
                      f"{measured.speedup:.2f}x TensorFlow's defaults")
    settings = set_threads(intra, inter)
    return dataclasses.replace(settings, source=source) if settings.applied else settings


def unfuse_float16_on_cpu() -> None:
    """Turns Grappler's remapper off, for float16 compute on a CPU.

    The remapper fuses `MatMul` + `BiasAdd` into oneDNN's `_FusedMatMul`, whose float16
    CPU kernel is far slower than the unfused ops; turning it off changes no results
    beyond rounding. A later `setup` of another precision turns it back on.

    Source: https://www.tensorflow.org/guide/graph_optimization (`remapping`).
    """
    global _REMAPPER_OFF
    tf.config.optimizer.set_experimental_options({"remapping": False})
    _REMAPPER_OFF = True


_REMAPPER_OFF = False
"""Whether `unfuse_float16_on_cpu` turned Grappler's remapper off in this process."""


def _restore_remapper() -> None:
    """Undoes `unfuse_float16_on_cpu`, leaving a user's own setting alone."""
    global _REMAPPER_OFF
    if _REMAPPER_OFF:
        tf.config.optimizer.set_experimental_options({"remapping": True})
        _REMAPPER_OFF = False


def setup(config: RuntimeConfig, env: Optional[dict] = None, cluster: Optional[ClusterInfo] = None) -> Runtime:
    """Configures threads, devices, precision, the strategy and the malloc thresholds, in that order.

    Args:
        config: a validated `RuntimeConfig`.
        env: environment holding TF_CONFIG. Defaults to `os.environ` (SLURM is
            only looked for then).
        cluster: an already resolved cluster. Defaults to None: resolve it here.

    Returns:
        A `Runtime`. Build and compile the model inside `runtime.strategy.scope()`.

    Raises:
        ClusterConfigError: when the cluster is malformed or does not suit the strategy.
        DeviceError: when the requested devices are unavailable.
        ConfigError: on `nccl` on CPU, `xla` with more than one replica, or `nvtx`
            on a GPU without NVIDIA's `nvtx` package.
    """
    if env is None:
        drop_blank_tf_config()
    multi_process = config.strategy in MULTI_PROCESS_STRATEGIES
    if multi_process and cluster is None:
        cluster = resolve_cluster(config.strategy, env=env, ps_tasks=config.ps_tasks)
    nvtx_env_set = enable_nvtx_ranges() if config.nvtx else False  # before any op: read when TF first runs one
    if config.execution in ("auto", "xla") and config.remember_execution:  # also read when the runtime starts
        from tftrain.runtime import xla_cache

        xla_cache.enable()
    threads = _threads(config)
    # Nothing so far starts the runtime, so MultiWorkerMirroredStrategy can still configure collectives.
    devices = configure_devices(config.device, config.cpu_replicas)
    nvtx = settle_nvtx(nvtx_env_set, devices.kind) if config.nvtx else None
    precision = set_precision(config.precision, devices)
    if precision.compute_dtype == "float16" and devices.kind == "cpu":
        unfuse_float16_on_cpu()
    else:
        _restore_remapper()
    strategy = make_strategy(config.strategy, devices, cluster, config.communication)
    if config.execution == "xla" and strategy.num_replicas_in_sync > 1:
        raise ConfigError(xla_replicas_error(strategy.num_replicas_in_sync))  # GPU or worker replicas
    # Last: restore_malloc_thresholds starts the runtime, which the strategy must precede.
    malloc = restore_malloc_thresholds() if config.strategy in GENERATOR_INPUT_STRATEGIES else None
    return Runtime(config, threads, devices, precision, strategy, cluster, malloc, nvtx)
