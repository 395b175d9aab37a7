"""`--mlflow TRACKING_URI` (extra `tftrain[mlflow]`): the chief logs epoch metrics, then settings, final figures and
run files; a resumed run continues its MLflow run. `MlflowClient` with explicit run ids leaves a notebook's own
`mlflow.start_run()` alone. Source: https://mlflow.org/docs/latest/python_api/mlflow.client.html
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Optional

import keras

from tftrain.errors import ConfigError

RUN_ID_FILE = "mlflow_run_id"
"""The run-directory file holding the MLflow run id, for a resumed run."""

ARTIFACTS = ("model.keras", "model.weights.h5", "metrics.json", "report.md", "config.yaml", "history.csv")
"""Run-directory files logged as artifacts, if they exist."""

DEFAULT = "default"
"""`--mlflow default`: MLflow's own choice (`$MLFLOW_TRACKING_URI`, else its local default)."""


def check(uri: str) -> None:
    """Raises `ConfigError` (naming the pip extra) without MLflow, and on a file store MLflow will not open (MLflow 3
    keeps one only with `MLFLOW_ALLOW_FILE_STORE=true`); a server is not reached here."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ConfigError(f"--mlflow {uri} needs MLflow: pip install 'tftrain[mlflow]' (or drop --mlflow).") from None
    if uri.startswith(("file:", "/", ".")):  # a file store: opened here, in a moment
        from mlflow.exceptions import MlflowException

        try:
            _client(uri).search_experiments(max_results=1)
        except MlflowException as e:
            why = ("MLflow keeps a file store only with MLFLOW_ALLOW_FILE_STORE=true set" if
                   "MLFLOW_ALLOW_FILE_STORE" in str(e) else (str(e).splitlines() or [""])[0][:200])
            raise ConfigError(f"--mlflow {uri}: {why}. Pass a database URI (--mlflow sqlite:///mlflow.db) or a "
                              "server's, or set MLFLOW_ALLOW_FILE_STORE=true.") from None


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=None if uri == DEFAULT else uri)


class MlflowLog(keras.callbacks.Callback):
    """Logs a run to MLflow (chief only); `finish` logs what the run wrote. A tracking error is one warning and
    stops the logging, never the training.

    Args:
        uri: the tracking URI (`http://127.0.0.1:5000`, `sqlite:///mlflow.db`, ...), or `"default"`.
        run_dir: the run directory (its name names the MLflow run).
        experiment: the MLflow experiment's name (created if missing).
        warn: prints one warning line. Defaults to stderr.
    """

    def __init__(self, uri: str, run_dir: Path, experiment: str, warn: Optional[Callable[[str], None]] = None):
        super().__init__()
        self.uri, self.run_dir, self.experiment = uri, Path(run_dir), experiment
        self.warn = warn or (lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
        self.client, self.run_id, self.broken = None, None, False

    def _safely(self, what: str, action: Callable) -> None:
        """Runs `action()` unless logging failed before; a failure warns once and ends the logging."""
        if self.broken:
            return
        try:
            action()
        except Exception as e:  # noqa: BLE001 (the tracker's failure must not fail the run)
            self.broken = True
            first = (str(e).splitlines() or [""])[0][:300]
            self.warn(f"--mlflow {self.uri}: could not {what} ({type(e).__name__}: {first}); the run goes on "
                      "without MLflow logging")

    def start(self) -> Optional[str]:
        """Opens (on resume, reopens) the MLflow run; returns its id (None if MLflow failed)."""
        if self.run_id is None:
            self._safely("open the MLflow run", self._open)
        return self.run_id

    def _open(self) -> None:
        self.client = _client(self.uri)
        id_file = self.run_dir / RUN_ID_FILE
        if id_file.is_file():  # resumed: the same MLflow run, if this server has it
            from mlflow.exceptions import MlflowException

            kept = id_file.read_text().strip()
            try:
                self.client.update_run(kept, status="RUNNING")
                self.run_id = kept
                return
            except MlflowException:  # another server, or a damaged file: a new run there
                self.warn(f"--mlflow {self.uri}: the run's MLflow run {kept[:40]!r} ({id_file}) is not on this "
                          "server; this attempt logs to a new MLflow run")
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_dir.name).info.run_id
        from tftrain.rundir import write_text_atomic

        write_text_atomic(id_file, self.run_id + "\n")

    def on_train_begin(self, logs=None):
        self.start()

    def on_epoch_end(self, epoch, logs=None):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, float(value), now, epoch) for name, value in (logs or {}).items()
                   if isinstance(value, (int, float)) or hasattr(value, "__float__")]
        if metrics and self.run_id is not None:
            self._safely(f"log epoch {epoch}'s metrics", lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def finish(self, params: dict, figures: dict, step: int = 0, status: str = "FINISHED") -> None:
        """Logs settings (text, up to 6,000 characters each), final figures at `step` and `ARTIFACTS`; ends the
        MLflow run with `status`."""
        if self.start() is not None:
            self._safely("log the run's settings, figures and files", lambda: self._finish(params, figures, step))
        self.end(status)

    def _finish(self, params: dict, figures: dict, step: int) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        logged = self.client.get_run(self.run_id).data.params  # {key: value}
        new = [Param(k, str(v)[:6000]) for k, v in sorted(params.items()) if k not in logged]  # once per run
        for start in range(0, len(new), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=new[start:start + 100])
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in figures.items()])
        for name in ARTIFACTS:
            if (self.run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))

    def end(self, status: str) -> None:
        """Ends the MLflow run, if opened, with `status` (FINISHED, FAILED, KILLED)."""
        if self.run_id is not None and self.client is not None:
            self.broken = False  # try the end even after a failed upload
            self._safely(f"mark the MLflow run {status}", lambda: self.client.set_terminated(self.run_id, status))


def make(uri: Optional[str], run_dir: Path, experiment: str, is_chief: bool,
         warn: Optional[Callable[[str], None]] = None) -> Optional[MlflowLog]:
    """The `MlflowLog` of a chief under `--mlflow`, else None."""
    if not uri or not is_chief:
        return None
    return MlflowLog(uri, run_dir, experiment, warn)
