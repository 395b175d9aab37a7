"""NVTX ranges for NVIDIA Nsight Systems (`nsys profile -t cuda,nvtx,...`), on a GPU only; imports no TensorFlow.

Op ranges come from NVIDIA's TensorFlow builds (NGC) when `TF_ENABLE_NVTX_RANGES=1` is set before the first op
(pip wheels ignore it); `tftrain.callbacks.NvtxSteps` adds one range per execution via the `nvtx` package.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import MutableMapping, Optional

from tftrain.errors import ConfigError

NVTX_ENV = "TF_ENABLE_NVTX_RANGES"
"""The variable NVIDIA's TensorFlow builds read to emit NVTX ranges for ops."""

NVTX_DOMAIN = "tftrain"
"""The NVTX domain of tftrain's step ranges (Nsight Systems shows one row per domain)."""

NVTX_PACKAGE = "nvtx"
NVTX_INSTALL = "pip install nvtx"


@dataclasses.dataclass(frozen=True)
class NvtxSettings:
    """What `--nvtx` did: `active` on a GPU, `env_set` when tftrain set the variable, else `reason`."""

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
    """Sets `TF_ENABLE_NVTX_RANGES=1` in `env` (default environ) unless set, before the runtime starts; True if so."""
    env = os.environ if env is None else env
    if NVTX_ENV in env:
        return False
    env[NVTX_ENV] = "1"
    return True


def settle_nvtx(env_set: bool, device_kind: str, env: Optional[MutableMapping[str, str]] = None) -> NvtxSettings:
    """Keeps `--nvtx` on a GPU; elsewhere removes the variable if `env_set` (`enable_nvtx_ranges`' result).

    `device_kind` is `DeviceInfo.kind`; `env` defaults to `os.environ`.

    Raises:
        ConfigError: on a GPU when NVIDIA's `nvtx` package is not installed.
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
