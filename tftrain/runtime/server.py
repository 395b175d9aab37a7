"""Worker and ps tasks of a parameter-server job: run a `tf.distribute.Server` and wait.

In TensorFlow 2's parameter-server training only the coordinator (the chief) runs
the training program; every worker and ps task runs a gRPC server that executes
what the coordinator sends it, until the cluster manager (or
`python -m tftrain.launch`) stops it.

Source: https://www.tensorflow.org/tutorials/distribute/parameter_server_training#clusters_in_the_real_world
"""

from __future__ import annotations

import sys
from typing import Optional

import tensorflow as tf

from tftrain.errors import ClusterConfigError
from tftrain.runtime.cluster import ClusterInfo


def start_server(cluster: ClusterInfo, intra_op_threads: int = 0, inter_op_threads: int = 0) -> tf.distribute.Server:
    """Starts this task's `tf.distribute.Server` on its cluster address.

    Args:
        cluster: this task's `ClusterInfo`; its task type must be `worker` or `ps`.
        intra_op_threads: threads per op for the functions the server runs; 0
            keeps TensorFlow's default. Defaults to 0.
        inter_op_threads: concurrent ops; 0 keeps TensorFlow's default.
            Defaults to 0.

    Returns:
        The started server (`server.join()` blocks until the process is stopped).

    Raises:
        ClusterConfigError: when this task is not a worker or ps task.
    """
    if cluster.task_type not in ("worker", "ps"):
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


def serve(cluster: ClusterInfo, intra_op_threads: int = 0, inter_op_threads: int = 0, log: Optional[object] = None) -> int:
    """Runs this worker/ps task's server until the process is stopped.

    Args:
        cluster: this task's `ClusterInfo` (task type `worker` or `ps`).
        intra_op_threads: see `start_server`. Defaults to 0.
        inter_op_threads: see `start_server`. Defaults to 0.
        log: stream for the one status line. Defaults to `sys.stdout`.

    Returns:
        Never returns normally (the server runs until SIGTERM/SIGKILL); 0 if the
        server ever stops by itself.

    Raises:
        ClusterConfigError: when this task is not a worker or ps task.
    """
    server = start_server(cluster, intra_op_threads, inter_op_threads)
    print(
        f"{cluster.task}: serving the parameter-server job at {cluster.address} "
        f"({server.target}); the chief coordinates, stop this task when it has finished",
        file=log or sys.stdout,
        flush=True,
    )
    server.join()
    return 0
