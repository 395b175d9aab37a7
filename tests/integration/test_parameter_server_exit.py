"""How the worker and ps tasks of a parameter-server job end, as real processes on 127.0.0.1.

The tasks are started here, not by `python -m tftrain.launch`, which stops every
task as soon as one fails; here each task's own exit code is seen. (The launcher
and SLURM runs of a job that finishes are in test_multi_worker.py and test_slurm.py.)
Budget: about 60 s on 2 shared cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import portpicker
import pytest

from tests.conftest import REPO, SUBPROCESS_ENV

pytestmark = pytest.mark.integration

PY = sys.executable

FAILING_TASK = """\
import json, os
from tftrain.recipes.mnist import TASK

class ChiefFails(type(TASK)):
    def build_model(self):
        if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "chief":
            raise RuntimeError("simulated failure on the chief")
        return super().build_model()

task = ChiefFails()
"""

SERVE = """\
import sys
from tftrain.errors import JobFailed
from tftrain.runtime.cluster import validate_cluster
from tftrain.runtime.server import serve

chief, worker, wait_s, gone_s = sys.argv[1:]
cluster = validate_cluster({"chief": [chief], "worker": [worker], "ps": ["127.0.0.1:1"]}, "worker", 0)
try:
    serve(cluster, chief_wait_s=float(wait_s), chief_gone_s=float(gone_s))
except JobFailed as e:
    print(f"JobFailed: {e}", flush=True)
    sys.exit(1)
"""


def _env(tf_config=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    env.update(SUBPROCESS_ENV, TF_CPP_MIN_LOG_LEVEL="2")
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _address() -> str:
    return f"127.0.0.1:{portpicker.pick_unused_port()}"


@pytest.mark.timeout(200)
def test_a_failed_chief_makes_every_task_exit_1(tmp_path):
    (tmp_path / "failing.py").write_text(FAILING_TASK)
    cluster = {"chief": [_address()], "worker": [_address()], "ps": [_address()]}
    cmd = [PY, "-m", "tftrain.run", "failing.py:task", "--strategy", "parameter_server", "--train-examples", "256",
           "--batch-size", "64", "--epochs", "1", "--verbose", "2", "--run-dir", "run"]
    procs = {}
    try:
        for task_type in cluster:
            procs[task_type] = subprocess.Popen(
                cmd, cwd=tmp_path, env=_env({"cluster": cluster, "task": {"type": task_type, "index": 0}}),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        outputs = {t: p.communicate(timeout=150) for t, p in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = {t: p.returncode for t, p in procs.items()}
    last_lines = {t: err.strip().splitlines()[-3:] for t, (_, err) in outputs.items()}
    assert codes == {"chief": 1, "worker": 1, "ps": 1}, last_lines
    assert "run failed: RuntimeError: simulated failure on the chief" in outputs["chief"][1]
    for task_type in ("worker", "ps"):
        assert (f"run failed: JobFailed: the chief at {cluster['chief'][0]} reported that the parameter-server "
                "job failed") in outputs[task_type][1]


def _serve(chief: str, wait_s: float, gone_s: float) -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", SERVE, chief, _address(), str(wait_s), str(gone_s)], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout_s: float = 60) -> str:
    try:
        return proc.communicate(timeout=timeout_s)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(120)
def test_a_task_whose_chief_never_appears_exits_1_after_the_wait():
    chief = _address()  # nothing listens there
    proc = _serve(chief, wait_s=1, gone_s=30)
    output = _finish(proc)
    assert proc.returncode == 1, output[-3000:]
    assert f"JobFailed: the chief at {chief} did not appear within 1 s" in output


@pytest.mark.timeout(120)
def test_a_task_whose_chief_goes_away_without_a_status_exits_1():
    with socket.create_server(("127.0.0.1", 0)) as listener:  # stands in for the chief's gRPC server
        chief = f"127.0.0.1:{listener.getsockname()[1]}"
        proc = _serve(chief, wait_s=60, gone_s=1)
        try:
            lines = []
            while not any("worker:0: serving the parameter-server job" in line for line in lines[-1:]):
                lines.append(proc.stdout.readline())
                assert lines[-1], "".join(lines)[-3000:]  # the task ended before serving
            listener.settimeout(60)
            listener.accept()[0].close()  # the task has looked at the chief (its TCP probe arrived)
        except BaseException:
            _finish(proc, 1)
            raise
    output = _finish(proc)
    assert proc.returncode == 1, output[-3000:]
    assert f"JobFailed: the chief at {chief} went away without saying how the job ended" in output
