"""`diagnose`: gather the facts, measure, predict, advise. Bad input fails first; the loopback all-reduce runs
before the CPU measurements so its workers do not compete with them; a failed measurement goes to `errors`."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from tftrain import host
from tftrain.doctor import advice
from tftrain.doctor.tasks import build_models, load_tasks, task_figures
from tftrain.errors import ConfigError

SCHEMA = 1
"""Version of the report's JSON layout."""


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much work each measurement does (full or `--quick`)."""

    cpu_matmul: tuple = (512, 1024, 2048)
    cpu_float16_matmul: tuple = (512,)
    repeats: int = 5
    min_seconds: float = 0.25
    rounds: int = 2
    memory_bytes: int = 256 << 20
    disk_bytes: int = 512 << 20
    disk_repeats: int = 3
    allreduce_sizes: tuple = (262_144, 2_678_824, 16_777_216)
    allreduce_iterations: int = 10
    allreduce_warmup: int = 3
    allreduce_timeout_s: float = 60.0
    gpu_matmul: tuple = (4096, 8192)
    gpu_copy_bytes: int = 256 << 20
    gpu_allreduce_bytes: int = 64 << 20
    thread_batches: int = 32


FULL = Sizes()
QUICK = Sizes(cpu_matmul=(256,), cpu_float16_matmul=(256,), repeats=2, min_seconds=0.0, rounds=1,
              memory_bytes=32 << 20, disk_bytes=16 << 20, disk_repeats=1, allreduce_sizes=(2_678_824,),
              allreduce_iterations=3, allreduce_warmup=2, allreduce_timeout_s=45.0, gpu_matmul=(1024,),
              gpu_copy_bytes=16 << 20, gpu_allreduce_bytes=4 << 20, thread_batches=8)

_LONG_ENOUGH_S = 0.05
"""Seconds below which the largest CPU matmul is too short to reach the peak: double n once."""


def resolve_data_dir(data_dir: Optional[str], task_dir: Optional[str]) -> Path:
    """`--data-dir`, else the task's, else the bundled MNIST's folder; ConfigError when it does not exist."""
    from tftrain.data.datasets import BUNDLED_MNIST

    path = Path(data_dir or task_dir or BUNDLED_MNIST.parent).expanduser()
    if not path.exists():
        raise ConfigError(f"Data folder {str(path)!r} does not exist. Pass --data-dir with an existing folder or file.")
    return path


def shown_path(path: Path) -> str:
    """`path` relative to the current folder when inside it, else absolute."""
    full = path.resolve()
    try:
        return str(full.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(full)


def _attempt(errors: list, what: str, fn: Callable, *args, **kwargs):
    """`fn(*args, **kwargs)`, or None with the error appended to `errors`."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # a failed measurement must not lose the others
        first = (str(e).strip().splitlines() or [""])[0]
        errors.append({"what": what, "error": f"{type(e).__name__}: {first}".rstrip(": ")})
        return None


def cpu_matmuls(dtypes: tuple, sizes: Sizes) -> dict:
    """`{dtype: matmul_peak's dict plus "repeats"}`: best of rounds alternating dtypes (a disturbance hits a round)."""
    from tftrain.doctor.measure import matmul_peak

    out = {}
    for _ in range(sizes.rounds):
        for dtype in dtypes:
            result = matmul_peak(sizes.cpu_matmul, sizes.repeats, dtype, "/CPU:0", sizes.min_seconds)
            merged = out.setdefault(dtype, {"dtype": dtype, "by_size": {}, "repeats": sizes.repeats})
            for n, rates in result["by_size"].items():
                merged["by_size"].setdefault(n, []).extend(rates)
    for dtype, merged in out.items():
        n = max(merged["by_size"])
        if len(sizes.cpu_matmul) > 1 and 2 * n**3 / max(merged["by_size"][n]) < _LONG_ENOUGH_S:
            bigger = matmul_peak((2 * n,), sizes.repeats, dtype, "/CPU:0", sizes.min_seconds)
            merged["by_size"].update(bigger["by_size"])
        merged["best_flops"] = max(max(v) for v in merged["by_size"].values())
    return out


def measure_cpu(cpu: dict, data_path: Path, sizes: Sizes, errors: list, say: Callable) -> dict:
    """The CPU section's measurements: loopback all-reduce, matmul, memory, disk."""
    from tftrain.doctor import allreduce, measure

    out = {}
    say("loopback all-reduce between 2 processes")
    rows = _attempt(errors, "Loopback all-reduce", allreduce.loopback_allreduce, 2, sizes.allreduce_sizes,
                    sizes.allreduce_iterations, sizes.allreduce_timeout_s, sizes.allreduce_warmup)
    out["loopback_allreduce"] = {"workers": 2, **allreduce.fit_ring(rows, 2)} if rows else None
    say("CPU matmul")
    dtypes = ("float32", "bfloat16") if cpu["native_bf16"] else ("float32",)
    out["matmul"] = _attempt(errors, "CPU matmul", cpu_matmuls, dtypes, sizes) or {}
    out["matmul"]["float16"] = _attempt(errors, "CPU float16 matmul", measure.matmul_peak, sizes.cpu_float16_matmul,
                                        sizes.repeats, "float16", "/CPU:0", sizes.min_seconds)
    say("memory bandwidth")
    out["memory_bandwidth"] = _attempt(errors, "Memory bandwidth", measure.memory_bandwidth, sizes.memory_bytes,
                                       sizes.repeats, cpu["usable_cores"], 4 * sizes.min_seconds)
    say(f"disk read of {shown_path(data_path)}")
    disk = _attempt(errors, "Disk read", measure.disk_read, data_path, sizes.disk_bytes, sizes.disk_repeats)
    out["disk_read"] = {"path": shown_path(data_path), **disk} if disk else None
    say("thread counts (one child process per candidate)")
    out["threads"] = _attempt(errors, "Thread counts", measure_threads, sizes is not QUICK, sizes.thread_batches)
    return out


