"""MlflowLog on a resumed run whose kept MLflow run id is not on the server: said in one line, a new run opened."""

import pytest


@pytest.mark.slow  # MLflow's sqlite store sets its tables up: seconds
def test_a_kept_mlflow_run_id_the_server_lacks_is_said(tmp_path):
    from tftrain.train.mlflow_log import RUN_ID_FILE, MlflowLog

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_ID_FILE).write_text("not-a-run-id\n")
    said = []
    log = MlflowLog(f"sqlite:///{tmp_path / 'mlflow.db'}", run_dir, "tftrain", warn=said.append)
    run_id = log.start()
    assert run_id is not None and run_id != "not-a-run-id" and not log.broken
    assert len(said) == 1 and "the run's MLflow run 'not-a-run-id'" in said[0] and "logs to a new MLflow run" in said[0]
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_id


def test_a_file_store_mlflow_will_not_open_is_refused_before_training(tmp_path, monkeypatch):
    from tftrain.errors import ConfigError
    from tftrain.train.mlflow_log import check

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    import mlflow

    if int(mlflow.__version__.split(".")[0]) < 3:
        check(f"file:{tmp_path / 'mlruns'}")  # older MLflow opens it
        return
    with pytest.raises(ConfigError, match="MLflow keeps a file store only with MLFLOW_ALLOW_FILE_STORE=true set"):
        check(f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    check(f"file:{tmp_path / 'mlruns'}")
