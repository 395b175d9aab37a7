"""The MNIST recipe with the callback flags: --profile, --tune (subprocesses). `--batch-size auto` on the
command line: tests/integration/test_own_task.py (the regression task under mirrored)."""

import pytest

from tests.conftest import REPO, SMOKE, read_metrics, run_module
from tests.profile_traces import read_xspace, stat_values, step_markers

pytestmark = pytest.mark.integration

RECIPE = "tftrain.recipes.mnist"


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def refused(proc):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_profile_and_throughput_under_steps_per_execution(tmp_path):
    run_dir = tmp_path / "run"
    proc = ok(run_module(RECIPE, [*SMOKE, "--epochs", "2", "--steps-per-execution", "4", "--profile", "4,12",
                                  "--batch-size", "128", "--run-dir", run_dir], cwd=REPO))
    metrics = read_metrics(run_dir)
    # The keys the recipe always wrote are still there.
    for key in ("test_accuracy", "test_loss", "examples_per_sec", "global_batch_size", "history", "versions"):
        assert key in metrics
    profile = metrics["profile"]
    assert profile["captured"] == [4, 12]  # real optimizer steps, not batch hooks
    (trace,) = profile["trace_files"]
    assert (run_dir / trace).is_file() and trace.endswith(".xplane.pb")
    # One step marker per execution, and no loop iterations left to hide them from the Overview
    # (tests/integration/test_tensorboard_profile.py reads the Overview of such a trace).
    space = read_xspace(run_dir / trace)
    assert step_markers(space, with_names=True) == [(4, "train(4 steps)"), (8, "train(4 steps)")]
    assert set(stat_values(space, "iter_num")) == {0}
    assert "the Overview counts one step per execution of 4 steps" in proc.stdout
    assert f"tensorboard --logdir {run_dir / 'logs'}" in proc.stdout
    throughput = metrics["throughput"]
    assert throughput["total_steps"] == 2 * 8  # 1024 examples / 128 per step, 2 epochs
    assert throughput["steps"] == 12  # the first execution (steps 0-3) is warm-up
    assert throughput["examples"] == 12 * 128
    assert throughput["step_time_median_s"] > 0 and throughput["step_time_p90_s"] >= throughput["step_time_median_s"]
    assert [e["epoch"] for e in throughput["epochs"]] == [0, 1]
    assert throughput["input"]["verdict"].startswith(("input-bound", "not input-bound"))
    assert "input:" in proc.stdout
    report = (run_dir / "report.md").read_text()
    assert "Step time, median" in report and "Input pipeline" in report


def test_profile_window_past_the_end_is_refused_before_training(tmp_path):
    run_dir = tmp_path / "run"
    line = refused(run_module(RECIPE, [*SMOKE, "--profile", "50,60", "--batch-size", "128", "--run-dir", run_dir],
                              cwd=REPO))
    assert "starts after the end of training, which runs 8 optimizer step(s)" in line
    assert "--profile 2,7" in line
    assert not run_dir.exists()


def test_bad_profile_and_batch_size_values_are_one_line_errors(tmp_path):
    assert "Expected START,STOP" in refused(run_module(RECIPE, [*SMOKE, "--profile", "5"], cwd=tmp_path))
    assert "invalid int or auto value: 'big'" in refused(run_module(RECIPE, [*SMOKE, "--batch-size", "big"],
                                                                     cwd=tmp_path))


def test_tune_with_mirrored_cpu_replicas(tmp_path):
    run_dir = tmp_path / "run"
    proc = ok(run_module(RECIPE, [*SMOKE, "--strategy", "mirrored", "--cpu-replicas", "2", "--tune", "2",
                                  "--validation-split", "0.1", "--run-dir", run_dir], cwd=REPO, timeout=600))
    metrics = read_metrics(run_dir)
    tuning = metrics["tuning"]
    assert tuning["trials"] == 2 and tuning["algorithm"] == "random"
    assert set(tuning["best"]) == {"learning_rate", "batch_size", "width"}
    assert metrics["replicas"] == 2
    assert metrics["global_batch_size"] == tuning["best"]["batch_size"]
    assert metrics["width"] == tuning["best"]["width"]
    assert (run_dir / "tuning" / "tuner" / "oracle.json").is_file()
    # Global examples: one optimizer step of the global batch, counted once (not per replica).
    assert metrics["train_examples"] == 1024 - 102  # the last 10% held out for validation
    steps_per_epoch = (1024 - 102) // metrics["global_batch_size"]
    assert metrics["throughput"]["total_steps"] == steps_per_epoch
    assert metrics["throughput"]["examples"] == metrics["throughput"]["steps"] * metrics["global_batch_size"]
    assert "tuning:    best val_accuracy" in proc.stdout


def test_tune_refuses_multi_worker_strategies(tmp_path):
    run_dir = tmp_path / "run"
    line = refused(run_module(RECIPE, [*SMOKE, "--strategy", "multi_worker", "--tune", "1", "--run-dir", run_dir],
                              cwd=REPO))
    assert ("keras-tuner runs each trial in one process; multi_worker_mirrored: every worker runs the same steps in "
            "lockstep") in line
    assert not run_dir.exists()


def test_tune_without_validation_data_is_refused_before_any_trial(tmp_path):
    run_dir = tmp_path / "run"
    line = refused(run_module(RECIPE, [*SMOKE, "--tune", "1", "--run-dir", run_dir], cwd=REPO))
    assert "--tune scores trials on validation data, never on the test set: pass --validation-split" in line
    assert not run_dir.exists()


def test_tune_and_auto_batch_size_together_are_refused(tmp_path):
    line = refused(run_module(RECIPE, [*SMOKE, "--tune", "2", "--batch-size", "auto", "--run-dir", tmp_path / "r"],
                              cwd=REPO))
    assert "--tune searches the batch size itself" in line
