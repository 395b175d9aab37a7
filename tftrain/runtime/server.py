"""Worker and ps tasks of a parameter-server job: serve until the chief says how the job ended.

In TensorFlow 2's parameter-server training only the coordinator (the chief) runs
the training program; every worker and ps task runs a gRPC server that executes
what the coordinator sends it. A `tf.distribute.Server` has no way to stop
(`Server.join()` blocks forever, tensorflow/tensorflow#4713), so a cluster manager
that waits for every task (SLURM's `srun`, a TFJob whose success policy waits for
all pods) would have to kill the servers and would record the job as failed.

tftrain ends them the way TensorFlow's maintainers suggest in that issue, with a
shared queue, across machines and through TensorFlow's own runtime:

* each worker and ps task creates a FIFO queue named `STATUS_QUEUE` on its own
  device and waits on it through a session on its own server (`serve`);
* when the chief's run ends it puts the job's status into every task's queue
  (`tell_servers`, `telling_servers`): `JOB_FINISHED` (0), `JOB_FAILED` (1), `JOB_STOPPED`
  (2: SIGTERM stopped the chief after it saved a checkpoint) or `JOB_STOPPED_SIGUSR1` (3: SIGUSR1 did);
* each task then exits as the chief: 0 when the job finished, 1 (`JobFailed`) when it failed, 143
  or 138 (`Preempted`, 128 + the signal's number) when a signal stopped it. A serving task
  ignores SIGTERM and SIGUSR1 meanwhile: a scheduler signals every task at once, and a worker
  that left would stall the chief's last steps before it can save (the launcher's `--grace`,
  or the scheduler's, still ends it).

A chief can also vanish without a word (killed, its machine lost), so each task
also watches the chief's gRPC address (`ChiefWatch`): a chief that does not appear
within `chief_wait_s`, or is unreachable for `chief_gone_s` once it had appeared,
ends the task with `JobFailed`.

TensorFlow's coordination-service key-value store (`context.set_config_key_value`)
would be the other candidate, but in TF 2.21 it belongs to a process's eager
context, which a plain `tf.distribute.Server` does not have, and
`ParameterServerStrategy` only enables the service behind the experimental
`TF_PSS_ENABLE_COORDINATION_SERVICE` variable.

Sources: https://www.tensorflow.org/tutorials/distribute/parameter_server_training#clusters_in_the_real_world,
https://github.com/tensorflow/tensorflow/issues/4713#issuecomment-254238853
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import sys
import threading
import time
from typing import Callable, Iterator, List, Optional

import tensorflow as tf

from tftrain.errors import ClusterConfigError, JobFailed
from tftrain.runtime.cluster import ClusterInfo

STATUS_QUEUE = "tftrain_job_status"
"""`shared_name` of the queue on each worker and ps task that receives the job's status."""

JOB_FINISHED = 0
"""Status the chief sends when its run finished; the servers exit 0."""

JOB_FAILED = 1
"""Status the chief sends when its run failed or was interrupted; the servers exit 1."""

JOB_STOPPED = 2
"""Status the chief sends when SIGTERM stopped its run after it saved a checkpoint (`Preempted`); the servers
exit 143, as the chief does."""

JOB_STOPPED_SIGUSR1 = 3
"""Status the chief sends when SIGUSR1 (SLURM's `--signal` notice before the time limit) stopped its run after
it saved a checkpoint; the servers exit 138, as the chief does."""

_STOPPED_BY = {JOB_STOPPED: signal.SIGTERM, JOB_STOPPED_SIGUSR1: signal.SIGUSR1}


def stopped_status(signum: int) -> int:
    """The status that tells the servers `signum` (SIGTERM or SIGUSR1) stopped the job: `JOB_STOPPED` or
    `JOB_STOPPED_SIGUSR1` (another signal is told as SIGTERM's)."""
    return next((status for status, by in _STOPPED_BY.items() if by == signum), JOB_STOPPED)


def stopped_signal(status: int) -> Optional[int]:
    """The signal that stopped the job for a stop status (`stopped_status`'s inverse), else None."""
    return _STOPPED_BY.get(status)

