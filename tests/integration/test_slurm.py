"""The SLURM templates (recipes/slurm/*.sbatch) on a real one-node SLURM on 127.0.0.1.

A module fixture writes `slurm.conf` into a temporary folder, starts `munged`,
`slurmctld` and `slurmd` in the foreground (each by its pid, with its own munge key
and socket, logs in the folder), waits until `sinfo` shows the node idle, and stops
them by pid at teardown. `.ci/run` installs the Debian packages (munge, slurmctld,
slurmd, slurm-client); the tests skip only when those binaries are missing.

The node is `localhost` (`NodeAddr=127.0.0.1`), so `SlurmClusterResolver` gives the
tasks `localhost:8888` ... `localhost:8891`. It declares 4 CPUs whatever the machine
has (`SlurmdParameters=config_overrides`): SLURM 22.05 refuses `--ntasks-per-node`
above a node's CPUs even with `--overcommit`, and the templates ask for tasks per
node. Each job then takes the whole node, so SLURM runs the two jobs one after the
other (both use ports 8888-8891). Accounting is off (no slurmdbd, so no `sacct`):
each task's exit code is read from slurmd's log (`SlurmdDebug=debug` logs `task N (PID)
exited with exit code C` per task), the job's from `scontrol show job`. Budget: about 90 s
on 2 shared cores.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import portpicker
import pytest

from tests.conftest import REPO, checkpoint_metadata, optimizer_steps, read_metrics

pytestmark = pytest.mark.integration

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel")
SMOKE = "--train-examples 512 --epochs 1 --batch-size 128 --seed 0 --execution graph"
# The multi-worker job is requeued in its second epoch (128 steps of 128 an epoch) and must resume. Two
# workers ran a 32-step epoch in about a second, which ended training before they agreed on a step to stop
# at, and the requeued job found the run finished: nothing left to resume, which this test is about.
REQUEUED = "--train-examples 16384 --epochs 2 --batch-size 128 --seed 0 --execution graph"
TEMPLATES = {"multi_worker": "mnist_multi_worker.sbatch", "parameter_server": "mnist_parameter_server.sbatch"}
# One node, over the templates' 2 nodes x 2 tasks: two workers for the multi-worker job (each task is a
# TensorFlow process; two show the synchronised model as well as four), four tasks for the parameter-server
# job (chief, ps, two workers).
ONE_NODE = {"multi_worker": ["--nodes=1", "--ntasks-per-node=2"], "parameter_server": ["--nodes=1", "--ntasks-per-node=4"]}
JOB_TIMEOUT_S = 240
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}

SLURM_CONF = """\
ClusterName=tftrain-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=30
SlurmdDebug=debug
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _stop(procs) -> None:
    """SIGTERM each daemon by pid (last started first), SIGKILL after 10 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for(condition, timeout_s: float, what: str, logs) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in logs if p.exists())
            pytest.fail(f"{what} within {timeout_s:g} s\n{tails}")
        time.sleep(0.2)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node SLURM; yields (the environment its clients need, with `SLURM_CONF`;
    its folder, holding `slurmd.log`)."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"SLURM binaries not installed ({', '.join(missing)}); "
                    "apt-get install munge slurmctld slurmd slurm-client")
    busy = [p for p in range(8888, 8892) if not _port_free(p)]
    assert not busy, f"ports {busy} are in use; SlurmClusterResolver gives the tasks ports 8888-8891"
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o700)  # munged refuses a key or socket others can reach
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, user=getpass.getuser(), ctld_port=portpicker.pick_unused_port(),
                                      slurmd_port=portpicker.pick_unused_port()))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM")}
    env["SLURM_CONF"] = str(conf)
    logs = [root / "munged.log", root / "slurmctld.log", root / "slurmd.log", root / "daemons.out"]
    out = open(root / "daemons.out", "w")
    procs = []
    try:
        procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={root}/munge.socket",
             f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"],
            stdout=out, stderr=subprocess.STDOUT))
        _wait_for((root / "munge.socket").exists, 10, "munged did not create its socket", logs)
        procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", conf], env=env, stdout=out,
                                      stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f", conf], env=env, stdout=out,
                                      stderr=subprocess.STDOUT))

        def idle():
            r = subprocess.run(["sinfo", "--noheader", "--format=%T"], env=env, capture_output=True, text=True)
            return r.stdout.strip() == "idle"

        _wait_for(idle, 30, "the node did not become idle", logs)
        yield env, root
    finally:
        _stop(procs)
        out.close()


def _job(job_id: str, env) -> dict:
    """`scontrol show job` as a dict (JobState, ExitCode, ...)."""
    text = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], env=env, capture_output=True,
                          text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """Submits both templates at once; SLURM runs them one after the other. The parameter-server job
    runs at smoke size; the multi-worker one trains 2 epochs and is requeued (`scontrol requeue`, as a
    preemption) once its first epoch is saved, and must come back and finish.

    Returns `{name: (job info, output text, job folder, exit code of each task by rank)}`.
    """
    slurm_env, slurm_root = slurm
    bin_dir = str(Path(sys.executable).parent)  # `python` in the templates is this environment's
    env = {**slurm_env, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "SLURM_LABELIO": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    submitted = {}
    for name, template in TEMPLATES.items():
        folder = tmp_path_factory.mktemp(name)
        cmd = ["sbatch", "--parsable", *ONE_NODE[name], f"--chdir={folder}", f"--output={folder}/job.out",
               str(REPO / "recipes" / "slurm" / template)]
        args = REQUEUED if name == "multi_worker" else SMOKE
        result = subprocess.run(cmd, env={**env, "TFTRAIN_ARGS": args}, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        submitted[name] = (result.stdout.strip().split(";")[0], folder)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    info, requeued, released = {}, False, False
    epoch_saved = submitted["multi_worker"][1] / "runs" / "mnist-slurm"
    try:
        while len(info) < len(submitted) and time.monotonic() < deadline:
            if not requeued and checkpoint_metadata(epoch_saved) is not None:  # in epoch 2: as a preemption would, mid-epoch
                time.sleep(0.5)
                done = subprocess.run(["scontrol", "requeue", submitted["multi_worker"][0]], env=env,
                                      capture_output=True, text=True, timeout=30)
                assert done.returncode == 0, done.stderr
                requeued = True
            for name, (job_id, _) in submitted.items():
                state = _job(job_id, env)
                if name not in info and state.get("JobState") in FINAL_STATES:
                    info[name] = state
                if requeued and not released and name == "multi_worker" and state.get("JobState") == "PENDING":
                    # SLURM holds a requeued job back for a while (its BeginTime); a test need not wait.
                    released = subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env,
                                              capture_output=True, timeout=30).returncode == 0
            time.sleep(0.5)
    finally:
        for job_id, _ in submitted.values():  # a job still running past the deadline
            subprocess.run(["scancel", job_id], env=env, capture_output=True)
    out = {}
    for name, (job_id, folder) in submitted.items():
        log = folder / "job.out"
        out[name] = (info.get(name, {"JobState": f"not finished within {JOB_TIMEOUT_S} s"}),
                     log.read_text() if log.exists() else "", folder, _task_exit_codes(slurm_root, job_id))
    return out


def _task_exit_codes(slurm_root: Path, job_id: str) -> dict:
    """Rank -> exit code of each task of the job's first srun step (`<job>.0`), from slurmd's log."""
    pattern = rf"\[{job_id}\.0\] task (\d+) \(\d+\) exited with exit code (\d+)"
    return {int(rank): int(code) for rank, code in re.findall(pattern, (slurm_root / "slurmd.log").read_text())}


def _check_job(job: dict, output: str, task_codes: dict, ranks: int = 4) -> None:
    """The job (its last run, when requeued) completed and every one of its `ranks` tasks exited 0."""
    if "resuming:" in output:  # a requeued job's output file holds both runs (--open-mode=append)
        output = output[output.rindex("resuming:"):]
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output[-3000:])
    assert task_codes == {rank: 0 for rank in range(ranks)}, output[-3000:]
    # srun names every task that ended non-zero or by a signal; none did.
    assert not re.search(r"srun: error: .*task \d+", output), output[-3000:]


@pytest.mark.timeout(300)
def test_multi_worker_template_runs_two_workers_and_a_requeued_job_resumes(jobs):
    job, output, folder, task_codes = jobs["multi_worker"]
    _check_job(job, output, task_codes, ranks=2)  # the requeued run's tasks
    assert job.get("Restarts") == "1", job
    # The requeue's SIGTERM: both workers saved one agreed step and exited 143; the rerun resumed there.
    stops = set(re.findall(r"stopped by SIGTERM: checkpoint saved at .*\(optimizer step (\d+)\)", output))
    assert len(stops) == 1 and len(re.findall(r"stopped by SIGTERM", output)) == 2, output[-3000:]
    assert re.search(r"resuming: [12]/2 epochs done", output), output[-3000:]
    assert set(re.findall(r"srun: error: .*task \d+: Exited with exit code (\d+)", output)) <= {"143"}
    run_dir = folder / "runs" / "mnist-slurm"
    metrics = read_metrics(run_dir)
    assert metrics["cluster_source"] == "SLURM" and metrics["workers"] == 2 and metrics["replicas"] == 2
    assert metrics["strategy_class"] == "KerasMultiWorkerMirroredStrategy"
    assert metrics["resumed_from_epoch"] >= 1 and optimizer_steps(run_dir) == 2 * 128  # none lost, none repeated
    accuracies = re.findall(r"^(\d): test accuracy ([\d.]+)", output, re.MULTILINE)
    assert sorted(rank for rank, _ in accuracies) == ["0", "1"], output[-3000:]
    assert len({accuracy for _, accuracy in accuracies}) == 1  # one synchronised model


@pytest.mark.timeout(300)
def test_parameter_server_template_every_task_exits_0(jobs):
    job, output, folder, task_codes = jobs["parameter_server"]
    _check_job(job, output, task_codes)  # every task exited 0, not killed by srun's --wait
    metrics = read_metrics(folder / "runs" / "mnist-slurm-ps")
    assert metrics["cluster_source"] == "SLURM" and metrics["strategy_class"] == "ParameterServerStrategyV2"
    assert metrics["workers"] == 2 and metrics["ps_tasks"] == 1 and metrics["epochs_trained"] == 1
    # Rank 0 is the chief, rank 1 the ps task, ranks 2-3 the workers; each server left on its own.
    for rank, task in (("1", "ps:0"), ("2", "worker:0"), ("3", "worker:1")):
        assert f"{rank}: {task}: the chief finished the job; exiting" in output, output[-3000:]
