"""The report as readable text: facts and figures in aligned rows, then the advice."""

from __future__ import annotations

import textwrap
from typing import Optional

WIDTH = 24
"""Width of the label column."""

LINE = 100
"""Width the advice is wrapped at."""


def _flops(measured: Optional[dict]) -> str:
    if not measured or not measured.get("best_flops"):
        return "not measured"
    best = measured["best_flops"]
    sizes = ", ".join(str(n) for n in measured["by_size"])
    calls = sum(len(rates) for rates in measured["by_size"].values())
    value = f"{best / 1e12:.1f} TFLOP/s" if best >= 1e12 else f"{best / 1e9:.0f} GFLOP/s"
    return f"{value}   (best of {calls} calls, n = {sizes})"


def _rate(bytes_per_s: Optional[float]) -> str:
    if not bytes_per_s:
        return "not measured"
    return f"{bytes_per_s / 1e9:.1f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:,.0f} MB/s"


def _row(label: str, value: str) -> str:
    return f"  {label:<{WIDTH}}{value}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def cpu_lines(cpu: dict) -> list:
    """The CPU section."""
    m = cpu["measured"]
    feats = "  ".join(f"{name} {_yes(v)}" for name, v in cpu["features"].items())
    cores = (f"{cpu['usable_cores']} usable ({cpu['logical_cores']} logical, {cpu['physical_cores'] or '?'} physical, "
             f"{cpu['sockets'] or '?'} socket{'s' if (cpu['sockets'] or 1) > 1 else ''}"
             + (f", CPU quota {cpu['cpu_quota']:g}" if cpu.get("cpu_quota") is not None else "") + ")")
    memory = f"{cpu['memory_bytes'] / 2**30:.1f} GiB" + (" (cgroup limit)" if cpu.get("memory_limit_bytes") else "")
    lines = ["CPU", _row("model", cpu["model"]), _row("cores", cores),
             _row("features", feats + ("" if cpu["flags_source"] else "  (flags unknown)")), _row("memory", memory),
             _row("float32 matmul", _flops(m["matmul"].get("float32")))]
    if "bfloat16" in m["matmul"]:
        lines.append(_row("bfloat16 matmul", _flops(m["matmul"]["bfloat16"])))
    else:
        lines.append(_row("bfloat16 matmul", "not measured: no native bfloat16 (AVX512-BF16 / AMX-BF16)"))
    lines.append(_row("float16 matmul", _flops(m["matmul"].get("float16"))))
    mem = m.get("memory_bandwidth")
    lines.append(_row("memory bandwidth", _rate(mem and mem["bytes_per_s"]) + (
        f"   (copy, {mem['threads']} thread{'s' if mem['threads'] > 1 else ''}, {mem['array_bytes'] >> 20} MiB)"
        if mem else "")))
    disk = m.get("disk_read")
    lines.append(_row("disk read (data folder)", _rate(disk and disk["bytes_per_s"]) + (
        f"   ({disk['path']}: {disk['bytes'] / 1e6:,.0f} MB in {disk['files']} file{'s' if disk['files'] != 1 else ''}"
        + (", page cache dropped first" if disk["cache_dropped"] else ", may come from the page cache") + ")"
        if disk else "")))
    ring = m.get("loopback_allreduce")
    lines.append(_row("loopback all-reduce", _rate(ring and ring["bytes_per_s"]) + (
        f"   (ring, 2 processes on 127.0.0.1"
        + (f", fixed cost {ring['fixed_s'] * 1e3:.1f} ms" if ring.get("fixed_s") is not None else "")
        + f"; MNIST MLP's 2.68 MB: {_ring_row_ms(ring, 2_678_824)})" if ring else "")))
    return lines


def _ring_row_ms(ring: dict, nbytes: int) -> str:
    row = next((r for r in ring["rows"] if r["bytes"] == nbytes), None)
    return f"{row['median_s'] * 1e3:.1f} ms" if row else "not measured"


