"""After-steps: what a run does once its model and `metrics.json` are on disk (`--export`).

A trained run is never lost to an after-step: `metrics.json` is written as soon as training and
evaluation end, with each asked after-step `"pending"` under `after_steps`; each step then records
`"done"` or `"failed: <why>"`. A rerun of the same command finds the pending steps
(`tftrain.rundir.pending_after_steps`) and does only those, from `model.keras`, without training;
`python -m tftrain.export RUN_DIR --formats ...` exports any finished run.
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
    """An after-step that failed once the run was trained and saved: a run that failed (exit code 1); its
    model and `metrics.json` are kept, and the message says how to do only the step again."""


def export(model, formats: Sequence[str], run_dir: Path, features, say: Callable[[str], None]) -> Dict[str, dict]:
    """Writes `model` in each format under `run_dir/export/` and checks each artifact on `features`
    (`tftrain.train.export.export_all`); says one line a format.

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
    """Lays `sections` over the top level of `run_dir/metrics.json` (written atomically); returns the whole."""
    from tftrain import reports

    path = Path(run_dir) / rundir_lib.METRICS_FILE
    metrics = json.loads(path.read_text(encoding="utf-8"))
    metrics.update(sections)
    reports.write_metrics(run_dir, metrics)
    return metrics


def failed_message(step: str, run_dir, error_status: str, formats: Optional[str] = None) -> str:
    """The one line of an after-step that failed: what failed, that the run is kept, and how to redo only it."""
    redo = f"python -m tftrain.export {run_dir} --formats {formats}" if step == "export" and formats else None
    return (f"{step} failed after training ({error_status.removeprefix('failed: ')}); the trained model and "
            f"metrics.json are kept in {run_dir}. Rerun the same command with --run-dir {run_dir} to do only the "
            f"{step} again"
            + (f", or run {redo}" if redo else ""))
