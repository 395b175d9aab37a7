"""`--backup-every-steps` as a user meets it: the MNIST recipe killed (SIGKILL) mid-epoch, then rerun."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import SUBPROCESS_ENV, optimizer_steps, read_metrics, run_module

pytestmark = pytest.mark.integration

MODULE = "tftrain.recipes.mnist"


def _kill_at_a_mid_epoch_checkpoint(args, run_dir, cwd, timeout=180):
    """Starts the recipe and kills it (SIGKILL: no clean-up, no last save) as soon as a checkpoint
    written inside an epoch exists; returns the checkpoint's metadata as the kill left it."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.Popen([sys.executable, "-m", MODULE, *map(str, args)], cwd=cwd, env={**env, **SUBPROCESS_ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    meta = run_dir / "backup" / "training_metadata.json"
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if meta.exists() and json.loads(meta.read_text()).get("steps_in_epoch", 0) > 0:  # written whole
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run finished before a mid-epoch checkpoint: " + proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return json.loads(meta.read_text())


def test_a_run_killed_mid_epoch_resumes_at_its_step_and_takes_the_uninterrupted_step_count(tmp_path):
    run_dir = tmp_path / "run"
    # 16,384 examples / 512 = 32 steps per epoch, in executions of 8 (the recipe's default); a checkpoint every 8.
    args = ["--train-examples", "16384", "--batch-size", "512", "--epochs", "2", "--backup-every-steps", "8",
            "--execution", "graph", "--verbose", "2", "--seed", "0", "--run-dir", run_dir]
    saved = _kill_at_a_mid_epoch_checkpoint(args, run_dir, tmp_path)
    assert 0 < saved["steps_in_epoch"] < 32 and saved["steps_in_epoch"] % 8 == 0, saved
    assert not (run_dir / "metrics.json").exists()

    r = run_module(MODULE, args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"resuming: {saved['epoch']}/2 epochs done and {saved['steps_in_epoch']} optimizer steps of the next, "
            f"from the checkpoint in {run_dir / 'backup'}") in r.stdout
    assert "backup:    every 8 optimizer steps and at each epoch end" in r.stdout
    m = read_metrics(run_dir)
    assert m["steps_per_epoch"] == 32 and m["optimizer_steps"] == 2 * 32  # as an uninterrupted run: none twice
    assert optimizer_steps(run_dir) == 2 * 32  # the saved model's own count
    assert m["backup"] == {"every_steps": 8, "resumed_from": saved}
    assert m["resumed_from_epoch"] == saved["epoch"] and m["epochs_trained"] == 2 - saved["epoch"]
