"""Local multi-process launcher: one process per task on a free 127.0.0.1 port, each with its own TF_CONFIG::

    python -m tftrain.launch --workers 2 -- python -m tftrain.recipes.mnist --strategy multi_worker_mirrored

Output lines are prefixed with the task (`[worker:1] ...`). The job ends when every chief and worker (with ps
tasks: every task) has exited. `--max-restarts N` restarts a failed ps-job worker alone, else the whole job (which
resumes from its checkpoint). On a failure beyond that, a signal or `--timeout` (exit 124), every task's process
group gets SIGTERM, then SIGKILL; on Linux tasks also die with the launcher. Bad launcher input exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence, TextIO

from tftrain.errors import LaunchError, check_int
from tftrain.runtime.processes import (TaskOutput, describe_exit, exit_code, group_alive, parent_death_signal,
                                       pump_lines, signal_group)
from tftrain.rundir import RESTART_COUNT_ENV, RUN_ID_ENV

PROG = "python -m tftrain.launch"

LOOPBACK = "127.0.0.1"

EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 124
"""Exit code when `--timeout` passes (the code coreutils' `timeout` uses)."""

DEFAULT_GRACE_S = 30.0
"""Seconds from SIGTERM to SIGKILL, for tasks to agree on a step and save it (as SLURM's and Kubernetes' default)."""

FAILURE_GRACE_S = 5.0
"""Most seconds from SIGTERM to SIGKILL after a task failed: a dead task's peers cannot reach a step to save."""

DEFAULT_SERVER_WAIT_S = 60.0
"""Seconds a parameter-server job's worker and ps tasks get to exit after the chief finished."""

_POLL_S = 0.05


class _Stop(Exception):
    """Raised in the main thread by the launcher's signal handlers."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def make_cluster(
    workers: int,
    ps: int = 0,
    chief: bool = False,
    host: str = LOOPBACK,
    pick_port: Optional[Callable[[], int]] = None,
) -> dict:
    """Builds a cluster spec (TF_CONFIG's `cluster`) with one free port per task.

    Args:
        workers: `worker` tasks, >= 1.
        ps: `ps` tasks, >= 0; needs `chief`. Defaults to 0.
        chief: add a `chief` task (coordinates a ps job; trains under MultiWorkerMirrored). Defaults to False.
        host: the tasks' address. Defaults to `"127.0.0.1"`.
        pick_port: returns a free TCP port. Defaults to `portpicker.pick_unused_port`.

    Returns:
        `{"chief": [...], "worker": [...], "ps": [...]}` of `host:port` strings (absent types left out).

    Raises:
        LaunchError: a count out of range, or `ps` > 0 without `chief`.
    """
    check_int(workers, "--workers", error=LaunchError)
    check_int(ps, "--ps", minimum=0, error=LaunchError)
    if ps and not chief:
        raise LaunchError(
            f"--ps {ps} needs --chief: a parameter-server job is coordinated by the chief task. "
            "Add --chief."
        )
    if pick_port is None:
        import portpicker

        pick_port = portpicker.pick_unused_port
    cluster = {}
    for task_type, count in (("chief", int(chief)), ("worker", workers), ("ps", ps)):
        if count:
            cluster[task_type] = [f"{host}:{pick_port()}" for _ in range(count)]
    return cluster


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a local cluster: the whole `cluster` (type -> `host:port` list), its type and index."""

    cluster: Mapping[str, Sequence[str]]
    task_type: str
    task_index: int

    @property
    def task(self) -> str:
        """`type:index`, e.g. `worker:1`."""
        return f"{self.task_type}:{self.task_index}"

    @property
    def address(self) -> str:
        """This task's `host:port`."""
        return self.cluster[self.task_type][self.task_index]

    def to_tf_config(self) -> str:
        """This task's `TF_CONFIG` JSON (the layout `tftrain.runtime.cluster.parse_tf_config` reads)."""
        return json.dumps(
            {
                "cluster": {k: list(v) for k, v in self.cluster.items()},
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )


def tasks_of(cluster: Mapping[str, Sequence[str]]) -> List[TaskSpec]:
    """One `TaskSpec` per task of `cluster`: chief first, then workers, then ps."""
    order = [t for t in ("chief", "worker", "ps", "evaluator") if t in cluster]
    return [TaskSpec(cluster, t, i) for t in order for i in range(len(cluster[t]))]


@dataclasses.dataclass
class _Task:
    info: TaskSpec
    proc: subprocess.Popen
    readers: list
    last_output: float
    returncode: Optional[int] = None

    @property
    def name(self) -> str:
        return self.info.task


@dataclasses.dataclass
class _Job:
    """The running job: its tasks (current ones; replaced ones in `retired`) and what starts them again."""

    command: Sequence[str]
    cluster: Mapping
    base_env: Mapping[str, str]
    output: "TaskOutput"
    grace_s: float
    max_restarts: int = 0
    restarts: int = 0
    failed: Optional[str] = None  # the failure that stopped the job ("worker:1 exited with code 3")
    failed_code: Optional[int] = None  # its exit code (2: bad input, refused before training)
    stopped: bool = False  # the launcher itself was stopped by a signal
    tasks: List[_Task] = dataclasses.field(default_factory=list)
    retired: List[_Task] = dataclasses.field(default_factory=list)

    @property
    def failure_grace_s(self) -> float:
        """Teardown grace after a task failed (at most `FAILURE_GRACE_S`)."""
        return min(self.grace_s, FAILURE_GRACE_S)

    @property
    def env(self) -> Mapping[str, str]:
        """`base_env`, plus the restart count (`RESTART_COUNT_ENV`) so an already finished chief exits 0."""
        return {**self.base_env, RESTART_COUNT_ENV: str(self.restarts)} if self.restarts else self.base_env

    def start(self, info: TaskSpec) -> _Task:
        task = _start_task(self.command, info, self.env, self.output)
        _pump_output(task, self.output)
        return task

    def start_all(self) -> None:
        self.retired.extend(self.tasks)
        self.tasks = []
        for info in tasks_of(self.cluster):
            self.tasks.append(_start_task(self.command, info, self.env, self.output))
        for task in self.tasks:
            _pump_output(task, self.output)


def teardown(tasks: Sequence["_Task"], grace_s: float = DEFAULT_GRACE_S) -> None:
    """SIGTERM, then after `grace_s` seconds SIGKILL, to every task's process group (even if its leader exited)."""
    for task in tasks:
        signal_group(task.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for task in tasks:
            task.proc.poll()
        if not any(group_alive(t.proc.pid) for t in tasks):
            break
        time.sleep(_POLL_S)
    for task in tasks:
        if group_alive(task.proc.pid):
            signal_group(task.proc.pid, signal.SIGKILL)
    for task in tasks:
        try:
            task.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:  # pragma: no cover (SIGKILL cannot be ignored)
            pass
        if task.returncode is None:
            task.returncode = task.proc.returncode


def launch(
    command: Sequence[str],
    workers: int,
    ps: int = 0,
    chief: bool = False,
    timeout: Optional[float] = None,
    grace_s: float = DEFAULT_GRACE_S,
    env: Optional[Mapping[str, str]] = None,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
    server_wait_s: float = DEFAULT_SERVER_WAIT_S,
    max_restarts: int = 0,
) -> int:
    """Runs `command` once per task of a local cluster and waits for the job.

    Args:
        command: the program and its arguments, run unchanged by every task.
        workers, ps, chief: the tasks, as `make_cluster` takes them.
        timeout: seconds before every task is stopped. Defaults to None: no limit.
        grace_s: seconds from SIGTERM to SIGKILL (after a failure, `FAILURE_GRACE_S` at most). Defaults to 30.
        env: the base environment, plus `TF_CONFIG` and `PYTHONUNBUFFERED=1`. Defaults to `os.environ`.
        out, err: for the tasks' prefixed stdout; for their stderr and launcher messages. Default: `sys`'s.
        server_wait_s: seconds a ps job's worker and ps tasks get to exit after the chief exited 0. Defaults to 60.
        max_restarts: restarts in all, >= 0 (module docstring). Defaults to 0.

    Returns:
        0 on success (for a ps job also after losing a worker while another ran); else the failed task's exit
        code (128 + N for signal N), 124 on timeout, or 128 + N when the launcher got signal N.

    Raises:
        LaunchError: bad counts or timeout, negative `max_restarts`, or an empty or unstartable command.
    """
    if not command:
        raise LaunchError(f"No command given. Usage: {PROG} --workers N -- python -m tftrain.recipes.mnist ...")
    if timeout is not None and not timeout > 0:
        raise LaunchError(f"--timeout must be a positive number of seconds. Received: timeout={timeout!r}.")
    check_int(max_restarts, "--max-restarts", minimum=0, error=LaunchError)
    cluster = make_cluster(workers, ps, chief)
    base_env = dict(os.environ if env is None else env)
    # One run id for all tasks, so that they agree on the default run directory.
    base_env.setdefault(RUN_ID_ENV, datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    job = _Job(command, cluster, base_env, TaskOutput(out or sys.stdout, err or sys.stderr), grace_s, max_restarts)
    with _signals_stop() as previous:
        started = time.monotonic()
        try:
            job.start_all()
            return _wait(job, timeout, started, server_wait_s)
        except _Stop as stop:
            job.output.say(f"got {signal.Signals(stop.signum).name}; stopping {len(job.tasks)} task(s)")
            job.stopped = True
            return 128 + stop.signum
        except KeyboardInterrupt:
            job.output.say(f"interrupted; stopping {len(job.tasks)} task(s)")
            return 128 + signal.SIGINT
        finally:
            for signum in previous:  # a second Ctrl-C must not cut the teardown short
                signal.signal(signum, signal.SIG_IGN)
            teardown(job.tasks + job.retired, job.failure_grace_s if job.failed else grace_s)
            for task in job.tasks + job.retired:
                for reader in task.readers:
                    reader.join(timeout=grace_s)
            if job.stopped:  # each task's exit, as when the job ends by itself
                for task in job.tasks:
                    job.output.say(f"{task.name} {describe_exit(task.returncode)}")
            if job.failed:  # the last line, below the stopped tasks' own
                chief_done = any(t.info.task_type == "chief" and t.returncode == 0 for t in job.tasks)
                job.output.say(f"the job stopped: {job.failed}. Its tasks' lines above say why; " + (
                    "the chief had finished the job (exit code 0): its run is complete, nothing to rerun"
                    if chief_done else "nothing trained: fix what they name, then run the command again"
                    if job.failed_code == 2 else resume_advice(command, base_env[RUN_ID_ENV])))


def resume_advice(command: Sequence[str], run_id: str, root: Path = Path("runs")) -> str:
    """How a stopped job's run goes on: by the same command where the training command names its run directory
    (`--run-dir`, `--resume`); else each launch has a new run id, so with `--run-dir` of the directory this job's
    tasks made (`<root>/<task>-<run id>`: a checkpoint resumes, a pending export is done, a finished run says so)."""
    import shlex

    if any(arg == "--resume" or arg.split("=")[0] == "--run-dir" for arg in command):
        return "a run stopped by a signal resumes from its last checkpoint when the same command runs again"
    made = [p for p in sorted(root.glob(f"*-{run_id}")) if p.is_dir()]
    if not made:
        return "no run directory was made, so the same command starts the run again"
    flag = f"--run-dir {shlex.quote(str(made[0]))}" if len(made) == 1 else "--run-dir of its run (one of " + \
        ", ".join(shlex.quote(str(p)) for p in made) + ")"
    return (f"to go on with its run (from the last checkpoint, or its pending export), rerun the same command with "
            f"{flag} added to the training command after -- (each launch starts a new run directory)")


@contextlib.contextmanager
def _signals_stop():
    """While open (main thread only), SIGINT, SIGTERM and SIGHUP raise `_Stop`; yields the previous handlers."""
    def on_signal(signum, frame):
        raise _Stop(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        yield previous
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _start_task(command: Sequence[str], info, base_env: Mapping[str, str], output: "TaskOutput") -> _Task:
    """Starts one task in its own session with its TF_CONFIG; `LaunchError` when it cannot start."""
    task_env = {**base_env, "TF_CONFIG": info.to_tf_config(), "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(list(command), env=task_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=parent_death_signal())
    except OSError as e:
        raise LaunchError(f"Cannot start {command[0]!r}: {e.strerror or e}. Check the command after --.") from None
    output.say(f"started {info.task} (pid {proc.pid}) at {info.address}")
    return _Task(info, proc, [], time.monotonic())


def _pump_output(task: _Task, output: "TaskOutput") -> None:
    """Copies the task's stdout and stderr, prefixed with the task, in reader threads."""
    for pipe, stream in ((task.proc.stdout, output.out), (task.proc.stderr, output.err)):
        reader = threading.Thread(target=pump_lines, args=(pipe, stream, f"[{task.name}] ", output, task), daemon=True)
        reader.start()
        task.readers.append(reader)


def _wait(job: _Job, timeout: Optional[float], started: float, server_wait_s: float = DEFAULT_SERVER_WAIT_S) -> int:
    """Polls the tasks until the job is done, fails, or the timeout passes."""
    parameter_server_job, output = "ps" in job.cluster, job.output
    chief_done_at = None
    while True:
        for task in list(job.tasks):
            if task.returncode is None and task.proc.poll() is not None:
                task.returncode = task.proc.returncode
                if task.returncode == 0:
                    output.say(f"{task.name} exited with code 0")
                    continue
                code = _after_failure(job, task)
                if code is not None:
                    return code
        now = time.monotonic()
        left = [t.name for t in job.tasks if t.returncode is None]
        if parameter_server_job:
            if chief_done_at is None and all(t.returncode is not None for t in job.tasks
                                             if t.info.task_type == "chief"):
                chief_done_at = now
            if left and chief_done_at is not None and now - chief_done_at > server_wait_s:
                output.say(f"job finished; {', '.join(left)} still serving {server_wait_s:g} s after the chief "
                           "finished: stopping them")
                return 0
            done = not left
        else:
            done = all(t.returncode is not None for t in job.tasks if t.info.task_type in ("chief", "worker"))
        if done:
            output.say("job finished" + (f"; stopping {', '.join(left)}" if left else ""))
            return 0
        if timeout is not None and now - started > timeout:
            running = [t for t in job.tasks if t.returncode is None]
            stalled = min(running, key=lambda t: t.last_output)
            output.say(
                f"timeout: {timeout:g} s passed; {stalled.name} stalled (no output for "
                f"{now - stalled.last_output:.1f} s); stopping {', '.join(t.name for t in running)}"
            )
            return EXIT_TIMEOUT
        time.sleep(_POLL_S)


def _after_failure(job: _Job, task: _Task) -> Optional[int]:
    """Handles a task's failure: None if the job goes on (restarted, or a ps job's other worker runs), else its code."""
    what = f"{task.name} {describe_exit(task.returncode)}"
    job.failed_code = task.returncode
    ps_worker = "ps" in job.cluster and task.info.task_type == "worker"
    if job.restarts < job.max_restarts:
        job.restarts += 1
        count = f"restart {job.restarts} of {job.max_restarts}"
        if ps_worker:
            job.output.say(f"{what}; restarting it ({count}); the chief's coordinator takes it back")
            job.retired.append(task)
            job.tasks[job.tasks.index(task)] = job.start(task.info)
        else:
            job.output.say(f"{what}; restarting the job, which resumes from its checkpoint ({count})")
            teardown(job.tasks, job.failure_grace_s)
            job.start_all()
        return None
    running = [t for t in job.tasks if t is not task and t.proc.poll() is None]
    workers = [t.name for t in running if t.info.task_type == "worker"]
    if ps_worker and workers:
        job.output.say(f"{what}; the parameter-server job goes on with {', '.join(workers)} "
                       "(the chief's coordinator reschedules its steps)")
        return None
    job.output.say(f"{what}; stopping " + (", ".join(t.name for t in running) if running
                                           else "nothing else (no task left)"))
    job.failed = what
    return exit_code(task.returncode)


def build_parser() -> argparse.ArgumentParser:
    """The launcher's argument parser (errors raise `LaunchError`)."""
    from tftrain.cli import OneLineParser

    parser = OneLineParser(
        error=LaunchError,
        prog=PROG,
        usage=f"{PROG} --workers N [--ps M] [--chief] [--timeout S] [--grace S] [--server-wait S] "
        "[--max-restarts N] -- COMMAND [ARG ...]",
        description="Run COMMAND once per task of a local TensorFlow cluster on 127.0.0.1, "
        "each task with its own TF_CONFIG; prefix its output with the task; stop every task "
        "when one fails, on Ctrl-C, or at the timeout.",
    )
    parser.add_argument("--workers", type=int, required=True, metavar="N", help="worker tasks (>= 1)")
    parser.add_argument("--ps", type=int, default=0, metavar="M", help="parameter-server tasks (needs --chief)")
    parser.add_argument("--chief", action="store_true", help="add a chief task (coordinator of a ps job)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop every task after S seconds (exit code 124)")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping tasks")
    parser.add_argument("--server-wait", type=float, default=DEFAULT_SERVER_WAIT_S, metavar="S",
                        help="parameter-server job: seconds the worker and ps tasks get to exit after the chief "
                        "finished, before they are stopped")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="restart failed tasks up to N times in all: a parameter-server job's worker alone, "
                        "otherwise the whole job, which resumes from its checkpoint (default 0)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit code (see `launch`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if "--" in argv:
            cut = argv.index("--")
            own, command = argv[:cut], argv[cut + 1:]
        else:
            own, command = argv, []
        args, unknown = build_parser().parse_known_args(own)
        if unknown and not command and not unknown[0].startswith("-"):  # the command, without the '--' before it
            cut = own.index(unknown[0])  # the launcher's own flags come before it
            raise LaunchError(f"unrecognized arguments: {' '.join(own[cut:])}. Put '--' before the command every task "
                              f"runs: {PROG} {' '.join(own[:cut])} -- {' '.join(own[cut:])}")
        if unknown:
            build_parser().parse_args(own)  # argparse's own message for an unknown flag (exit 2)
        if not command:
            raise LaunchError(
                f"No command given after '--'. Usage: {PROG} --workers 2 -- "
                "python -m tftrain.recipes.mnist --strategy multi_worker_mirrored"
            )
        for name in ("grace", "server_wait"):
            if not getattr(args, name) >= 0:
                raise LaunchError(f"--{name.replace('_', '-')} must be >= 0 seconds. "
                                  f"Received: {name}={getattr(args, name)!r}.")
        return launch(command, args.workers, args.ps, args.chief, args.timeout, args.grace,
                      server_wait_s=args.server_wait, max_restarts=args.max_restarts)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
