"""Multi-process training on 127.0.0.1 through `python -m tftrain.launch` (CPU only).

Budget on 2 shared cores: about 2 minutes for the whole file. Each test bounds its
processes twice: the launcher's `--timeout` and `subprocess`'s timeout (which
kills the launcher; its tasks then get SIGKILL from the kernel, PR_SET_PDEATHSIG).

A SIGTERM to a MultiWorkerMirrored job (both workers save one agreed step, exit 143, and the
rerun takes every step once) is tested under a real SLURM requeue in
tests/integration/test_slurm.py; the launcher passing SIGTERM on to every task is tested here,
on the parameter-server job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO, SUBPROCESS_ENV, checkpoint_metadata, optimizer_steps, read_metrics
from tftrain.checkpoint_files import BackupPosition, read_position

pytestmark = pytest.mark.integration

PY = sys.executable
RECIPE = [PY, "-m", "tftrain.recipes.mnist"]
# 32 steps/epoch of 128: long enough epochs to kill a worker inside one.
FLAGS = ["--train-examples", "4096", "--epochs", "3", "--verbose", "2", "--seed", "0", "--batch-size", "128"]
MWMS = ["--strategy", "multi_worker_mirrored", "--communication", "ring"]


def _env(tmp_dir):
    """Task environment: no inherited cluster, and a private TMPDIR to check for leftovers."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    tmp_dir.mkdir(exist_ok=True)
    return {**env, **SUBPROCESS_ENV, "TMPDIR": str(tmp_dir)}


def _launcher(launch_args, recipe_args, timeout_s, grace_s=3):
    return [PY, "-m", "tftrain.launch", *launch_args, "--timeout", str(timeout_s), "--grace", str(grace_s), "--",
            *RECIPE, *recipe_args]


def _started_pids(text: str) -> dict:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"started (\S+) \(pid (\d+)\)", text)}


def _alive(pids) -> list:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _run(cmd, env, timeout):
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """One uninterrupted 2-worker MultiWorkerMirrored run (shared by two tests), keeping its best epoch."""
    root = tmp_path_factory.mktemp("mwms")
    # No --run-dir: every task must derive the same default one (under root/runs).
    flags = [*MWMS, *FLAGS, "--keep-best", "1", "--monitor", "accuracy"]
    result = subprocess.run(_launcher(["--workers", "2"], flags, 240), cwd=root, env=_env(root / "tmp"),
                            capture_output=True, text=True, timeout=300)
    run_dirs = list((root / "runs").glob("mnist-*")) if (root / "runs").is_dir() else []
    return result, (run_dirs[0] if len(run_dirs) == 1 else root / "no-single-run-dir"), root / "tmp"


@pytest.mark.timeout(320)
def test_two_workers_multi_worker_mirrored(two_workers):
    result, run_dir, tmp_dir = two_workers
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert metrics["strategy_class"] == "KerasMultiWorkerMirroredStrategy"
    assert metrics["replicas"] == 2 and metrics["workers"] == 2 and metrics["cluster_source"] == "TF_CONFIG"
    assert metrics["global_batch_size"] == 128 and metrics["per_replica_batch_size"] == 64
    assert metrics["epochs_trained"] == 3 and metrics["test_accuracy"] > 0.85
    # Only the chief (worker 0) wrote the run directory; worker 1's temporary one is gone.
    assert (run_dir / "model.keras").is_file() and (run_dir / "logs").is_dir()
    assert not (run_dir / "backup").exists()  # BackupAndRestore removes it after a finished fit
    _assert_keeps_the_best_epoch(run_dir, metrics, "accuracy", max)
    assert "[worker:1] note:      worker:1 is not the chief" in result.stdout
    reported = set(re.findall(r"\[worker:\d\] run directory: (\S+)", result.stdout))
    assert reported == {f"runs/{run_dir.name}"}, reported  # both tasks name the one that exists
    assert list(tmp_dir.glob("tftrain-*")) == []
    # Both workers evaluated the same synchronised model.
    accuracies = re.findall(r"\[worker:(\d)\] test accuracy ([\d.]+)", result.stdout)
    assert len(accuracies) == 2 and accuracies[0][1] == accuracies[1][1]
    assert _alive(_started_pids(result.stderr).values()) == []


