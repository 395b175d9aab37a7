"""After-steps: what a run does once its model and `metrics.json` are on disk (`--export`).

Each is recorded in `metrics.json` as `"pending"`, then `"done"` or `"failed: <why>"`, so a trained
run is never lost to one; a rerun of the same command does only the pending ones, without training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from tftrain import rundir as rundir_lib
from tftrain.errors import TftrainError

EXPORT_DIR = "export"
"""The folder of the run directory that `--export` writes to."""


class AfterStepFailed(TftrainError, RuntimeError):
    """An after-step that failed once the run was saved (exit code 1); the message says how to redo it."""


def export(model, formats: Sequence[str], run_dir: Path, features, say: Callable[[str], None]) -> Dict[str, dict]:
    """Writes `model` in each format under `run_dir/export/`, checks each on `features`; one line a format.

    Returns:
        `{format: {"path", "max_abs_difference", "outputs"}}`.
    """
    from tftrain.train import export as export_lib

    results = export_lib.export_all(model, formats, Path(run_dir) / EXPORT_DIR, features)
    for name, r in results.items():
        say(f"export:    {name} -> {r['path']}; loaded back, max |difference| from the model over "
            f"{len(r['outputs'])} output(s) {r['max_abs_difference']:.2e}")
    return results


def failure_status(error: BaseException) -> str:
    """`"failed: Type: first line"` for `metrics.json`'s `after_steps`."""
    from tftrain.train.sanity import cause_line

    return f"failed: {cause_line(error)}"


def update_metrics(run_dir, **sections) -> dict:
    """Lays `sections` over `run_dir/metrics.json` (written atomically); returns the whole."""
    from tftrain import reports

    path = Path(run_dir) / rundir_lib.METRICS_FILE
    metrics = json.loads(path.read_text(encoding="utf-8"))
    metrics.update(sections)
    reports.write_metrics(run_dir, metrics)
    return metrics


def failed_message(step: str, run_dir, error_status: str, formats: Optional[str] = None) -> str:
    """The one line of a failed after-step: what failed, that the run is kept, how to redo only it."""
    redo = f"python -m tftrain.export {run_dir} --formats {formats}" if step == "export" and formats else None
    return (f"{step} failed after training ({error_status.removeprefix('failed: ')}); the trained model and "
            f"metrics.json are kept in {run_dir}. Rerun the same command with --run-dir {run_dir} to do only the "
            f"{step} again"
            + (f", or run {redo}" if redo else ""))
