"""Tests of the local launcher (tftrain/launch.py) with tiny Python tasks (no TensorFlow)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tftrain import launch
from tftrain.runtime.cluster import parse_tf_config

from tests.conftest import REPO, SUBPROCESS_ENV

PY = sys.executable


def _launch(args, timeout=60, **kwargs):
    env = {**os.environ, **SUBPROCESS_ENV}
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [PY, "-m", "tftrain.launch", *map(str, args)], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=timeout, **kwargs,
    )


def _started_pids(stderr: str) -> dict:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"started (\S+) \(pid (\d+)\)", stderr)}


def _alive_in_groups(pgids) -> list:
    """Live (non-zombie) processes whose process group is one of `pgids`."""
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) in pgids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def _task_script(tmp_path, body: str) -> str:
    """A Python task that knows its task type/index from TF_CONFIG."""
    path = tmp_path / "task.py"
    path.write_text(
        "import json, os, sys, time\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "name = f\"{task['type']}:{task['index']}\"\n" + textwrap.dedent(body)
    )
    return str(path)


def test_make_cluster_gives_each_task_its_own_loopback_port():
    cluster = launch.make_cluster(2, ps=1, chief=True)
    assert list(cluster) == ["chief", "worker", "ps"]
    addresses = [a for v in cluster.values() for a in v]
    assert len(addresses) == 4 and len(set(addresses)) == 4
    assert all(a.startswith("127.0.0.1:") for a in addresses)


def test_task_tf_config_round_trips_through_the_validator():
    cluster = launch.make_cluster(2, ps=1, chief=True, pick_port=iter(range(20000, 20010)).__next__)
    tasks = launch.tasks_of(cluster)
    assert [t.task for t in tasks] == ["chief:0", "worker:0", "worker:1", "ps:0"]
    info = parse_tf_config(tasks[2].to_tf_config())
    assert info.task == "worker:1" and info.address == "127.0.0.1:20002" and info.num_ps == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0", "--", PY], "--workers must be an integer >= 1"),
        (["--workers", "1", "--ps", "1", "--", PY], "needs --chief"),
        (["--workers", "2"], "No command given"),
        (["--workers", "2", PY, "-c", "pass"], f"Put '--' before the command every task runs: python -m tftrain.launch "
                                               f"--workers 2 -- {PY} -c pass"),
        (["--chief", "--workers", "1", PY, "train.py", "--ps", "1"],  # the command's own flags stay in it
         f"Put '--' before the command every task runs: python -m tftrain.launch --chief --workers 1 -- {PY} train.py "
         "--ps 1"),
        (["--workers", "2", "--bogus", "--", PY], "unrecognized arguments: --bogus"),
        (["--workers", "two", "--", PY], "invalid int value"),
        (["--workers", "1", "--timeout", "0", "--", PY], "--timeout must be a positive"),
        (["--workers", "1", "--server-wait", "-1", "--", PY], "--server-wait must be >= 0 seconds"),
        (["--workers", "1", "--max-restarts", "-1", "--", PY], "--max-restarts must be an integer >= 0"),
        (["--workers", "1", "--", "no-such-program-tftrain"], "Cannot start 'no-such-program-tftrain'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert launch.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_every_task_runs_with_its_own_tf_config_and_prefixed_output(tmp_path):
    script = _task_script(tmp_path, """
        print(f"hello from {name}")
        print("to stderr", file=sys.stderr)
    """)
    result = _launch(["--workers", "2", "--chief", "--", PY, script])
    assert result.returncode == 0, result.stderr
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}] hello from {task}" in result.stdout
        assert f"[{task}] to stderr" in result.stderr
    assert "job finished" in result.stderr


@pytest.mark.slow
def test_crashing_worker_stops_the_job_and_leaves_no_process(tmp_path):
    # worker:1 crashes; the others would wait forever (as a real worker waits for its peers).
    script = _task_script(tmp_path, """
        if name == "worker:1":
            time.sleep(0.5)
            sys.exit(3)
        time.sleep(300)
    """)
    # The others sleep 300 s: the launcher ends within _launch's 60 s subprocess timeout only by stopping them.
    result = _launch(["--workers", "3", "--grace", "2", "--", PY, script])
    assert result.returncode == 3, result.stderr
    assert "worker:1 exited with code 3; stopping worker:0, worker:2" in result.stderr
    assert result.stderr.splitlines()[-1].endswith(
        "the job stopped: worker:1 exited with code 3. Its tasks' lines above say why; no run directory was made, so "
        "the same command starts the run again")
    pids = _started_pids(result.stderr)
    assert len(pids) == 3
    assert _alive_in_groups(set(pids.values())) == []


def test_a_task_refusing_bad_input_ends_the_job_without_resume_advice(tmp_path):
    script = _task_script(tmp_path, """
        sys.exit(2)  # as a training command refuses bad input, before any work
    """)
    result = _launch(["--workers", "2", "--grace", "2", "--", PY, script])
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1].endswith("Its tasks' lines above say why; nothing trained: fix what they "
                                                   "name, then run the command again")


def test_task_killed_by_a_signal_reports_it_as_128_plus_n(tmp_path):
    script = _task_script(tmp_path, """
        if name == "worker:0":
            os.kill(os.getpid(), 9)
        time.sleep(300)
    """)
    result = _launch(["--workers", "2", "--grace", "2", "--", PY, script])
    assert result.returncode == 137
    assert "worker:0 was killed by SIGKILL (exit code 137)" in result.stderr


@pytest.mark.slow
def test_timeout_names_the_stalled_task_and_tears_down_its_children(tmp_path):
    # Every task starts a grandchild in its own process group; worker:1 then stalls silently.
    script = _task_script(tmp_path, """
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        while True:
            if name != "worker:1":
                print("step", flush=True)
            time.sleep(0.2)
    """)
    result = _launch(["--workers", "2", "--timeout", "3", "--grace", "2", "--", PY, script])
    assert result.returncode == launch.EXIT_TIMEOUT
    assert re.search(r"timeout: 3 s passed; worker:1 stalled \(no output for [\d.]+ s\)", result.stderr), result.stderr
    pids = _started_pids(result.stderr)
    assert _alive_in_groups(set(pids.values())) == []


@pytest.mark.slow
def test_parameter_server_job_waits_for_servers_that_exit_after_the_chief(tmp_path):
    # tftrain's worker and ps tasks exit by themselves once the chief has finished.
    script = _task_script(tmp_path, """
        if name == "chief:0":
            time.sleep(0.5)
            open(sys.argv[1], "w").close()
            sys.exit(0)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        time.sleep(1)
        print(f"{name} done", flush=True)
    """)
    result = _launch(["--chief", "--workers", "2", "--ps", "1", "--grace", "2", "--", PY, script, tmp_path / "done"])
    assert result.returncode == 0, result.stderr
    for name in ("chief:0", "worker:0", "worker:1", "ps:0"):
        assert f"tftrain.launch: {name} exited with code 0\n" in result.stderr
    assert "tftrain.launch: job finished\n" in result.stderr  # nothing left to stop
    assert sorted(re.findall(r"\] (\S+) done", result.stdout)) == ["ps:0", "worker:0", "worker:1"]


@pytest.mark.slow
def test_parameter_server_job_fails_when_a_server_fails_after_the_chief(tmp_path):
    script = _task_script(tmp_path, """
        if name == "chief:0":
            sys.exit(0)
        time.sleep(1)
        sys.exit(3 if name == "ps:0" else 0)
    """)
    result = _launch(["--chief", "--workers", "1", "--ps", "1", "--grace", "2", "--", PY, script])
    assert result.returncode == 3, result.stderr
    assert "tftrain.launch: ps:0 exited with code 3" in result.stderr
    assert "the chief had finished the job (exit code 0): its run is complete, nothing to rerun" in result.stderr


@pytest.mark.slow
def test_parameter_server_job_stops_servers_still_serving_after_server_wait(tmp_path):
    # Servers that join() forever (TensorFlow's tutorial) are stopped; the chief's exit code counts.
    script = _task_script(tmp_path, """
        if name == "chief:0":
            time.sleep(0.5)
            sys.exit(0)
        time.sleep(300)
    """)
    result = _launch(["--chief", "--workers", "2", "--ps", "1", "--grace", "2", "--server-wait", "1", "--",
                      PY, script])
    assert result.returncode == 0, result.stderr
    assert ("job finished; worker:0, worker:1, ps:0 still serving 1 s after the chief finished: "
            "stopping them") in result.stderr
    assert _alive_in_groups(set(_started_pids(result.stderr).values())) == []


@pytest.mark.slow
def test_parameter_server_job_goes_on_without_a_failed_worker_while_another_runs(tmp_path):
    # ParameterServerStrategy reschedules a lost worker's steps on the others: the job must not stop.
    script = _task_script(tmp_path, """
        if name == "worker:1":
            sys.exit(3)
        time.sleep(1.5 if name == "chief:0" else 2)
    """)
    result = _launch(["--chief", "--workers", "2", "--ps", "1", "--grace", "2", "--", PY, script])
    assert result.returncode == 0, result.stderr
    assert ("worker:1 exited with code 3; the parameter-server job goes on with worker:0 (the chief's "
            "coordinator reschedules its steps)") in result.stderr
    assert "tftrain.launch: chief:0 exited with code 0" in result.stderr and "job finished" in result.stderr


def test_parameter_server_job_stops_when_its_last_worker_fails(tmp_path):
    script = _task_script(tmp_path, """
        if name == "worker:0":
            sys.exit(3)
        time.sleep(300)
    """)
    result = _launch(["--chief", "--workers", "1", "--ps", "1", "--grace", "2", "--", PY, script])
    assert result.returncode == 3, result.stderr
    assert "worker:0 exited with code 3; stopping chief:0, ps:0" in result.stderr


@pytest.mark.slow
def test_max_restarts_restarts_a_parameter_server_worker_alone(tmp_path):
    # worker:0 fails on its first start only; the restarted one runs until the chief is done.
    script = _task_script(tmp_path, """
        marker = sys.argv[1] + "-" + name
        if name == "worker:0" and not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(3)
        time.sleep(2 if name == "chief:0" else 2.5)
    """)
    result = _launch(["--chief", "--workers", "1", "--ps", "1", "--grace", "2", "--max-restarts", "2", "--",
                      PY, script, tmp_path / "started"])
    assert result.returncode == 0, result.stderr
    assert ("worker:0 exited with code 3; restarting it (restart 1 of 2); the chief's coordinator takes it back"
            in result.stderr)
    started = re.findall(r"started (\S+) \(pid", result.stderr)
    assert sorted(started) == ["chief:0", "ps:0", "worker:0", "worker:0"]  # the worker alone, once more


@pytest.mark.slow
def test_max_restarts_restarts_a_synchronous_job_whole_and_stops_beyond_it(tmp_path):
    # Without ps tasks (MultiWorkerMirrored) the workers run in lockstep: the whole job restarts.
    script = _task_script(tmp_path, """
        count = sys.argv[1] + "-" + name
        runs = len(open(count).read()) if os.path.exists(count) else 0
        open(count, "a").write(os.environ.get("TFTRAIN_RESTART_COUNT", "0"))  # one digit a start
        if name == "worker:1" and runs < int(sys.argv[2]):
            time.sleep(0.3)
            sys.exit(3)
        time.sleep(1 if name == "worker:1" else 300 if runs < int(sys.argv[2]) else 1)
    """)
    result = _launch(["--workers", "2", "--grace", "2", "--max-restarts", "1", "--", PY, script,
                      tmp_path / "runs", 1])
    assert result.returncode == 0, result.stderr
    assert ("worker:1 exited with code 3; restarting the job, which resumes from its checkpoint (restart 1 of 1)"
            in result.stderr)
    assert sorted(re.findall(r"started (\S+) \(pid", result.stderr)) == ["worker:0", "worker:0", "worker:1", "worker:1"]
    assert _alive_in_groups(set(_started_pids(result.stderr).values())) == []
    # The restarted tasks are told they are a restart (a chief that had finished then exits 0).
    assert [(tmp_path / f"runs-worker:{i}").read_text() for i in (0, 1)] == ["01", "01"]

    again = _launch(["--workers", "2", "--grace", "2", "--max-restarts", "1", "--", PY, script,
                     tmp_path / "fails", 2])  # fails twice: one restart, then the job stops
    assert again.returncode == 3, again.stderr
    assert "worker:1 exited with code 3; stopping worker:0" in again.stderr


def test_ctrl_c_stops_every_task(tmp_path):
    script = _task_script(tmp_path, """
        print("ready", flush=True)
        time.sleep(300)
    """)
    env = {**os.environ, **SUBPROCESS_ENV}
    env.pop("TF_CONFIG", None)
    proc = subprocess.Popen(
        [PY, "-m", "tftrain.launch", "--workers", "2", "--grace", "2", "--", PY, script],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready = 0
        while ready < 2:  # both tasks are up
            line = proc.stdout.readline()
            assert line, "launcher ended early"
            ready += "ready" in line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "got SIGINT; stopping 2 task(s)" in err
    assert [line.split(": ", 1)[1].split(" ")[0] for line in err.splitlines()[-2:]] == ["worker:0", "worker:1"]  # each
    # task's exit, as when the job ends by itself
    assert _alive_in_groups(set(_started_pids(err).values())) == []


def test_a_failed_task_stops_the_others_within_the_failure_grace(tmp_path):
    import time

    from tftrain.launch import FAILURE_GRACE_S

    script = tmp_path / "task.py"  # worker 1 ignores SIGTERM (a peer that cannot save), then worker 0 fails
    ready = tmp_path / "ready"
    script.write_text("import json, os, signal, sys, time\n"
                      "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
                      f"ready = {str(ready)!r}\n"
                      "if index == 0:\n"
                      "    while not os.path.exists(ready): time.sleep(0.05)\n"
                      "    sys.exit(3)\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen(ready, 'w').close()\ntime.sleep(120)\n")
    started = time.monotonic()
    result = _launch(["--workers", "2", "--grace", "60", "--", PY, script])
    assert result.returncode == 3 and "worker:0 exited with code 3" in result.stderr
    assert time.monotonic() - started < FAILURE_GRACE_S + 20  # not the 60 s --grace a signal would get


def test_the_resume_advice_names_the_run_directory_a_launch_without_one_made(tmp_path):
    from tftrain.launch import resume_advice

    recipe = ["python", "-m", "tftrain.recipes.mnist", "--epochs", "3"]
    assert resume_advice([*recipe, "--run-dir=r"], "20261206-1", tmp_path).endswith(
        "resumes from its last checkpoint when the same command runs again")  # the same command finds it
    assert resume_advice([*recipe, "--resume"], "20261206-1", tmp_path).endswith("when the same command runs again")
    assert resume_advice(recipe, "20261206-1", tmp_path) == ("no run directory was made, so the same command starts "
                                                            "the run again")
    (tmp_path / "mnist-20261206-1").mkdir()  # this launch's run: a new launch would make mnist-<its own id>
    (tmp_path / "mnist-20261206-0").mkdir()  # an earlier launch's
    assert resume_advice(recipe, "20261206-1", tmp_path) == (
        f"to go on with its run (from the last checkpoint, or its pending export), rerun the same command with "
        f"--run-dir {tmp_path / 'mnist-20261206-1'} added to the training command after -- (each launch starts a new "
        "run directory)")
