"""From measured figures to advice (items of `say`, `why`, `source`): predicted examples/sec, device, precision,
threads, strategy, input. Pure functions of the report's plain data (no TensorFlow), tested on made-up machines."""

from __future__ import annotations

import math
from typing import Optional

TF_GPU_GUIDE = "https://www.tensorflow.org/guide/gpu"
TF_MIXED_PRECISION = "https://www.tensorflow.org/guide/mixed_precision#supported_hardware"
NVIDIA_MIXED_PRECISION = "https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html"
ONEDNN_DATA_TYPES = "https://oneapi-src.github.io/oneDNN/dev_guide_data_types.html"
INTEL_CPU_GUIDE = ("https://www.intel.com/content/www/us/en/developer/articles/technical/"
                   "maximize-tensorflow-performance-on-cpu-considerations-and-recommendations-for-inference.html")
TF_THREADING = "https://www.tensorflow.org/api_docs/python/tf/config/threading"
TF_DISTRIBUTED = "https://www.tensorflow.org/guide/distributed_training"
TF_DATA_PERFORMANCE = "https://www.tensorflow.org/guide/data_performance"
SCALING_DOC = "docs/scaling.md (ring all-reduce cost: Patarasuk & Yuan 2009)"

BF16_WORTH_IT = 1.2
"""bfloat16 / float32 matmul ratio above which mixed_bfloat16 is worth trying on a CPU."""

BUSY_LOAD = 0.5
"""Load average per usable core above which the CPU figures are flagged as low."""


KEEP_DEFAULTS_PERCENT = 5
"""`thread_choice.KEEP_DEFAULTS_WITHIN` in percent, copied to avoid importing TensorFlow."""


def _item(topic: str, say: str, why: str, source: str, **extra) -> dict:
    return {"topic": topic, "say": say, "why": why, "source": source, **extra}


def _best(measured: Optional[dict]) -> Optional[float]:
    return (measured or {}).get("best_flops")


def peaks(report: dict) -> dict:
    """Measured matmul peaks, FLOP/s: `{"CPU float32": F, "/GPU:0 float16": F, ...}`."""
    out = {}
    for dtype, measured in report["cpu"]["measured"].get("matmul", {}).items():
        if dtype != "float16" and _best(measured):  # CPU float16 is measured only for the warning
            out[f"CPU {dtype}"] = _best(measured)
    for gpu in report["gpu"]["gpus"]:
        for dtype, measured in gpu.get("measured", {}).get("matmul", {}).items():
            if _best(measured):
                out[f"{gpu['device']} {dtype}"] = _best(measured)
    return out


def predict(flops_per_example: Optional[int], device_peaks: dict) -> dict:
    """Upper bounds on training examples/sec: peak FLOP/s / training FLOPs per example.

    Returns:
        `{"CPU float32": examples/sec, ...}`; empty when `flops_per_example` is None or 0.
    """
    if not flops_per_example:
        return {}
    return {key: peak / flops_per_example for key, peak in device_peaks.items()}


def _gpus(report):
    return report["gpu"]["gpus"]


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def _fmt_flops(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.0f} GFLOP/s"


def _task_bound(report: dict, key: str) -> str:
    """`mnist mlp N, mnist cnn M examples/sec` for one device key."""
    parts = [f"{t['name']} {_fmt_rate(t['predicted_examples_per_sec'][key])}"
             for t in report["tasks"] if key in t.get("predicted_examples_per_sec", {})]
    return ", ".join(parts) + " examples/sec" if parts else "no task with a FLOP count"


