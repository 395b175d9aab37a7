"""What TensorFlow sees: its build (CUDA, cuDNN), GPUs, other accelerators, and why no GPU (`why_no_gpu`: pure)."""

from __future__ import annotations

import sys
from typing import Mapping, Optional

INSTALL_GUIDE = "https://www.tensorflow.org/install/pip"


def build_info() -> dict:
    """TensorFlow's version and CUDA/cuDNN/ROCm build facts (None where the build does not say)."""
    import tensorflow as tf

    info = dict(tf.sysconfig.get_build_info())
    return {
        "version": tf.__version__,
        "is_cuda_build": bool(info.get("is_cuda_build", False)),
        "cuda_version": info.get("cuda_version"),
        "cudnn_version": info.get("cudnn_version"),
        "is_rocm_build": bool(info.get("is_rocm_build", False)),
    }


def tf_gpus(hardware: Mapping, env: Mapping[str, str]) -> list:
    """The GPUs TensorFlow sees: `[{"device", "name", "compute_capability", "memory_bytes"}]`; memory from
    `nvidia-smi` by index, only if `CUDA_VISIBLE_DEVICES` is unset and the counts agree (else None)."""
    import tensorflow as tf

    found = tf.config.list_physical_devices("GPU")
    smi = list(hardware.get("gpus") or [])
    same_order = "CUDA_VISIBLE_DEVICES" not in env and len(smi) == len(found)
    out = []
    for i, gpu in enumerate(found):
        try:
            details = tf.config.experimental.get_device_details(gpu)
        except Exception:  # informative only
            details = {}
        cap = details.get("compute_capability")
        out.append({
            "device": f"/GPU:{i}",
            "name": details.get("device_name") or gpu.name,
            "compute_capability": tuple(cap) if cap else None,
            "memory_bytes": smi[i]["memory_bytes"] if same_order else None,
        })
    return out


def other_accelerators() -> list:
    """Device types TensorFlow lists besides CPU and GPU (e.g. `TPU`)."""
    import tensorflow as tf

    return sorted({d.device_type for d in tf.config.list_physical_devices()} - {"CPU", "GPU"})


def _hidden_by_env(env: Mapping[str, str]) -> Optional[str]:
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = [v.strip() for v in value.split(",")]
    if not value.strip() or ids[0].startswith("-"):  # CUDA stops at the first invalid id
        return (f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU from CUDA. Unset it, or list the GPUs "
                "to use (e.g. CUDA_VISIBLE_DEVICES=0,1).")
    return None


def why_no_gpu(build: Mapping, env: Mapping[str, str], hardware: Mapping, platform: str = sys.platform) -> list:
    """Why TensorFlow sees no GPU, from `build_info()` and `host.nvidia_hardware()`: one-sentence reasons with
    remedies, likeliest first, never empty. Source: https://www.tensorflow.org/install/pip"""
    reasons = []
    hidden = _hidden_by_env(env)
    if hidden:
        reasons.append(hidden)
    if platform == "darwin":
        reasons.append("TensorFlow on macOS has no CUDA GPU support; Apple GPUs need the tensorflow-metal plugin.")
    elif platform.startswith("win"):
        reasons.append("TensorFlow 2.11 and later has no GPU support on native Windows; run it under WSL2 "
                       f"({INSTALL_GUIDE}).")
    if not hardware.get("present"):
        reasons.append("No NVIDIA GPU or driver found on this machine (no nvidia-smi on PATH, no "
                       "/proc/driver/nvidia, no /dev/nvidia*); this machine trains on its CPU.")
        return reasons
    if not build.get("is_cuda_build"):
        reasons.append(f"This TensorFlow {build.get('version', '')} is a CPU-only build "
                       "(tf.sysconfig.get_build_info(): is_cuda_build False) although the machine has an NVIDIA "
                       "GPU; install the CUDA build: pip install 'tensorflow[and-cuda]'.")
    elif not hidden:
        driver = hardware.get("driver") or (hardware.get("gpus") or [{}])[0].get("driver") or "unknown"
        reasons.append(
            f"The machine has an NVIDIA GPU (driver: {driver}) and TensorFlow is a CUDA "
            f"{build.get('cuda_version')} / cuDNN {build.get('cudnn_version')} build, but it could not load "
            "CUDA: the CUDA or cuDNN libraries are missing, or the driver is too old for that CUDA. "
            "pip install 'tensorflow[and-cuda]' installs the libraries; TensorFlow's log line "
            "'Cannot dlopen some GPU libraries' names the missing one."
        )
    return reasons
