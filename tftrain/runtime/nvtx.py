"""NVTX ranges for NVIDIA Nsight Systems (`nsys profile -t cuda,nvtx,...`).

Two kinds of range, both only of use on a GPU under Nsight Systems:

- TensorFlow's own op ranges. NVIDIA's TensorFlow builds (the NGC containers)
  emit them when `TF_ENABLE_NVTX_RANGES=1` is set before TensorFlow runs its
  first op. The pip TensorFlow 2.21 wheel has no such variable (the string is in
  none of its libraries); its headers (`tsl/profiler/lib/nvtx_utils.h`) route op
  annotations to an NVTX domain "TSL" when NVTX profiling is enabled.
- Named training steps: `tftrain.callbacks.NvtxSteps` pushes one range per
  execution in the domain `NVTX_DOMAIN`, with NVIDIA's `nvtx` package
  (`pip install nvtx`, or the `nvtx` extra of tftrain).

`enable_nvtx_ranges` sets the variable (the caller says so: `tftrain.runtime.setup`
prints a line); `settle_nvtx` then looks at the devices in use and undoes it where
there is no GPU. This module imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import MutableMapping, Optional

from tftrain.errors import ConfigError

NVTX_ENV = "TF_ENABLE_NVTX_RANGES"
"""The environment variable NVIDIA's TensorFlow builds read to emit NVTX ranges for ops."""

NVTX_DOMAIN = "tftrain"
"""The NVTX domain of tftrain's step ranges (Nsight Systems shows one row per domain)."""

NVTX_PACKAGE = "nvtx"
NVTX_INSTALL = "pip install nvtx"


@dataclasses.dataclass(frozen=True)
class NvtxSettings:
    """What `--nvtx` did.

    Attributes:
        active: True on a GPU: the variable is set and steps get ranges.
        env_set: whether tftrain set `TF_ENABLE_NVTX_RANGES` (False when it
            was set before, or on no GPU, where it was undone).
        reason: why it is inactive ("" when active).
    """

    active: bool
    env_set: bool = False
    reason: str = ""

    def describe(self) -> str:
        """One line for the run's plan."""
        if not self.active:
            return f"nvtx:      {self.reason}; --nvtx has nothing to do"
        env = f"{NVTX_ENV}=1" + (" (set by --nvtx)" if self.env_set else " (already set)")
        return (f"nvtx:      {env}; each training execution is an NVTX range in domain {NVTX_DOMAIN!r} "
                "(run under nsys profile -t cuda,nvtx)")


def enable_nvtx_ranges(env: Optional[MutableMapping[str, str]] = None) -> bool:
    """Sets `TF_ENABLE_NVTX_RANGES=1` unless it is already set; call before the runtime starts.

    Args:
        env: the environment to change. Defaults to `os.environ`.

    Returns:
        True when it set the variable, False when it was already set (left as is).
    """
    env = os.environ if env is None else env
    if NVTX_ENV in env:
        return False
    env[NVTX_ENV] = "1"
    return True


def settle_nvtx(env_set: bool, device_kind: str, env: Optional[MutableMapping[str, str]] = None) -> NvtxSettings:
    """Keeps `--nvtx` on a GPU, undoes it elsewhere.

    Args:
        env_set: what `enable_nvtx_ranges` returned.
        device_kind: `"gpu"` or `"cpu"`, the devices the run uses
            (`DeviceInfo.kind`).
        env: the environment `enable_nvtx_ranges` changed. Defaults to
            `os.environ`.

    Returns:
        `NvtxSettings`; inactive without a GPU (the variable it set is removed again).

    Raises:
        ConfigError: on a GPU when NVIDIA's `nvtx` package, which names the
            steps, is not installed.
    """
    env = os.environ if env is None else env
    if device_kind != "gpu":
        if env_set:
            env.pop(NVTX_ENV, None)
        return NvtxSettings(False, reason="no GPU in use (NVTX ranges are for Nsight Systems on a GPU)")
    if importlib.util.find_spec(NVTX_PACKAGE) is None:
        raise ConfigError(f"--nvtx names training steps with NVIDIA's nvtx package, which is not installed. "
                          f"Run `{NVTX_INSTALL}` (or install tftrain's nvtx extra), or drop --nvtx.")
    return NvtxSettings(True, env_set=env_set)