def advise_device(report: dict) -> dict:
    """CPU or GPU, with the predicted upper bounds on each."""
    device_peaks = peaks(report)
    cpu_key = "CPU float32"
    if not _gpus(report):
        why = report["gpu"]["why_none"][0] if report["gpu"]["why_none"] else "no GPU visible"
        bound = (f"Upper bound on the CPU (float32 matmul {_fmt_flops(device_peaks[cpu_key])}): "
                 f"{_task_bound(report, cpu_key)}." if cpu_key in device_peaks else "")
        return _item("device", "Train on the CPU (--device auto picks it here).", f"{why} {bound}".strip(),
                     TF_GPU_GUIDE, device="cpu")
    gpu_keys = sorted(k for k in device_peaks if k.startswith("/GPU"))
    best = max(gpu_keys, key=device_peaks.get) if gpu_keys else None
    ratio = (f" The GPU's best matmul ({best}: {_fmt_flops(device_peaks[best])}) is "
             f"{device_peaks[best] / device_peaks[cpu_key]:.0f}x the CPU's float32 "
             f"({_fmt_flops(device_peaks[cpu_key])}); upper bounds: {_task_bound(report, best)} per GPU."
             if best and cpu_key in device_peaks else "")
    n = len(_gpus(report))
    return _item("device", f"Train on the GPU{'s' if n > 1 else ''} (--device auto uses {'them' if n > 1 else 'it'}).",
                 f"TensorFlow sees {n} GPU{'s' if n > 1 else ''}.{ratio} Small models stay far below these bounds: "
                 "per-step overhead and the input pipeline dominate; raise the batch size and "
                 "--steps-per-execution.", TF_GPU_GUIDE, device="gpu")


def _min_capability(report) -> Optional[tuple]:
    caps = [tuple(g["compute_capability"]) for g in _gpus(report) if g.get("compute_capability")]
    return min(caps) if caps else None


def advise_precision(report: dict) -> dict:
    """float32, mixed_float16 or mixed_bfloat16, by the hardware rule and the measured matmul ratio."""
    if _gpus(report):
        return _gpu_precision(report)
    cpu = report["cpu"]
    f32 = _best(cpu["measured"].get("matmul", {}).get("float32"))
    bf16 = _best(cpu["measured"].get("matmul", {}).get("bfloat16"))
    if not cpu["native_bf16"]:
        return _item("precision", "Train in float32 (--precision float32; what --precision auto picks here).",
                     "This CPU has neither AVX512-BF16 nor AMX-BF16, so bfloat16 is emulated and slower than "
                     "float32.", ONEDNN_DATA_TYPES, precision="float32")
    if not (f32 and bf16):
        return _item("precision", "Train in float32 (--precision float32).",
                     "The bfloat16 matmul could not be measured.", ONEDNN_DATA_TYPES, precision="float32")
    ratio = bf16 / f32
    figures = f"bfloat16 matmul {_fmt_flops(bf16)} vs float32 {_fmt_flops(f32)} ({ratio:.2f}x)"
    if ratio >= BF16_WORTH_IT:
        return _item("precision", "Try --precision mixed_bfloat16 (what --precision auto picks here), and keep it "
                     "if python -m benchmarks.precision confirms it on your model.",
                     f"This CPU has native bfloat16 ({_native_names(cpu)}): {figures}. That is an upper bound: "
                     "convolutions, casts and elementwise ops gain less, or lose.",
                     f"{ONEDNN_DATA_TYPES}; {TF_MIXED_PRECISION}", precision="mixed_bfloat16")
    return _item("precision", "Train in float32 (--precision float32; --precision auto would pick mixed_bfloat16).",
                 f"This CPU has native bfloat16 ({_native_names(cpu)}) but here {figures}: "
                 f"under the {BF16_WORTH_IT}x that pays for the casts.", ONEDNN_DATA_TYPES, precision="float32")


def _native_names(cpu) -> str:
    return ", ".join(n for n in ("AVX512-BF16", "AMX-BF16") if cpu["features"].get(n))


def _gpu_precision(report: dict) -> dict:
    cap = _min_capability(report)
    gpu = _gpus(report)[0]
    matmul = gpu.get("measured", {}).get("matmul", {})
    f32, f16 = _best(matmul.get("float32")), _best(matmul.get("float16"))
    figures = (f" Measured on {gpu['device']}: float16 matmul {_fmt_flops(f16)} vs float32 {_fmt_flops(f32)} "
               f"({f16 / f32:.1f}x)." if f32 and f16 else "")
    if cap is not None and cap >= (7, 0):
        return _item("precision", "Train with --precision mixed_float16 (what --precision auto picks here).",
                     f"Compute capability {cap[0]}.{cap[1]} >= 7.0: float16 runs on Tensor Cores.{figures}"
                     + (" bfloat16 (--precision mixed_bfloat16, no loss scaling) runs fast too from 8.0 on."
                        if cap >= (8, 0) else ""),
                     f"{NVIDIA_MIXED_PRECISION}; {TF_MIXED_PRECISION}", precision="mixed_float16")
    return _item("precision", "Train in float32 (--precision float32; what --precision auto picks here).",
                 f"Compute capability {'unknown' if cap is None else f'{cap[0]}.{cap[1]}'} < 7.0: no Tensor Cores, "
                 f"so mixed_float16 gains little.{figures}", f"{NVIDIA_MIXED_PRECISION}; {TF_MIXED_PRECISION}",
                 precision="float32")