def measure_threads(keep: bool, batches: int) -> dict:
    """Times the thread-count candidates in child processes; remembers the choice when `keep`."""
    from tftrain.runtime import thread_choice

    choice = thread_choice.measure_threads(batches=batches, most=None if keep else 2)  # --quick: two candidates
    if keep:
        choice = thread_choice.remember(choice)
    return {**dataclasses.asdict(choice), "remembered": keep}


def measure_gpus(gpus: list, sizes: Sizes, errors: list, say: Callable) -> Optional[dict]:
    """Each GPU's matmul (float32, float16) and copies, in place; the GPUs' all-reduce when several."""
    from tftrain.doctor import measure

    for gpu in gpus:
        name = gpu["device"]
        say(f"{name} matmul and copies")
        gpu["measured"] = {"matmul": {
            dtype: _attempt(errors, f"{name} {dtype} matmul", measure.matmul_peak, sizes.gpu_matmul, sizes.repeats,
                            dtype, name, sizes.min_seconds) for dtype in ("float32", "float16")}}
        gpu["measured"]["copies"] = _attempt(errors, f"{name} copies", measure.gpu_copies, name, sizes.gpu_copy_bytes,
                                             sizes.repeats)
    if len(gpus) < 2:
        return None
    say("GPU all-reduce")
    return _attempt(errors, "GPU all-reduce", measure.gpu_allreduce, [g["device"] for g in gpus],
                    sizes.gpu_allreduce_bytes, sizes.repeats)


def gpu_section(env) -> dict:
    """What TensorFlow sees, the NVIDIA hardware found, and why no GPU when none."""
    import tensorflow as tf

    from tftrain.doctor import gpus as gpus_lib

    hardware = host.nvidia_hardware()
    build = gpus_lib.build_info()
    found = gpus_lib.tf_gpus(hardware, env)
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    return {"count": len(found), "gpus": found, "build": build, "hardware": hardware,
            "why_none": [] if found else gpus_lib.why_no_gpu(build, env, hardware),
            "other_accelerators": gpus_lib.other_accelerators(), "tensor_float_32": tf32,
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")}


def diagnose(task: Optional[str] = None, data_dir: Optional[str] = None, quick: bool = False,
             say: Optional[Callable[[str], None]] = None) -> dict:
    """Measures this machine and advises on training the task on it.

    Args:
        task: `FILE.py:NAME` or `MODULE:NAME`. Defaults to None (the MNIST recipe's models).
        data_dir: path whose disk read is measured. Defaults to None (the task's data, else bundled MNIST's).
        quick: tiny sizes, rough figures (for tests). Defaults to False.
        say: called with a progress message before each measurement. Defaults to None.

    Returns:
        The JSON-ready report: `system`, `cpu`, `gpu`, `tasks`, `advice`, `warnings`, `flags`, `errors`, ...

    Raises:
        ConfigError: on an unknown task or a missing data folder, before any measurement.
    """
    started, load_before = time.perf_counter(), _load_average()
    say = say or (lambda message: None)
    if data_dir is not None:
        resolve_data_dir(data_dir, None)  # a missing --data-dir fails before the task is imported
    loaded, task_dir = load_tasks(task)
    data_path = resolve_data_dir(data_dir, task_dir)
    sizes = QUICK if quick else FULL
    from tftrain.runtime.devices import select_devices

    select_devices("auto")  # GPU memory growth on, before the models start TensorFlow's runtime
    models = build_models(loaded)
    errors = []
    cpu = host.cpu_facts()
    gpu = gpu_section(os.environ)
    cpu["measured"] = measure_cpu(cpu, data_path, sizes, errors, say)
    gpu["allreduce"] = measure_gpus(gpu["gpus"], sizes, errors, say)
    system = {**_system(gpu["build"]), "load_average_before": load_before, "load_average_after": _load_average()}
    report = {"schema": SCHEMA, "quick": quick, "system": system, "cpu": cpu, "gpu": gpu, "errors": errors}
    device_peaks = advice.peaks(report)
    report["tasks"] = []
    for name, model, batch in models:
        figures = task_figures(name, model, batch)
        figures["predicted_examples_per_sec"] = advice.predict(figures["training_flops_per_example"], device_peaks)
        report["tasks"].append(figures)
    report.update(advice.advise(report))
    report["wall_s"] = time.perf_counter() - started
    return report


def _load_average() -> Optional[list]:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _system(build: dict) -> dict:
    return {"platform": platform.platform(), "python": sys.version.split()[0], "tensorflow": build["version"]}