CHIEF_WAIT_S = 600.0
"""Seconds a worker or ps task waits for the chief to appear at its address."""

CHIEF_GONE_S = 30.0
"""Seconds a worker or ps task waits for a chief that went away without sending a status."""

POLL_S = 1.0
"""Seconds between looks at the chief's address while waiting for the status."""

_SERVER_TYPES = ("worker", "ps")


def start_server(cluster: ClusterInfo, intra_op_threads: int = 0, inter_op_threads: int = 0) -> tf.distribute.Server:
    """Starts this task's `tf.distribute.Server` on its cluster address.

    Args:
        cluster: this task's `ClusterInfo`; its task type must be `worker` or `ps`.
        intra_op_threads: threads per op for the functions the server runs; 0
            keeps TensorFlow's default. Defaults to 0.
        inter_op_threads: concurrent ops; 0 keeps TensorFlow's default.
            Defaults to 0.

    Returns:
        The started server.

    Raises:
        ClusterConfigError: when this task is not a worker or ps task.
    """
    if cluster.task_type not in _SERVER_TYPES:
        raise ClusterConfigError(
            f"Only worker and ps tasks serve a parameter-server job; this task is {cluster.task}."
        )
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=intra_op_threads, inter_op_parallelism_threads=inter_op_threads
    )
    return tf.distribute.Server(
        tf.train.ClusterSpec({k: list(v) for k, v in cluster.cluster.items()}),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol="grpc",
        config=config,
        start=True,
    )


def _device(task_type: str, task_index: int) -> str:
    return f"/job:{task_type}/replica:0/task:{task_index}/device:CPU:0"


def _status_queue() -> tf.Tensor:
    """The handle of this device's status queue (one int32 scalar per message); graph or eager."""
    return tf.raw_ops.FIFOQueueV2(component_types=[tf.int32], shapes=[[]], capacity=-1, shared_name=STATUS_QUEUE)