def advise_threads(report: dict) -> dict:
    """The measured thread counts when the doctor timed them, else `_threads_by_rule`."""
    measured = (report["cpu"].get("measured") or {}).get("threads")
    if not measured:
        return _threads_by_rule(report)
    intra, inter, speedup = measured["intra_op"], measured["inter_op"], measured["speedup"]
    rates = "; ".join(f"{setting}: " + ", ".join(f"{m} {r:,.0f}" for m, r in figures.items())
                      for setting, figures in measured["rates"].items())
    why = (f"Timed in child processes (intra,inter: reference models' examples/sec; 0 = TensorFlow's default): "
           f"{rates}.")
    if (intra, inter) == (0, 0):
        return _item("threads", "Keep TensorFlow's thread defaults: no other setting measured more than "
                     f"{KEEP_DEFAULTS_PERCENT}% faster.", why, TF_THREADING, flags="")
    kept = (" Remembered: runs on this machine apply it (--threads auto, the default)." if measured["remembered"]
            else " Not remembered (--quick figures are rough).")
    return _item("threads", f"Use --intra-op-threads {intra} --inter-op-threads {inter}: {speedup:.2f}x TensorFlow's "
                 f"defaults.{kept}", why, TF_THREADING,
                 flags="" if measured["remembered"] else f"--intra-op-threads {intra} --inter-op-threads {inter}")


