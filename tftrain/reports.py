"""Run reports: `metrics.json` for programs, `report.md` for people."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Mapping, Optional

from tftrain.rundir import METRICS_FILE, REPORT_FILE, write_text_atomic

_PACKAGES = ("tftrain", "tensorflow", "keras", "numpy", "tensorboard", "tensorboard-plugin-profile")


def versions() -> dict:
    """Versions of Python and the packages a run depends on (None when absent)."""
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_metrics(run_dir, metrics: Mapping) -> Path:
    """Writes `metrics.json` (sorted keys, 2-space indent) atomically and durably (it marks the run finished, so
    the backup is deleted after it); returns its path."""
    path = Path(run_dir) / METRICS_FILE
    write_text_atomic(path, json.dumps(metrics, indent=2, sort_keys=True, default=jsonable) + "\n", durable=True)
    return path


def jsonable(value):
    """`json.dumps`'s `default`: NumPy / TF scalars, sets, tuples, paths, dataclasses; else `TypeError`."""
    if hasattr(value, "item"):  # NumPy / TF scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_REPORT_ROWS = (
    ("epochs_trained", "Epochs trained in this process", "{}"),
    ("wall_time_s", "Wall time (s)", "{:.1f}"),
    ("fit_time_s", "fit() time (s)", "{:.1f}"),
    ("examples_per_sec", "Training examples/sec", "{:,.0f}"),
    ("throughput.examples_per_sec", "Examples/sec after warm-up", "{:,.0f}"),
    ("throughput.step_time_median_s", "Step time, median (s)", "{:.4f}"),
    ("throughput.step_time_p90_s", "Step time, 90th percentile (s)", "{:.4f}"),
    ("throughput.input.verdict", "Input pipeline", "{}"),
    ("batch_size_search.batch_size", "Batch size found (examples/sec)", "{}"),
    ("tuning.best", "Tuned hyperparameters", "{}"),
    ("profile.tensorboard", "Profile (TensorBoard, Profile tab)", "`{}`"),
    ("replicas", "Replicas", "{}"),
    ("global_batch_size", "Global batch size", "{}"),
    ("per_replica_batch_size", "Per-replica batch size", "{}"),
    ("precision", "Dtype policy", "{}"),
    ("loss_scaling", "Loss scaling", "{}"),
    ("execution", "Execution", "{}"),
    ("execution_auto", "Execution auto choice", "{}"),
    ("strategy", "Strategy", "{}"),
    ("devices", "Devices", "{}"),
)


def write_report(run_dir, metrics: Mapping, title: str = "Run report") -> Path:
    """Writes `report.md`: a table of the headline figures of `metrics`; returns its path."""
    lines = [f"# {title}", "", "| | |", "|---|---|"]
    results = [(("test", k), f"Test {k}", "{:.4f}") for k in (metrics.get("test") or {})]  # a name may hold a dot
    history = metrics.get("history") or {}
    last_val = {k: v[-1] for k, v in history.items() if k.startswith("val_") and v}
    results += [(("last_val", k), f"Validation {k[4:]} (last epoch)", "{:.4f}") for k in last_val]
    metrics = {**metrics, "last_val": last_val}
    for key, label, fmt in (*results, *_REPORT_ROWS):
        value = _lookup(metrics, key)
        if value is not None:
            lines.append(f"| {label} | {fmt.format(value)} |")
    vers = metrics.get("versions") or {}
    if vers:
        lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v)]
    lines += ["", f"Command: `{' '.join(metrics.get('argv') or [sys.executable])}`", ""]
    path = Path(run_dir) / REPORT_FILE
    write_text_atomic(path, "\n".join(lines))
    return path


def write_missing_report(run_dir, hparams=None) -> None:
    """Writes `report.md` from `metrics.json` when a kill came between the two; `hparams` is the task's
    hyperparameter dataclass (None: none), whose fields' trained values `metrics.json` holds at its top level."""
    path = Path(run_dir)
    if (path / METRICS_FILE).is_file() and not (path / REPORT_FILE).is_file():
        try:
            metrics = json.loads((path / METRICS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(metrics, dict):
            return
        fields = dataclasses.fields(hparams) if hparams is not None else ()
        title = run_title(str(metrics.get("task") or "Run report"), {f.name: metrics.get(f.name) for f in fields})
        write_report(path, metrics, title=title)


def run_title(task: str, hparams: Optional[Mapping]) -> str:
    """`report.md`'s title: the task, and the hyperparameters that are set (`mnist (model=cnn, width=64)`)."""
    shown = ", ".join(f"{k}={v}" for k, v in (hparams or {}).items() if v is not None)
    return f"{task} ({shown})" if shown else task


def _lookup(metrics: Mapping, path):
    """`metrics["a"]["b"]` for `"a.b"` or `("a", "b")`; None when any part is missing."""
    value = metrics
    for part in (path if isinstance(path, tuple) else path.split(".")):
        if not isinstance(value, Mapping) or value.get(part) is None:
            return None
        value = value[part]
    return value