@pytest.mark.timeout(120)
def test_malformed_tf_config_is_one_line_and_exit_2(tmp_path):
    env = {**_env(tmp_path / "tmp"), "TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker"}}'}
    result = _run([*RECIPE, *MWMS, *FLAGS, "--run-dir", tmp_path / "run"], env, 120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "python -m tftrain.recipes.mnist: error: TF_CONFIG has no valid 'task'. Expected e.g. "
        '"task": {"type": "worker", "index": 0}. Received: task={\'type\': \'worker\'}.'
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_crashing_worker_ends_the_job_and_leaves_no_process(tmp_path):
    # worker:1 crashes while worker:0 runs the real recipe, which would wait for its peer forever.
    wrapper = tmp_path / "task.py"
    wrapper.write_text(
        "import json, os, sys, time\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "    time.sleep(2)\n"
        "    sys.exit('worker 1: simulated crash')\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'tftrain.recipes.mnist', *sys.argv[1:]])\n"
    )
    cmd = [PY, "-m", "tftrain.launch", "--workers", "2", "--timeout", "100", "--grace", "3", "--",
           PY, str(wrapper), *MWMS, *FLAGS, "--run-dir", str(tmp_path / "run")]
    # Without the stop, worker:0 would wait for its peer until the launcher's --timeout (exit 124) or
    # subprocess's timeout (an error here).
    result = _run(cmd, _env(tmp_path / "tmp"), 120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "worker:1 exited with code 1; stopping worker:0" in result.stderr
    assert "timeout:" not in result.stderr
    assert _alive(_started_pids(result.stderr).values()) == []


def _assert_keeps_the_best_epoch(run_dir, metrics, monitor, best):
    """`--keep-best 1`: the chief's `checkpoints/` ranks the run's `best` epoch by `monitor` (every worker saves
    at the same epochs, the others to their temporary directories)."""
    kept = json.loads((run_dir / "checkpoints" / "keep_best.json").read_text())
    values = metrics["history"][monitor]
    assert [k["epoch"] for k in kept] == [values.index(best(values)) + 1], (kept, values)
    assert kept[0]["value"] == pytest.approx(best(values))
    assert (run_dir / "checkpoints" / "best" / f"epoch-{kept[0]['epoch']}.index").is_file()
    assert metrics["keep_best"]["mode"] == ("max" if best is max else "min")


def _kill_in_epoch_2(cmd, env, watched: str, victim: str, timeout_s: float = 240, cwd=REPO):
    """Runs the launcher `cmd` (in `cwd`) and sends SIGKILL to task `victim` once task `watched` has begun epoch 2
    (so epoch 1's checkpoint is written); returns `(launcher exit code, its output, task pids)`. Fails the test
    when the job ends first."""
    launcher = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, killed, lines = {}, False, []
    try:
        deadline = time.monotonic() + timeout_s
        for line in launcher.stdout:
            lines.append(line)
            match = re.search(r"started (\S+) \(pid (\d+)\)", line)
            if match:
                pids[match.group(1)] = int(match.group(2))
            if not killed and line.startswith(f"[{watched}] Epoch 2/3"):
                time.sleep(0.5)  # into epoch 2: epoch 1's checkpoint is written
                os.kill(pids[victim], signal.SIGKILL)
                killed = True
            if time.monotonic() > deadline:
                break
        launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = "".join(lines)
    assert killed, output[-3000:]
    return launcher.returncode, output, pids


@pytest.mark.timeout(400)
def test_killed_worker_of_a_chief_and_worker_job_resumes_from_the_last_checkpoint(two_workers, tmp_path):
    # A chief and one worker (tensorflow/tensorflow#57372: such a job stalled at its first step).
    run_dir = tmp_path / "run"
    cmd = _launcher(["--chief", "--workers", "1"], [*MWMS, *FLAGS, "--keep-best", "1", "--run-dir", run_dir], 200)
    env = _env(tmp_path / "tmp")
    code, output, pids = _kill_in_epoch_2(cmd, env, watched="chief:0", victim="worker:0")
    assert code == 128 + signal.SIGKILL
    assert "worker:0 was killed by SIGKILL (exit code 137); stopping chief:0" in output
    assert _alive(pids.values()) == []
    assert not (run_dir / "metrics.json").exists()
    done = checkpoint_metadata(run_dir)["epoch"]
    assert 1 <= done < 3

    result = _run(cmd, env, 300)  # the same command resumes, and finishes
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"[chief:0] resuming: {done}/3 epochs done" in result.stdout
    assert f"[worker:0] resuming: {done}/3 epochs done" in result.stdout
    metrics = read_metrics(run_dir)
    assert metrics["replicas"] == 2 and metrics["global_batch_size"] == 128
    assert metrics["resumed_from_epoch"] == done and metrics["epochs_trained"] == 3 - done
    _assert_keeps_the_best_epoch(run_dir, metrics, "loss", min)  # ranked across the restart; the worker ranks alike
    uninterrupted = read_metrics(two_workers[1])["test_accuracy"]
    # Same model, data and epochs (chief and worker read the shards workers 0 and 1 read); only the
    # shuffle order after the restart differs.
    assert abs(metrics["test_accuracy"] - uninterrupted) < 0.03, (metrics["test_accuracy"], uninterrupted)
    assert list((tmp_path / "tmp").glob("tftrain-*")) == []


def _parameter_server_job(tmp_path, workers: int, flags=(), grace_s=3):
    """`(run directory, launcher command, task environment)` of a MNIST job: chief, `workers` workers, 1 ps."""
    run_dir = tmp_path / "run"
    cmd = _launcher(["--chief", "--workers", str(workers), "--ps", "1"],
                    ["--strategy", "parameter_server", *FLAGS, *flags, "--run-dir", run_dir], 200, grace_s)
    return run_dir, cmd, _env(tmp_path / "tmp")


@pytest.mark.timeout(400)
def test_parameter_server_job_outlives_a_killed_worker(tmp_path):
    # ParameterServerStrategy's coordinator reschedules a lost worker's steps on the others: losing one of two
    # workers slows the job down and does not fail it.
    run_dir, cmd, env = _parameter_server_job(tmp_path, workers=2)
    code, output, pids = _kill_in_epoch_2(cmd, env, watched="chief:0", victim="worker:1")
    assert code == 0, output[-3000:]
    assert ("worker:1 was killed by SIGKILL (exit code 137); the parameter-server job goes on with worker:0"
            in output)
    assert "chief:0: could not tell worker:1 that the job finished" in output  # named, not waited for
    metrics = read_metrics(run_dir)
    assert metrics["epochs_trained"] == 3 and len(metrics["history"]["loss"]) == 3
    # Every scheduled step ran (the killed worker's unfinished ones again, on worker:0): none is lost.
    assert optimizer_steps(run_dir) >= 3 * metrics["steps_per_epoch"]
    assert metrics["test_accuracy"] > 0.85
    assert _alive(pids.values()) == []


def _kill_at_a_mid_epoch_checkpoint(cmd, env, run_dir, victim: str, timeout_s: float = 240, signum=signal.SIGKILL):
    """Runs the launcher `cmd` and sends `signum` (SIGKILL) to task `victim` (or to the launcher itself,
    `victim="launcher"`) as soon as `run_dir`'s backup holds a checkpoint written by this run 8 or 16 steps into an
    epoch (a later save within 16 steps stays mid-epoch); returns `(launcher exit code, its output, task pids)`.
    Fails the test when the job ends first."""
    before = read_position(run_dir / "backup") or BackupPosition(0)  # a rerun's starting point: not its own save
    log = run_dir.parent / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    killed, deadline = False, time.monotonic() + timeout_s
    try:
        while not killed and launcher.poll() is None and time.monotonic() < deadline:
            saved = read_position(run_dir / "backup")
            if saved is not None and saved.steps_in_epoch in (8, 16) \
                    and (saved.epoch, saved.steps_in_epoch) > (before.epoch, before.steps_in_epoch):
                pids = _started_pids(log.read_text())
                os.kill(launcher.pid if victim == "launcher" else pids[victim], signum)
                killed = True
            time.sleep(0.005)
        launcher.wait(timeout=60 if signum == signal.SIGKILL else 120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = log.read_text()
    assert killed, output[-3000:]
    return launcher.returncode, output, _started_pids(output)


@pytest.mark.timeout(500)
def test_parameter_server_job_stops_on_sigterm_and_resumes_mid_epoch_after_a_killed_chief(tmp_path):
    # The chief (the coordinator) joins every 8 scheduled steps and saves there. One worker keeps the job short;
    # the exact step count under two workers is checked in tests/integration/test_own_task.py.
    run_dir, cmd, env = _parameter_server_job(tmp_path, workers=1, flags=["--backup-every-steps", "8"], grace_s=30)
    # SIGTERM to the launcher, which passes it on to every task: the chief saves at its next join and tells the
    # worker and ps tasks (which ignore the signal while they serve), and every task exits 143. Sent at a checkpoint
    # 8 or 16 steps into an epoch, so that the checkpoint it saves is followed by mid-epoch ones in the rerun.
    code, output, pids = _kill_at_a_mid_epoch_checkpoint(cmd, env, run_dir, victim="launcher", signum=signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    stop = re.search(r"\[chief:0\] .*stopped by SIGTERM: checkpoint saved at (?:the end of epoch \d|epoch \d, batch "
                     r"\d+) \(optimizer step (\d+)\)", output)
    assert stop, output[-3000:]
    for task in ("worker:0", "ps:0"):  # told by the chief, not ended by the signal
        assert f"[{task}] python -m tftrain.recipes.mnist: {task}: the chief at" in output
    saved = read_position(run_dir / "backup")
    assert saved.optimizer_iterations == int(stop.group(1)) == 32 * saved.epoch + saved.steps_in_epoch
    assert _alive(pids.values()) == []

    # The rerun resumes at that step; SIGKILL its chief at a checkpoint written within an epoch.
    code, output, pids = _kill_at_a_mid_epoch_checkpoint(cmd, env, run_dir, victim="chief:0")
    assert code == 128 + signal.SIGKILL, output[-3000:]
    resumed = f"resuming: {saved.epoch}/3 epochs done" + (
        f" and {saved.steps_in_epoch} optimizer steps of the next" if saved.steps_in_epoch else "")
    assert f"[chief:0] {resumed}" in output
    assert "chief:0 was killed by SIGKILL (exit code 137); stopping" in output
    assert _alive(pids.values()) == []
    assert not (run_dir / "metrics.json").exists()
    killed = read_position(run_dir / "backup")
    assert killed.steps_in_epoch > 0 and killed.optimizer_iterations == 32 * killed.epoch + killed.steps_in_epoch

    result = _run(cmd, env, 300)  # the same command resumes on the chief at that step
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"[chief:0] resuming: {killed.epoch}/3 epochs done and {killed.steps_in_epoch} optimizer steps of the "
            "next" in result.stdout)
    metrics = read_metrics(run_dir)
    assert metrics["strategy_class"] == "ParameterServerStrategyV2" and set(metrics["history"]) == {"accuracy", "loss"}
    assert metrics["resumed_from_epoch"] == killed.epoch
    assert len(metrics["history"]["loss"]) == 3  # the whole run (history.csv), all three processes
    # A resumed epoch runs only its remaining steps: every step once, none lost, none repeated.
    assert optimizer_steps(run_dir) == 3 * metrics["steps_per_epoch"] == 3 * 32
    assert metrics["test_accuracy"] > 0.85
    assert _alive(_started_pids(result.stderr).values()) == []


@pytest.mark.timeout(400)
def test_the_printed_advice_resumes_a_multi_worker_job_started_without_run_dir(tmp_path):
    # The launcher gives each job its own run id, so the rerun's default directory is new: --resume must find the
    # interrupted run (every task the same one) instead of training a new run from step 0.
    # Six epochs: the SIGTERM sent in epoch 2 lands well before the end, however late a loaded machine
    # relays the worker's "Epoch 2" line.
    flags = [*MWMS, *FLAGS[:FLAGS.index("--epochs")], "--epochs", "6", *FLAGS[FLAGS.index("--epochs") + 2:]]
    cmd = _launcher(["--workers", "2"], flags, 200)
    env = _env(tmp_path / "tmp")
    launcher = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, sent = [], False
    try:
        for line in launcher.stdout:
            lines.append(line)
            if not sent and line.startswith("[worker:0] Epoch 2/6"):
                time.sleep(0.5)  # into epoch 2: epoch 1's checkpoint is written
                launcher.send_signal(signal.SIGTERM)
                sent = True
        launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = "".join(lines)
    assert sent and launcher.returncode == 128 + signal.SIGTERM, output[-3000:]
    advice = re.search(r"To resume, rerun the same python -m tftrain.launch command with --run-dir \S+ \(--resume "
                       r"takes the newest unfinished run of these settings\) added to the training command after --",
                       output)
    assert advice, output[-3000:]
    (first,) = list((tmp_path / "runs").iterdir())
    assert not (first / "metrics.json").exists()
    again = subprocess.run(cmd + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert list((tmp_path / "runs").iterdir()) == [first]  # no new run directory
    assert "[worker:0] resuming: " in again.stdout and (first / "metrics.json").is_file()


_KILLED_IN_EXPORT = """
import os, runpy, signal, sys
from tftrain.train import export

if os.environ.get("KILL_IN_EXPORT") and os.environ["TF_CONFIG"].find('"index": 0') > 0:  # the chief exports
    export_all = export.export_all
    def killed(model, formats, directory, features):  # the run's export, not the check before training
        if str(directory).endswith(os.path.join("run", "export")):
            os.kill(os.getpid(), signal.SIGKILL)
        return export_all(model, formats, directory, features)
    export.export_all = killed
sys.argv = ["tftrain.recipes.mnist", *sys.argv[1:]]
runpy.run_module("tftrain.recipes.mnist", run_name="__main__")
"""


@pytest.mark.timeout(300)
def test_a_chief_killed_in_its_export_is_finished_by_the_same_launcher_command(tmp_path):
    # The rerun does only the export, on the chief: the other workers leave at once, so the chief must not
    # wait for them in MultiWorkerMirroredStrategy's set-up.
    flags = [*MWMS, "--train-examples", "512", "--epochs", "1", "--batch-size", "64", "--seed", "0",
             "--export", "saved_model", "--run-dir", "run"]
    cmd = [PY, "-m", "tftrain.launch", "--workers", "2", "--timeout", "120", "--grace", "3", "--",
           PY, "-c", _KILLED_IN_EXPORT, *flags]
    env = _env(tmp_path / "tmp")
    killed = subprocess.run(cmd, cwd=tmp_path, env={**env, "KILL_IN_EXPORT": "1"}, capture_output=True, text=True,
                            timeout=150)
    assert killed.returncode != 0 and "worker:0 was killed by SIGKILL" in killed.stderr, killed.stderr[-3000:]
    assert read_metrics(tmp_path / "run")["after_steps"] == {"export": "pending"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "doing only its pending after-step(s): export" in done.stdout
    assert read_metrics(tmp_path / "run")["after_steps"] == {"export": "done"}
    assert (tmp_path / "run" / "export" / "saved_model" / "saved_model.pb").is_file()


@pytest.mark.timeout(400)
def test_the_launcher_s_advice_after_a_killed_worker_resumes_a_job_started_without_run_dir(tmp_path):
    # Each launch has a new run id, so "the same command" alone would start a new run from step 0.
    cmd = _launcher(["--workers", "2"], [*MWMS, *FLAGS, "--backup-every-steps", "8", "--steps-per-execution", "1"],
                    200)
    env = _env(tmp_path / "tmp")
    _, output, _ = _kill_in_epoch_2(cmd, env, "worker:0", "worker:1", cwd=tmp_path)
    (first,) = list((tmp_path / "runs").iterdir())
    advice = re.search(r"rerun the same command with --run-dir (\S+) added to the training command after --", output)
    assert advice and advice.group(1) == f"runs/{first.name}", output[-3000:]
    again = subprocess.run(cmd + ["--run-dir", advice.group(1)], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "[worker:0] resuming: 1/3 epochs done" in again.stdout and list((tmp_path / "runs").iterdir()) == [first]
    assert optimizer_steps(first) == 3 * 32
