"""`--mlflow`: a run's settings, epoch metrics, final figures and files reach a real MLflow tracking
server, started on 127.0.0.1 by the test; a resumed run continues the same MLflow run."""

import os
import subprocess
import sys
import time
import urllib.request

import portpicker
import pytest

import tftrain
from tests.conftest import linear_regression_task, with_dev_extras

pytestmark = pytest.mark.integration


def _task():
    return linear_regression_task("mlflow-task")


@pytest.fixture
def tracking_server(tmp_path):
    """`mlflow server` on 127.0.0.1 (SQLite store, artifacts served by the server); its URI."""
    port = portpicker.pick_unused_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                               "--artifacts-destination", str(tmp_path / "artifacts")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env=with_dev_extras(dict(os.environ)))  # the server needs pandas
    uri, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    try:
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=5).read()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        yield uri
    finally:
        import signal

        os.killpg(server.pid, signal.SIGTERM)  # the server and its gunicorn / uvicorn workers
        server.wait(timeout=30)


def test_a_run_and_its_resume_are_one_mlflow_run_with_settings_metrics_and_files(tmp_path, tracking_server):
    import keras
    from mlflow.tracking import MlflowClient

    class CtrlC(keras.callbacks.Callback):  # after tftrain's own callbacks: epoch 0 is backed up
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    run_dir = tmp_path / "run"
    settings = dict(epochs=3, batch_size=32, execution="graph", verbose=0, seed=0, run_dir=str(run_dir),
                    mlflow=tracking_server)
    with pytest.raises(tftrain.Interrupted):
        tftrain.Trainer(_task(), callbacks=[CtrlC()], **settings).fit()
    client = MlflowClient(tracking_server)
    [experiment] = [e for e in client.search_experiments() if e.name == "mlflow-task"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "KILLED" and run.info.run_name == "run"
    record = tftrain.Trainer(_task(), **settings).fit()  # resumes at epoch 1, into the same MLflow run
    assert record.resumed_from_epoch == 1
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and (run_dir / "mlflow_run_id").read_text().strip() == run.info.run_id
    assert run.data.params["train.epochs"] == "3" and run.data.params["run.execution"] == "graph"
    assert run.data.params["data.batch_size"] == "32"
    history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in history] == [0, 1, 2]  # every epoch, the killed attempt's and the resumed ones
    assert [m.value for m in history] == pytest.approx(record.history["loss"], rel=1e-6)
    assert run.data.metrics["test_loss"] == pytest.approx(record.test["loss"], rel=1e-6)
    assert run.data.metrics["examples_per_sec"] > 0
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.keras", "metrics.json", "report.md", "config.yaml", "history.csv"} <= files


def test_mlflow_missing_is_refused_before_training(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with pytest.raises(tftrain.ConfigError, match=r"pip install 'tftrain\[mlflow\]'"):
        tftrain.Trainer(_task(), epochs=1, verbose=0, run_dir=str(tmp_path / "run"), mlflow="default").fit()
    assert not (tmp_path / "run").exists()


def test_an_unreachable_tracking_server_is_one_warning_and_the_run_still_finishes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries would take minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    uri = f"http://127.0.0.1:{portpicker.pick_unused_port()}"  # nothing listens there
    record = tftrain.Trainer(_task(), epochs=2, batch_size=32, execution="graph", verbose=1, seed=0,
                             run_dir=str(tmp_path / "run"), mlflow=uri).fit()
    assert record.epochs_trained == 2 and (tmp_path / "run" / "metrics.json").is_file()
    assert not (tmp_path / "run" / "backup").exists()  # the run directory was finished as usual
    err = capsys.readouterr().err
    assert err.count(f"--mlflow {uri}: could not open the MLflow run") == 1, err[-2000:]
    assert "the run goes on without MLflow logging" in err