class StatusQueue:
    """This task's status queue, read through a `tf.compat.v1.Session` on its own server.

    The session is restricted to the task's own device (`device_filters`), so it
    needs no other task. One background thread blocks on a dequeue (a poll with a
    timeout would log a cancelled step each time); `close` ends it.

    Args:
        server: this task's started server (`start_server`).
        cluster: this task's `ClusterInfo` (task type `worker` or `ps`).
    """

    def __init__(self, server: tf.distribute.Server, cluster: ClusterInfo):
        device = _device(cluster.task_type, cluster.task_index)
        graph = tf.Graph()
        with graph.as_default(), tf.device(device):
            handle = _status_queue()
            self._dequeue = tf.raw_ops.QueueDequeueV2(handle=handle, component_types=[tf.int32])
            self._close = tf.raw_ops.QueueCloseV2(handle=handle)
        self._session = tf.compat.v1.Session(server.target, graph=graph,
                                             config=tf.compat.v1.ConfigProto(device_filters=[device]))
        self._status: Optional[int] = None
        self._error: Optional[Exception] = None
        self._thread = threading.Thread(target=self._receive, name="tftrain-job-status", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        try:
            (status,) = self._session.run(self._dequeue)
            self._status = int(status)
        except tf.errors.OutOfRangeError:  # closed by `close`
            pass
        except Exception as e:  # noqa: BLE001 (kept for `get` to raise in the serving thread)
            self._error = e

    def get(self, timeout_s: float) -> Optional[int]:
        """The status the chief sent, waiting up to `timeout_s` seconds; None when none came.

        Raises:
            JobFailed: when waiting on the queue failed (the error is named).
        """
        self._thread.join(timeout_s)
        if self._error is not None:
            raise JobFailed(f"waiting for the chief's status failed: {type(self._error).__name__}: {self._error}")
        return None if self._thread.is_alive() else self._status

    def close(self) -> None:
        """Stops waiting: closes the queue (the blocked dequeue ends) and the session."""
        if self._thread.is_alive():
            self._session.run(self._close)
            self._thread.join()
        self._session.close()


def chief_reachable(address: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at the chief's `host:port` (its gRPC server).

    Args:
        address: the chief's `host:port` from the cluster.
        timeout_s: seconds to wait for the connection. Defaults to 1.0.
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclasses.dataclass
class ChiefWatch:
    """Decides when a worker or ps task stops waiting for a silent chief (pure; no TensorFlow).

    Attributes:
        address: the chief's `host:port`, named in messages.
        started: `time.monotonic()` when the task began waiting, in seconds.
        wait_s: seconds the chief may take to appear. Defaults to `CHIEF_WAIT_S` (600).
        gone_s: seconds the chief may stay unreachable once it had appeared.
            Defaults to `CHIEF_GONE_S` (30).
        last_seen: when the chief was last reachable; None before it appeared.
    """

    address: str
    started: float
    wait_s: float = CHIEF_WAIT_S
    gone_s: float = CHIEF_GONE_S
    last_seen: Optional[float] = None

    def check(self, now: float, reachable: bool) -> Optional[str]:
        """Records one look at the chief at time `now` (seconds); returns why to give up, or None to wait on."""
        if reachable:
            self.last_seen = now
            return None
        if self.last_seen is None and now - self.started > self.wait_s:
            return (f"the chief at {self.address} did not appear within {self.wait_s:g} s; "
                    "check that it started (its output names the error)")
        if self.last_seen is not None and now - self.last_seen > self.gone_s:
            return (f"the chief at {self.address} went away without saying how the job ended "
                    f"(unreachable for {self.gone_s:g} s); see the chief's output")
        return None


def wait_for_status(read: Callable[[float], Optional[int]], watch: ChiefWatch,
                    is_reachable: Callable[[str], bool] = chief_reachable, poll_s: float = POLL_S,
                    clock: Callable[[], float] = time.monotonic) -> int:
    """Waits for the status the chief sends, watching the chief meanwhile.

    Args:
        read: `read(timeout_s) -> int | None`, e.g. `StatusQueue.get`.
        watch: the `ChiefWatch` that decides when a silent chief is lost.
        is_reachable: `is_reachable(address) -> bool`. Defaults to `chief_reachable`.
        poll_s: seconds each `read` waits before the chief is looked at. Defaults to 1.0.
        clock: monotonic clock in seconds. Defaults to `time.monotonic`.

    Returns:
        The status the chief sent (`JOB_FINISHED` or `JOB_FAILED`).

    Raises:
        JobFailed: when the chief never appeared or went away without a status.
    """
    while True:
        status = read(poll_s)
        if status is not None:
            return status
        reason = watch.check(clock(), is_reachable(watch.address))
        if reason is not None:
            status = read(0.001)  # a status that came in just before the chief left still counts
            if status is not None:
                return status
            raise JobFailed(reason)


def serve(cluster: ClusterInfo, intra_op_threads: int = 0, inter_op_threads: int = 0, log: Optional[object] = None,
          chief_wait_s: float = CHIEF_WAIT_S, chief_gone_s: float = CHIEF_GONE_S) -> int:
    """Runs this worker/ps task's server until the chief says how the job ended.

    Args:
        cluster: this task's `ClusterInfo` (task type `worker` or `ps`).
        intra_op_threads: see `start_server`. Defaults to 0.
        inter_op_threads: see `start_server`. Defaults to 0.
        log: stream for the status lines. Defaults to `sys.stdout`.
        chief_wait_s: seconds the chief may take to appear. Defaults to 600.
        chief_gone_s: seconds a chief that appeared may stay unreachable
            without having sent a status. Defaults to 30.

    Returns:
        0, once the chief reported that the job finished.

    Raises:
        ClusterConfigError: when this task is not a worker or ps task, or the
            cluster has no chief.
        JobFailed: when the chief reported a failure, never appeared, or went away
            without a status (a command-line run then exits 1).
        Preempted: when the chief reported that a signal stopped the job after its
            checkpoint (exit 143 for SIGTERM, 138 for SIGUSR1, as the chief).
    """
    if "chief" not in cluster.cluster:
        raise ClusterConfigError(f"A parameter-server job needs a chief task; the {cluster.source} cluster has "
                                 f"none (it has: {', '.join(cluster.cluster)}).")
    log = log or sys.stdout
    server = start_server(cluster, intra_op_threads, inter_op_threads)
    chief = cluster.cluster["chief"][0]
    print(f"{cluster.task}: serving the parameter-server job at {cluster.address} ({server.target}) "
          f"until the chief at {chief} has finished", file=log, flush=True)
    queue = StatusQueue(server, cluster)
    try:
        status = wait_for_status(queue.get, ChiefWatch(chief, time.monotonic(), chief_wait_s, chief_gone_s))
    finally:
        queue.close()
    signum = stopped_signal(status)
    if signum is not None:
        from tftrain.errors import Preempted

        _let_the_chief_exit_first(chief, chief_gone_s)
        raise Preempted(f"{cluster.task}: the chief at {chief} stopped the job on {signal.Signals(signum).name} "
                        "after saving its checkpoint", signum)
    if status != JOB_FINISHED:
        _let_the_chief_exit_first(chief, chief_gone_s)
        raise JobFailed(f"the chief at {chief} reported that the parameter-server job failed; see its output")
    print(f"{cluster.task}: the chief finished the job; exiting", file=log, flush=True)
    return 0


def _let_the_chief_exit_first(chief: str, limit_s: float, poll_s: float = POLL_S) -> None:
    """Waits (at most `limit_s` seconds) until the failed chief's server stops answering, so the chief
    prints its error line and sets the job's exit code before a worker's exit 1 ends the job (the
    launcher and `srun --kill-on-bad-exit` end it at the first failing task)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and chief_reachable(chief):
        time.sleep(poll_s)


def tell_servers(cluster: ClusterInfo, status: int) -> List[str]:
    """Sends the job's status to every worker and ps task (run on the chief, once connected).

    Call it after everything that uses the servers (evaluation, saving): each
    task exits once it has the status.

    Args:
        cluster: the job's `ClusterInfo` (the chief's view).
        status: `JOB_FINISHED` (0), `JOB_FAILED` (1), `JOB_STOPPED` (2) or `JOB_STOPPED_SIGUSR1` (3).

    Returns:
        The tasks (`worker:1`, ...) that could not be told (e.g. already gone).
    """
    missed = []
    for task_type in _SERVER_TYPES:
        for index in range(len(cluster.cluster.get(task_type, ()))):
            try:
                with tf.device(_device(task_type, index)):
                    tf.raw_ops.QueueEnqueueV2(handle=_status_queue(), components=[tf.constant(status, tf.int32)])
            except tf.errors.OpError:
                missed.append(f"{task_type}:{index}")
    return missed


@contextlib.contextmanager
def telling_servers(cluster: Optional[ClusterInfo], log: Optional[object] = None) -> Iterator[None]:
    """Context manager for the chief's run: tells the servers `JOB_FINISHED` when the block
    ends normally, `JOB_STOPPED` when it raises `Preempted` (a signal, after the checkpoint) and
    `JOB_FAILED` when it raises anything else (Ctrl-C included).

    Args:
        cluster: the job's `ClusterInfo`; None or a cluster without ps tasks
            (not a parameter-server job) tells nobody.
        log: stream for a line naming tasks that could not be told. Defaults to `sys.stderr`.
    """
    if cluster is None or "ps" not in cluster.cluster:
        yield
        return
    from tftrain.errors import Preempted

    status = JOB_FAILED
    try:
        yield
        status = JOB_FINISHED
    except Preempted as stopped:
        status = stopped_status(stopped.signum)
        raise
    finally:
        missed = tell_servers(cluster, status)
        if missed:
            said = "finished" if status == JOB_FINISHED else "stopped" if stopped_signal(status) else "failed"
            print(f"{cluster.task}: could not tell {', '.join(missed)} that the job {said}", file=log or sys.stderr,
                  flush=True)
