"""Device choice: CPU or GPUs, GPU memory growth, logical CPU devices; all only before TensorFlow's first op."""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tftrain.errors import DeviceError, RuntimeStartedError, check_int


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """The devices a run will use: `kind` `"gpu"` or `"cpu"`, logical device names for replicas,
    and per visible GPU its name and `(major, minor)` compute capability."""

    kind: str
    devices: tuple
    gpu_names: tuple = ()
    compute_capabilities: tuple = ()

    def describe(self) -> str:
        """One line, e.g. `2 x CPU (logical: /device:CPU:0, /device:CPU:1)`."""
        if self.kind == "gpu":
            names = ", ".join(self.gpu_names) or "GPU"
            return f"{len(self.devices)} x GPU ({names})"
        return f"{len(self.devices)} x CPU (logical: {', '.join(self.devices)})"


def runtime_started() -> bool:
    """Whether TensorFlow's runtime has started (fixing threads and devices), found without starting it."""
    from tftrain import _compat  # no public query: tf.config's setters raise only when asked to change a value

    return _compat.runtime_started()


def split_cpu(num_devices: int) -> list:
    """Splits the CPU into `num_devices` (>= 1) logical devices, for trying multi-replica code (not faster).

    Returns the device names, e.g. `["/device:CPU:0", "/device:CPU:1"]`.

    Raises:
        ValueError: when `num_devices` < 1.
        RuntimeStartedError: when TensorFlow already started with another number of logical CPUs.
    """
    check_int(num_devices, "num_devices")
    (cpu,) = tf.config.list_physical_devices("CPU")[:1]
    current = tf.config.get_logical_device_configuration(cpu)
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
    if num_devices > 1 or current:
        try:
            tf.config.set_logical_device_configuration(cpu, wanted)
        except RuntimeError:
            logical = tf.config.list_logical_devices("CPU")
            if len(logical) != num_devices:
                raise RuntimeStartedError(
                    f"Cannot split the CPU into {num_devices} logical devices: TensorFlow has "
                    f"already initialised with {len(logical)}. Split the CPU before any "
                    "TensorFlow op runs, or start a new process.", setting="cpu_replicas"
                ) from None
    # Not listed: that would start the runtime, which multi-worker strategies must configure first.
    return [f"/device:CPU:{i}" for i in range(num_devices)]


def _enable_memory_growth(gpus) -> None:
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            pass  # runtime already started: growth stays as it was


def select_devices(device: str = "auto", cpu_replicas: int = 1) -> str:
    """`configure_devices`' choice (GPUs hidden or given memory growth) without starting the runtime, so
    `MultiWorkerMirroredStrategy` can still be built; returns `"gpu"` or `"cpu"`. `cpu_replicas` is only checked.

    Raises:
        DeviceError: `device="gpu"` and no GPU visible, or `cpu_replicas` > 1 on GPUs.
        RuntimeStartedError: `device="cpu"` but TensorFlow already started with GPUs.
        ValueError: when `device` is not one of auto, cpu, gpu.
    """
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"Invalid device {device!r}. Expected one of: auto, cpu, gpu. Received: device={device!r}.")
    gpus = tf.config.get_visible_devices("GPU")
    if device == "gpu" and not gpus:
        raise DeviceError(
            "device='gpu' was requested but TensorFlow sees no GPU. Check "
            "`nvidia-smi` and that a CUDA build of TensorFlow is installed "
            "(pip install 'tensorflow[and-cuda]'), or pass --device cpu."
        )
    if device == "cpu" and gpus:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:
            if tf.config.get_visible_devices("GPU"):
                raise RuntimeStartedError(
                    "device='cpu' was requested but TensorFlow has already initialised "
                    "with GPUs visible. Choose the device before any TensorFlow op runs, "
                    "or set CUDA_VISIBLE_DEVICES=''.", setting="device"
                ) from None
        gpus = []
    if gpus:
        if cpu_replicas > 1:
            raise DeviceError(
                f"cpu_replicas={cpu_replicas} splits the CPU, but this run uses GPUs. "
                "Pass --device cpu to train on logical CPU devices, or drop --cpu-replicas."
            )
        _enable_memory_growth(gpus)
        return "gpu"
    return "cpu"


def configure_devices(device: str = "auto", cpu_replicas: int = 1) -> DeviceInfo:
    """Chooses the devices to train on and configures them (GPUs with memory growth).

    Args:
        device: `"auto"` (default: all GPUs if any, else the CPU), `"gpu"` or `"cpu"` (hides the GPUs).
        cpu_replicas: logical devices to split a CPU run into (`split_cpu`). Defaults to 1.

    Raises:
        DeviceError: `device="gpu"` and no GPU, `cpu_replicas` > 1 on GPUs, or TensorFlow already started.
        ValueError: when `device` is not one of auto, cpu, gpu.
    """
    if select_devices(device, cpu_replicas) == "gpu":
        names, caps = [], []
        for gpu in tf.config.get_visible_devices("GPU"):
            details = _gpu_details(gpu)
            names.append(details.get("device_name", gpu.name))
            caps.append(tuple(details.get("compute_capability", ()) or ()))
        logical = tuple(f"/device:GPU:{i}" for i in range(len(names)))
        return DeviceInfo("gpu", logical, tuple(names), tuple(caps))
    return DeviceInfo("cpu", tuple(split_cpu(cpu_replicas)))


def _gpu_details(gpu) -> dict:
    try:
        return tf.config.experimental.get_device_details(gpu)
    except Exception:  # details are informative only; never fail a run for them
        return {}


def min_compute_capability(info: DeviceInfo) -> Optional[tuple]:
    """The lowest `(major, minor)` compute capability among the run's GPUs, or None."""
    caps = [c for c in info.compute_capabilities if c]
    return min(caps) if caps else None
