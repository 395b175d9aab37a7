"""Worker and ps tasks of a parameter-server job: serve until the chief says how the job ended.

`Server.join()` never returns (a scheduler would call the job failed), so each task waits on its own
`STATUS_QUEUE` instead (`serve`); the chief fills every queue when its run ends (`telling_servers`) and each task
exits as the chief did: 0, 1 (`JobFailed`) or 128 + signal (`Preempted`). Serving tasks ignore SIGTERM and
SIGUSR1 so the chief can finish its checkpoint; `ChiefWatch` catches a vanished chief.
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
"""Status the chief sends when SIGTERM stopped its run after a checkpoint; the servers exit 143."""

JOB_STOPPED_SIGUSR1 = 3
"""As `JOB_STOPPED`, for SIGUSR1 (SLURM's `--signal` notice); the servers exit 138."""

_STOPPED_BY = {JOB_STOPPED: signal.SIGTERM, JOB_STOPPED_SIGUSR1: signal.SIGUSR1}


def stopped_status(signum: int) -> int:
    """The stop status for `signum`; a signal other than SIGUSR1 is told as SIGTERM's."""
    return next((status for status, by in _STOPPED_BY.items() if by == signum), JOB_STOPPED)


def stopped_signal(status: int) -> Optional[int]:
    """`stopped_status`'s inverse; None for a status that is not a stop."""
    return _STOPPED_BY.get(status)

CHIEF_WAIT_S = 600.0
"""Seconds a worker or ps task waits for the chief to appear at its address."""

CHIEF_GONE_S = 30.0
"""Seconds a worker or ps task waits for a chief that went away without sending a status."""

POLL_S = 1.0
"""Seconds between looks at the chief's address while waiting for the status."""

_SERVER_TYPES = ("worker", "ps")


def start_server(cluster: ClusterInfo, intra_op_threads: int = 0, inter_op_threads: int = 0) -> tf.distribute.Server:
    """Starts this worker or ps task's `tf.distribute.Server`; thread counts of 0 keep TensorFlow's defaults.

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
    """The handle of this device's status queue (one int32 scalar per message)."""
    return tf.raw_ops.FIFOQueueV2(component_types=[tf.int32], shapes=[[]], capacity=-1, shared_name=STATUS_QUEUE)


class StatusQueue:
    """This task's status queue, read on its own server and device by a thread blocked on one dequeue until
    `close` (a poll with a timeout would log a cancelled step each time)."""

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
            JobFailed: when waiting on the queue failed.
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
    """Whether something accepts TCP connections at `address` within `timeout_s` (defaults to 1.0)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclasses.dataclass
class ChiefWatch:
    """Decides when a worker or ps task stops waiting for a silent chief: it may take `wait_s` (default 600)
    seconds to appear after `started` (`time.monotonic()`) and stay unreachable `gone_s` (default 30) once seen."""

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
    """Returns the chief's status, calling `read(poll_s)` (e.g. `StatusQueue.get`) until `watch` gives up.

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
    """Runs this worker/ps task's server until the chief says how the job ended; returns 0.

    Args:
        log: stream for the status lines. Defaults to `sys.stdout`.
        chief_wait_s: seconds the chief may take to appear. Defaults to 600.
        chief_gone_s: seconds a chief may stay unreachable once seen. Defaults to 30.

    Raises:
        ClusterConfigError: when this task is not a worker or ps task, or there is no chief.
        JobFailed: when the chief reported a failure, never appeared, or vanished.
        Preempted: when the chief reported that a signal stopped the job.
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
    """Waits up to `limit_s` for the chief to stop, so its exit ends the job (launchers stop at the first failure)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and chief_reachable(chief):
        time.sleep(poll_s)


def tell_servers(cluster: ClusterInfo, status: int) -> List[str]:
    """Sends `status` to every worker and ps task, which then exits (so call it last); returns those not reached."""
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
    """Around the chief's run, tells the servers `JOB_FINISHED`, a stop status on `Preempted`, else `JOB_FAILED`
    (nobody without ps tasks or `cluster`). `log` defaults to `sys.stderr`."""
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