def gpu_lines(gpu: dict) -> list:
    """The GPU section: each GPU's facts and figures, or why there is none."""
    build = gpu["build"]
    lines = ["GPU", _row("TensorFlow build", f"{build['version']}, " + (
        f"CUDA {build['cuda_version']}, cuDNN {build['cudnn_version']}" if build["is_cuda_build"] else
        "CPU-only (no CUDA)"))]
    if not gpu["gpus"]:
        lines.append(_row("GPUs", "none found"))
        lines += [_row("why" if i == 0 else "", reason) for i, reason in enumerate(gpu["why_none"])]
    for g in gpu["gpus"]:
        cap = g.get("compute_capability")
        memory = f", {g['memory_bytes'] / 2**30:.0f} GiB" if g.get("memory_bytes") else ""
        lines.append(_row(g["device"], f"{g['name']}, compute capability "
                          f"{'.'.join(map(str, cap)) if cap else '?'}{memory}"))
        measured = g.get("measured", {})
        tf32 = " (TF32)" if gpu.get("tensor_float_32") and cap and tuple(cap) >= (8, 0) else ""
        lines.append(_row("  float32 matmul" + tf32, _flops(measured.get("matmul", {}).get("float32"))))
        lines.append(_row("  float16 matmul", _flops(measured.get("matmul", {}).get("float16"))))
        copies = measured.get("copies")
        lines.append(_row("  host <-> device", f"{_rate(copies['h2d_bytes_per_s'])} to GPU, "
                          f"{_rate(copies['d2h_bytes_per_s'])} to host" if copies else "not measured"))
    if gpu.get("allreduce"):
        lines.append(_row("GPU all-reduce", f"{_rate(gpu['allreduce']['bus_bytes_per_s'])} bus bandwidth"))
    if gpu.get("other_accelerators"):
        lines.append(_row("other accelerators", ", ".join(gpu["other_accelerators"])))
    return lines


def task_lines(tasks: list) -> list:
    keys = list(dict.fromkeys(k for t in tasks for k in t.get("predicted_examples_per_sec", {})))
    head = ["task", "MFLOP/example", *keys]
    rows = [[t["name"], f"{t['training_flops_per_example'] / 1e6:.2f}" if t["training_flops_per_example"] else "?",
             *(f"{t['predicted_examples_per_sec'][k]:,.0f}" if k in t.get("predicted_examples_per_sec", {}) else "-"
               for k in keys)] for t in tasks]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]

    def fmt(row):  # first column left-aligned, figures right-aligned
        return "  " + "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))

    lines = ["Tasks: training FLOPs per example (tftrain.flops) and predicted examples/sec",
             "       = measured matmul peak / FLOPs per example, an upper bound", fmt(head)]
    lines += [fmt(r) for r in rows]
    lines += [f"  {t['name']}: {t['note']}" for t in tasks if t.get("note")]
    return lines


def _wrap(label: str, text: str) -> list:
    return textwrap.wrap(text, LINE, initial_indent=f"      {label}: ", subsequent_indent=" " * (8 + len(label)),
                         break_on_hyphens=False, break_long_words=False)


def advice_lines(title: str, items: list) -> list:
    lines = [title]
    for item in items:
        lines += textwrap.wrap(f"[{item['topic']}] {item['say']}", LINE, initial_indent="  ",
                               subsequent_indent="    ", break_on_hyphens=False)
        lines += _wrap("why", item["why"]) + _wrap("source", item["source"])
    return lines if items else lines + ["  none"]


def render(report: dict) -> str:
    """The whole report as text (ends with a newline)."""
    mode = " (--quick: rough figures)" if report["quick"] else ""
    header = (f"tftrain doctor: this machine, measured in {report['wall_s']:.1f} s{mode}\n"
              f"  {report['system']['platform']}, Python {report['system']['python']}, "
              f"TensorFlow {report['system']['tensorflow']}\n"
              f"  In short, train with: {report['flags']}")
    sections = [header, "\n".join(cpu_lines(report["cpu"])), "\n".join(gpu_lines(report["gpu"])),
                "\n".join(task_lines(report["tasks"])), "\n".join(advice_lines("Advice", report["advice"])),
                "\n".join(advice_lines("Warnings", report["warnings"]))]
    return "\n\n".join(sections) + "\n"