def _threads_by_rule(report: dict) -> dict:
    """Intra-op threads = physical cores usable (and no more than the CPU quota); inter-op = sockets."""
    cpu = report["cpu"]
    usable, logical = cpu["usable_cores"], cpu["logical_cores"]
    physical = cpu.get("physical_cores") or logical
    smt = logical // physical if physical and logical > physical else 1
    intra = max(1, usable // smt)
    quota = cpu.get("cpu_quota")
    if quota is not None and quota < intra:
        intra = max(1, math.floor(quota))
    sockets = cpu.get("sockets") or 1
    flags = ([f"--intra-op-threads {intra}"] if intra != usable else []) + \
            ([f"--inter-op-threads {sockets}"] if sockets > 1 else [])
    facts = (f"{usable} usable core{'s' if usable != 1 else ''} ({logical} logical, {physical} physical, "
             f"{sockets} socket{'s' if sockets != 1 else ''}"
             + (f", cgroup CPU quota {quota:g}" if quota is not None else "") + ")")
    if not flags:
        return _item("threads", f"Keep the thread defaults (0 = one intra-op thread per usable core: {usable}).",
                     f"{facts}: one thread per physical core already.", f"{INTEL_CPU_GUIDE}; {TF_THREADING}",
                     flags="")
    return _item("threads", f"Set {' '.join(flags)}.",
                 f"{facts}: one intra-op thread per physical core (hyper-threads and a CPU quota below the core "
                 "count only add contention), one inter-op thread per socket.",
                 f"{INTEL_CPU_GUIDE}; {TF_THREADING}", flags=" ".join(flags))


def _allreduce_step_s(allreduce: dict, gradient_bytes: int, workers: int = 2) -> Optional[float]:
    """Loopback all-reduce seconds (None if unmeasured): 2-worker median, else `fixed_s + 2(n-1)/n * bytes / rate`."""
    if not allreduce or not allreduce.get("bytes_per_s"):
        return None
    row = next((r for r in allreduce.get("rows", ()) if r.get("bytes") == gradient_bytes), None)
    if workers == 2 and row and row.get("median_s"):
        return row["median_s"]
    sent = 2 * (workers - 1) / workers * gradient_bytes
    return (allreduce.get("fixed_s") or 0.0) + sent / allreduce["bytes_per_s"]


def advise_strategy(report: dict) -> dict:
    """default, or mirrored on several GPUs; with the cost of multi-worker over loopback."""
    n = len(_gpus(report))
    if n > 1:
        measured = report["gpu"].get("allreduce") or {}
        bw = measured.get("bus_bytes_per_s")
        return _item("strategy", "Use --strategy mirrored (one replica per GPU; NCCL all-reduce).",
                     f"{n} GPUs" + (f"; measured GPU all-reduce {bw / 1e9:.1f} GB/s (bus bandwidth)." if bw else "."),
                     TF_DISTRIBUTED, strategy="mirrored")
    why = ("One GPU: one replica; mirrored would add an all-reduce of nothing." if n == 1 else
           "One CPU device: --strategy mirrored --cpu-replicas N splits the same cores into replicas and "
           "does not train faster.")
    return _item("strategy", "Use --strategy default.", why + _multi_worker_cost(report),
                 f"{TF_DISTRIBUTED}; {SCALING_DOC}", strategy="default")


def _multi_worker_cost(report: dict) -> str:
    ring = report["cpu"]["measured"].get("loopback_allreduce") or {}
    task = next((t for t in report["tasks"] if t.get("gradient_bytes") and t.get("predicted_examples_per_sec")), None)
    step = _allreduce_step_s(ring, task["gradient_bytes"]) if task else None
    if step is None or "CPU float32" not in task["predicted_examples_per_sec"]:
        return ""
    compute = task["batch_size"] / task["predicted_examples_per_sec"]["CPU float32"]
    return (f" Two workers over this machine's loopback (measured ring: {ring['bytes_per_s'] / 1e6:,.0f} MB/s"
            + (f", {ring['fixed_s'] * 1e3:.1f} ms fixed" if ring.get("fixed_s") is not None else "")
            + f") would spend about {step * 1e3:.1f} ms all-reducing {task['name']}'s "
            f"{task['gradient_bytes'] / 1e6:.2f} MB of gradients per step, against at least {compute * 1e3:.1f} ms "
            f"of compute at batch {task['batch_size']} ({step / (step + compute):.0%} of the step, without "
            "overlap), and they would share the same cores: use multi_worker_mirrored across machines, not on one.")


def advise_input(report: dict) -> Optional[dict]:
    """Whether the data folder's disk can feed the predicted upper bound; cache or not."""
    disk = report["cpu"]["measured"].get("disk_read") or {}
    rate = disk.get("bytes_per_s")
    needs = [(t, max(t["predicted_examples_per_sec"].values()) * t["input_bytes_per_example"])
             for t in report["tasks"] if t.get("predicted_examples_per_sec") and t.get("input_bytes_per_example")]
    if not rate or not needs:
        return None
    task, need = max(needs, key=lambda p: p[1])
    memory = report["cpu"]["memory_bytes"]
    folder = disk.get("folder_bytes") or 0
    fits = folder < memory / 2
    cache = ("for file-based tasks (TFRecord, image folders) keep --cache on (the default): from the second "
             "epoch the examples come from memory; in-memory arrays need no cache"
             if fits else f"the data folder ({folder / 1e9:.1f} GB) is over half the memory "
             f"({memory / 1e9:.1f} GB): use --no-cache and a faster disk, or cache to a local SSD file")
    verdict = "can feed" if rate >= need else "cannot feed"
    return _item("input", f"The data folder's disk {verdict} the upper bound; {cache}.",
                 f"Cold read {rate / 1e6:,.0f} MB/s; {task['name']} at its upper bound "
                 f"({_fmt_rate(max(task['predicted_examples_per_sec'].values()))} examples/sec x "
                 f"{task['input_bytes_per_example']:,} input bytes per example) reads {need / 1e6:,.0f} MB/s.",
                 TF_DATA_PERFORMANCE)


def warnings_for(report: dict) -> list:
    """Warnings: unsuitable precisions, an unseen GPU, a busy machine, failed measurements."""
    out = []
    if not _gpus(report):
        out.append(_cpu_float16_warning(report))
    cap = _min_capability(report)
    if _gpus(report) and cap is not None and cap < (7, 0):
        out.append(_item("precision", "Do not use --precision mixed_float16 on these GPUs.",
                         f"Compute capability {cap[0]}.{cap[1]} < 7.0 has no float16 Tensor Cores.",
                         NVIDIA_MIXED_PRECISION))
    if not _gpus(report) and not report["cpu"]["native_bf16"]:
        out.append(_item("precision", "Do not use --precision mixed_bfloat16 on this CPU.",
                         "No AVX512-BF16 or AMX-BF16: bfloat16 is emulated.", ONEDNN_DATA_TYPES))
    if not _gpus(report) and report["gpu"]["hardware"].get("present"):
        out.append(_item("device", "This machine has an NVIDIA GPU that TensorFlow does not see.",
                         " ".join(report["gpu"]["why_none"]), "https://www.tensorflow.org/install/pip"))
    busy = _busy(report)
    if busy:
        out.append(busy)
    for error in report.get("errors", []):
        out.append(_item("measurement", f"{error['what']} could not be measured.", error["error"], "tftrain.doctor"))
    return out


def _busy(report: dict) -> Optional[dict]:
    load = report["system"].get("load_average_before")
    cores = report["cpu"]["usable_cores"]
    if not load or load[0] < BUSY_LOAD * cores:
        return None
    return _item("measurement", "Other processes were using the CPU: the CPU figures are low; rerun on an idle "
                 "machine for the hardware's figures.",
                 f"Load average {load[0]:.2f} (last minute) before measuring, on {cores} usable cores.",
                 "os.getloadavg()")


def _cpu_float16_warning(report: dict) -> dict:
    matmul = report["cpu"]["measured"].get("matmul", {})
    f16 = matmul.get("float16") or {}
    f32_at = (matmul.get("float32") or {}).get("by_size", {})
    native = report["cpu"]["features"].get("AVX512-FP16")
    why = ("Keras's mixed_float16 adds casts and dynamic loss scaling, which pay off only on GPUs' float16 Tensor "
           "Cores" + ("" if native else "; this CPU has no native float16 arithmetic (no AVX512-FP16)") + ".")
    n = next(iter(f16.get("by_size") or {}), None)
    if _best(f16) and n in f32_at:
        ratio = _best(f16) / max(f32_at[n])
        why += (f" Measured here at n={n}: float16 matmul {_fmt_flops(_best(f16))} vs float32 "
                f"{_fmt_flops(max(f32_at[n]))} ({ratio:.2f}x)"
                + ("; the matmul alone is not slower, whole training steps are" if ratio >= 1 else "") + ".")
    why += (" Whole MNIST training steps in mixed_float16 ran at 0.88x (MLP) and 0.44x (CNN) of float32's "
            "examples/sec on a 2-core CPU, best of graph and XLA each (benchmarks/results/precision.md).")
    return _item("precision", "Do not use --precision mixed_float16 on the CPU.", why, TF_MIXED_PRECISION)


def advise(report: dict) -> dict:
    """All the advice and warnings for a report.

    Returns:
        `{"advice": [items], "warnings": [items], "flags": str}`; items are `{"topic", "say", "why", "source"}`,
        plus `device`, `precision`, `strategy` or `flags` on those topics (threads: `flags`).
    """
    items = [advise_device(report), advise_precision(report), advise_threads(report), advise_strategy(report),
             advise_input(report)]
    items = [i for i in items if i is not None]
    return {"advice": items, "warnings": warnings_for(report), "flags": suggested_flags(items)}


def suggested_flags(items: list) -> str:
    """The advice as training flags, e.g. `--device cpu --precision float32 --strategy default`."""
    by_topic = {item["topic"]: item for item in items}
    flags = [f"--device {by_topic['device']['device']}", f"--precision {by_topic['precision']['precision']}",
             f"--strategy {by_topic['strategy']['strategy']}", by_topic["threads"]["flags"]]
    return " ".join(f for f in flags if f)
