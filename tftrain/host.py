"""Machine facts needing no measurement or TensorFlow: CPU model, cores, cgroup quota, sockets, training-relevant
instruction sets, memory, NVIDIA GPU and driver. Linux first (`/proc`, cgroups), else py-cpuinfo and psutil."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Optional

import psutil

FEATURES = {
    "AVX2": ("avx2",),
    "FMA": ("fma",),
    "AVX512F": ("avx512f",),
    "AVX512-VNNI": ("avx512_vnni",),
    "AVX512-BF16": ("avx512_bf16",),
    "AVX512-FP16": ("avx512_fp16",),
    "AMX-BF16": ("amx_bf16", "amx_tile"),
}
"""Feature -> its `/proc/cpuinfo` flags, by which oneDNN picks kernels (bfloat16 is emulated without BF16/AMX)."""

BF16_FEATURES = ("AVX512-BF16", "AMX-BF16")
"""Features that give native bfloat16 arithmetic (the one rule: `native_bf16`)."""

CPUINFO = "/proc/cpuinfo"
NVIDIA_PROC = "/proc/driver/nvidia/version"


def _cpuinfo_fields(path: str) -> list:
    """`/proc/cpuinfo` as a list of (key, value) pairs; empty when unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [(k.strip(), v.strip()) for k, sep, v in (line.partition(":") for line in text.splitlines()) if sep]


def cpu_flags(cpuinfo_path: str = CPUINFO) -> tuple:
    """`(frozenset of lower-case CPU flags, source)` from `cpuinfo_path`, else py-cpuinfo; source None if unknown."""
    for key, value in _cpuinfo_fields(cpuinfo_path):
        if key in ("flags", "Features"):  # x86, ARM
            return frozenset(value.lower().split()), cpuinfo_path
    try:
        import cpuinfo  # py-cpuinfo, optional

        return frozenset(f.lower() for f in cpuinfo.get_cpu_info().get("flags", [])), "py-cpuinfo"
    except Exception:  # not installed, or it failed on this platform
        return frozenset(), None


def features(flags) -> dict:
    """`{feature name: bool}` for every entry of `FEATURES`, from a set of flags."""
    return {name: all(f in flags for f in needed) for name, needed in FEATURES.items()}


def native_bf16(flags) -> bool:
    """Whether `cpu_flags`' flags give native bfloat16 (`BF16_FEATURES`): `--precision auto`'s and the doctor's rule."""
    found = features(flags)
    return any(found[name] for name in BF16_FEATURES)


def cpu_model(cpuinfo_path: str = CPUINFO) -> str:
    """The CPU's name (`model name` in `/proc/cpuinfo`, else the platform's processor string)."""
    for key, value in _cpuinfo_fields(cpuinfo_path):
        if key in ("model name", "Model", "Hardware") and value:
            return value
    return platform.processor() or platform.machine() or "unknown"


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> Optional[float]:
    """CPUs' worth of time the cgroup allows (e.g. 2.5; v2 `cpu.max`, else v1's CFS quota), or None if unlimited.
    TensorFlow sizes its thread pools by cores, not this quota."""
    try:
        quota, period = Path(root, "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path(root, "cpu", "cpu.cfs_quota_us").read_text())
        period = int(Path(root, "cpu", "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cgroup_memory_limit(root: str = "/sys/fs/cgroup") -> Optional[int]:
    """The cgroup's memory limit in bytes, or None when unlimited (v2 `memory.max`, v1 `limit_in_bytes`)."""
    for path in (Path(root, "memory.max"), Path(root, "memory", "memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text != "max" and text.isdigit() and int(text) < 1 << 60:  # v1 "unlimited" is ~2^63
            return int(text)
        return None
    return None


def usable_cores() -> int:
    """Cores this process may run on (CPU affinity and cpusets respected)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_facts(cpuinfo_path: str = CPUINFO, cgroup_root: str = "/sys/fs/cgroup") -> dict:
    """The CPU section's facts: `{"model", "logical_cores", "physical_cores", "usable_cores", "cpu_quota",
    "sockets", "features": {name: bool}, "flags_source", "native_bf16", "memory_bytes" (the smaller of RAM
    and the cgroup limit), "ram_bytes", "memory_limit_bytes"}`; None where unknown or unlimited."""
    flags, source = cpu_flags(cpuinfo_path)
    found = features(flags)
    sockets = {v for k, v in _cpuinfo_fields(cpuinfo_path) if k == "physical id"}
    ram = psutil.virtual_memory().total
    limit = cgroup_memory_limit(cgroup_root)
    return {
        "model": cpu_model(cpuinfo_path),
        "logical_cores": os.cpu_count() or 1,
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable_cores(),
        "cpu_quota": cgroup_cpu_quota(cgroup_root),
        "sockets": len(sockets) or None,
        "features": found,
        "flags_source": source,
        "native_bf16": native_bf16(flags),
        "memory_bytes": min(ram, limit) if limit else ram,
        "ram_bytes": ram,
        "memory_limit_bytes": limit,
    }


def _nvidia_smi_rows(exe: str, run: Callable = subprocess.run) -> list:
    """`[{"name", "memory_bytes", "driver"}, ...]` from `nvidia-smi`; empty when it fails."""
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        done = run([exe, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in done.stdout.strip().splitlines() if done.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            memory = int(float(parts[1]) * 2**20) if parts[1].replace(".", "", 1).isdigit() else None
            rows.append({"name": parts[0], "memory_bytes": memory, "driver": parts[2]})
    return rows


def nvidia_hardware(which: Callable = shutil.which, proc_path: str = NVIDIA_PROC, dev_glob_root: str = "/dev",
                    run: Callable = subprocess.run) -> dict:
    """Whether this machine has an NVIDIA GPU and driver, whatever TensorFlow sees (the arguments are for tests).

    Returns:
        `{"present", "nvidia_smi" (path or None), "driver" (the version file's first line or None),
        "device_files" (count of `/dev/nvidia<N>`), "gpus" (nvidia-smi rows: name, memory_bytes, driver)}`.
    """
    exe = which("nvidia-smi")
    try:
        driver = Path(proc_path).read_text(errors="replace").splitlines()[0].strip()
    except (OSError, IndexError):
        driver = None
    root = Path(dev_glob_root)
    device_files = len([p for p in root.glob("nvidia[0-9]*")]) if root.is_dir() else 0
    gpus = _nvidia_smi_rows(exe, run) if exe else []
    return {"present": bool(exe and gpus) or driver is not None or device_files > 0, "nvidia_smi": exe,
            "driver": driver, "device_files": device_files, "gpus": gpus}
