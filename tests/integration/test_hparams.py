"""Every run's settings and final figures reach TensorBoard's HParams dashboard: a real TensorBoard
server, started on 127.0.0.1 by the test, compares two runs of one folder."""

import json
import subprocess
import sys
import time
import urllib.request

import portpicker
import pytest

import tftrain
from tests.conftest import linear_regression_task

pytestmark = pytest.mark.integration


def _task():
    return linear_regression_task("hparams")


def _post(port: int, route: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/{route}",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _experiment(port: int, sessions: int, deadline_s: float = 90) -> dict:
    """The dashboard's experiment once TensorBoard has loaded `sessions` sessions."""
    deadline, last = time.monotonic() + deadline_s, None
    while time.monotonic() < deadline:
        try:
            last = _post(port, "session_groups", {"experimentName": "", "startIndex": 0, "sliceSize": 10,
                                                  "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS"]})
            if len(last.get("sessionGroups", [])) == sessions:
                return _post(port, "experiment", {"experimentName": ""})
        except OSError:  # not listening yet, or still loading the event files
            pass
        time.sleep(1)
    raise AssertionError(f"TensorBoard did not show {sessions} sessions within {deadline_s:.0f} s: {last}")


def test_tensorboard_compares_runs_of_a_folder_in_the_hparams_dashboard(tmp_path):
    records = {}
    for rate in (0.01, 0.1):
        run_dir = tmp_path / "runs" / f"lr-{rate}"
        records[rate] = tftrain.Trainer(_task(), epochs=2, batch_size=32, learning_rate=rate, execution="graph",
                                        verbose=0, seed=0, run_dir=str(run_dir)).fit()
    tuned = tftrain.Trainer(_task(), epochs=1, batch_size=32, tune=2, validation_split=0.25, execution="graph",
                            verbose=0, seed=0, run_dir=str(tmp_path / "runs" / "tuned")).fit()
    port = portpicker.pick_unused_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path / "runs"),
                               "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false",
                               "--reload_interval", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        experiment = _experiment(port, sessions=5)  # two runs, the tuned run and its two trials
        groups = _post(port, "session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 10, "allowedStatuses": ["STATUS_UNKNOWN"],
            "colParams": [{"hparam": "train.learning_rate"}, {"metric": {"tag": "test_loss", "group": ""}}]})
    finally:
        server.terminate()
        server.wait(timeout=30)
    hparams = {h["name"] for h in experiment["hparamInfos"]}
    assert {"train.learning_rate", "train.epochs", "run.execution", "run.precision", "run.global_batch_size"} <= hparams
    metrics = {(m["name"].get("group", ""), m["name"]["tag"]) for m in experiment["metricInfos"]}
    assert {("", "test_loss"), ("", "test_mae"), ("", "examples_per_sec"), ("", "wall_time_s")} <= metrics
    assert {"tune.learning_rate", "tune.batch_size"} <= hparams and ("", "val_loss") in metrics  # the trials
    seen, trials = {}, {}
    for group in groups["sessionGroups"]:
        values = {v["name"]["tag"]: v["value"] for v in group["metricValues"] if not v["name"].get("group")}
        if "train.learning_rate" in group["hparams"] and group["hparams"].get("train.tune", 0) == 0:
            seen[group["hparams"]["train.learning_rate"]] = values["test_loss"]
        elif "tune.learning_rate" in group["hparams"]:
            trials[group["hparams"]["tune.learning_rate"]] = values["val_loss"]
    assert seen.keys() == records.keys()  # each run's own learning rate, next to its own test loss
    ranked = {r["hyperparameters"]["learning_rate"]: r["score"] for r in tuned.extras["tuning"]["ranking"]}
    assert trials == pytest.approx(ranked)  # each trial's validation score, as keras-tuner ranked it
    for rate, record in records.items():
        assert seen[rate] == pytest.approx(record.test["loss"], rel=1e-6)
