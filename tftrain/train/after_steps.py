"""After-steps: what a run does once its model and `metrics.json` are on disk (`--export`).

Each is recorded in `metrics.json` as `"pending"`, then `"done"` or `"failed: <why>"`, so a trained
run is never lost to one; a rerun of the same command does only the pending ones, without training.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from tftrain import rundir as rundir_lib
from tftrain.errors import Preempted, TftrainError

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
    from tftrain.errors import cause_line

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


class ExportStages:
    """The `Trainer`'s after-step stages: `--export` once `metrics.json` is written (`run_after_steps`), and
    a rerun's pending export from `model.keras` (`redo_after_steps`), and a stop signal between them."""

    def run_after_steps(self, model) -> Optional[str]:
        """`--export` (chief only) once `metrics.json` is written; returns the failure's line, else None."""
        if not self.config.train.export or not self.is_chief:
            return None
        try:
            self.extras["export"] = export(
                self._float32_twin(model), self._export_formats(), self.out_dir.path,
                self._export_features(), self.console.line)
            status = "done"
        except Preempted:  # a stop signal: the export stays pending
            raise
        except Exception as e:  # noqa: BLE001 (recorded and raised once the record is written)
            self._raise_if_stopped(e)
            status = failure_status(e)
        self.extras[rundir_lib.AFTER_STEPS_KEY] = {"export": status}
        with self.preemption.holding(stop_after=False):  # on disk now: a stop after it must not redo it
            update_metrics(self.out_dir.path, after_steps={"export": status},
                           **({"export": self.extras["export"]} if status == "done" else {}))
        return None if status == "done" else failed_message(
            "export", self.run_dir.path, status, self.config.train.export)

    def _export_features(self, global_batch_size: Optional[int] = None):
        """A few examples' features to check exported artifacts on: the test data's, else the training data's."""
        from tftrain.train import export

        gb = global_batch_size or self.batch.global_batch_size
        data = self.task.test_data(gb)
        return export.check_batch(self.task.probe_data(gb, 1) if data is None else data)

    def redo_after_steps(self) -> None:
        """Does only a trained run's pending after-steps, from `model.keras`; raises `AfterStepFailed`."""
        if not self.is_chief:  # the chief exports; a parameter-server job's servers wait for it (loop.job)
            return None
        path = self.run_dir.path
        if not self.config.train.export:  # the pending export is python -m tftrain.export's, cut short
            from tftrain.errors import ConfigError

            raise ConfigError(f"The run in {str(path)!r} finished before (metrics.json is written); an export of it "
                              f"was cut short: finish it with python -m tftrain.export {path} --formats FORMATS. "
                              "tftrain never overwrites a finished run.")
        metrics = json.loads((path / rundir_lib.METRICS_FILE).read_text(encoding="utf-8"))
        hparams = self.config.task  # metrics.json holds the values trained (--tune's choice), at its top level
        tuned = {f.name: metrics[f.name] for f in dataclasses.fields(hparams)
                 if metrics.get(f.name) is not None} if hparams is not None else {}
        self.resolved = self.config.override({**tuned, "run_dir": str(path)})
        self.task = self.task.bind(self.resolved)
        alone = self.config.runtime.strategy == "multi_worker_mirrored"  # its other workers have left at once
        self.setup_runtime(dataclasses.replace(self.config.runtime, strategy="default", communication="auto")
                           if alone else None)
        with self.loop.job(self.cluster):
            self._redo_export(path, metrics)

    def _redo_export(self, path, metrics: dict) -> None:
        """`redo_after_steps`'s export, under the run directory's lock."""
        self.console.line(f"run directory: {path}: trained before (metrics.json); doing only its pending "
                          f"after-step(s): {', '.join(self.run_dir.after_steps_pending)}")
        try:
            with rundir_lib.locked(path):
                self.out_dir = self.run_dir
                self.precision.set(metrics.get("precision") or "float32")  # built as the run built it, then float32
                model = self._plain_outputs(self._built(self.task.build_model()))
                saved = path / rundir_lib.MODEL_FILE
                model.load_weights(str(saved if saved.is_file() else path / rundir_lib.WEIGHTS_FILE))
                model = self._float32_twin(model)
                failure = None
                try:
                    results = export(model, self._export_formats(), path,
                                                 self._export_features(metrics.get("global_batch_size") or 32),
                                                 self.console.line)
                    update_metrics(path, export=results, after_steps={"export": "done"})
                except Preempted:  # a stop signal: the export stays pending, the same command does it
                    raise
                except Exception as e:  # noqa: BLE001 (recorded, then one line)
                    self._raise_if_stopped(e)
                    status = failure_status(e)
                    update_metrics(path, after_steps={"export": status})
                    failure = failed_message("export", path, status, self.config.train.export)
        finally:
            self.task.release()
        self.finish_run_dir()  # a kill after metrics.json left the backup (and maybe no report.md)
        if failure:
            raise AfterStepFailed(failure)
        self.console.line(f"after-steps done; metrics.json updated in {path}")

    def _raise_if_stopped(self, error: Exception) -> None:
        """Raises the stop signal's `Preempted` when one came: TensorFlow wraps what its handler raised inside a
        traced function (`StagingError`), which is no failed export."""
        if self.preemption is not None and self.preemption.requested() is not None:
            raise self.preemption.stop(str(self.run_dir.path)) from error

    def _export_formats(self):
        from tftrain.train import export

        return export.parse(self.config.train.export)

    def _stop_before_after_steps(self) -> None:
        """A stop signal that came while the run was written: raises `Preempted` when an export is
        still to do, else says the run is complete."""
        signum = self.preemption.requested()
        if signum is None:
            return
        import signal

        name = signal.Signals(signum).name
        if self.config.train.export and self.is_chief:
            raise Preempted(f"stopped by {name} after the run was written (metrics.json); its export is "
                            "pending", signum, str(self.run_dir.path))
        self.console.line(f"{name} received while the run was written: the run is complete")
