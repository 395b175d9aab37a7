"""TF_CONFIG parsing and validation (pure Python, no TensorFlow import).

A multi-worker job describes its cluster in the `TF_CONFIG` environment variable,
a JSON object such as::

    {"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:23456"]},
     "task": {"type": "worker", "index": 0}}

TensorFlow reads it when a multi-worker strategy is built and fails deep inside
with an unhelpful message when it is wrong. `parse_tf_config` checks it first and
names the mistake.

Source: https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional

from tftrain.errors import ClusterConfigError

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
"""Task types TensorFlow's distributed runtime knows."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A validated cluster description and this process's place in it.

    Attributes:
        cluster: task type -> list of `host:port` addresses.
        task_type: this process's task type (`chief`, `worker`, `ps`, `evaluator`).
        task_index: this process's index within its task type.
    """

    cluster: Mapping[str, tuple]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        """Tasks that run training steps: chief plus workers."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def num_ps(self) -> int:
        """Parameter-server tasks."""
        return len(self.cluster.get("ps", ()))

    @property
    def is_chief(self) -> bool:
        """True for the task that writes logs and checkpoints: the chief, or worker 0
        when the cluster has no chief (TensorFlow's convention)."""
        if self.task_type == "chief":
            return True
        return "chief" not in self.cluster and self.task_type == "worker" and self.task_index == 0

    @property
    def task(self) -> str:
        """`type:index`, e.g. `worker:1`."""
        return f"{self.task_type}:{self.task_index}"

    def to_tf_config(self) -> str:
        """The JSON string to put into this task's `TF_CONFIG`."""
        return json.dumps(
            {
                "cluster": {k: list(v) for k, v in self.cluster.items()},
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )


def _check_address(task_type: str, i: int, address) -> None:
    where = f"cluster.{task_type}[{i}]"
    if not isinstance(address, str) or ":" not in address:
        raise ClusterConfigError(
            f"TF_CONFIG {where} must be a 'host:port' string. Received: {address!r}."
        )
    host, _, port = address.rpartition(":")
    if not host:
        raise ClusterConfigError(f"TF_CONFIG {where} has no host. Received: {address!r}.")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ClusterConfigError(
            f"TF_CONFIG {where} has an invalid port {port!r}; expected 1..65535. "
            f"Received: {address!r}."
        )


def parse_tf_config(text: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Optional[ClusterInfo]:
    """Parses and validates a TF_CONFIG JSON string.

    Args:
        text: the JSON text; None reads `env["TF_CONFIG"]`. Defaults to None.
        env: environment to read when `text` is None. Defaults to `os.environ`.

    Returns:
        A `ClusterInfo`, or None when TF_CONFIG is unset or empty (a single-process
        job).

    Raises:
        ClusterConfigError: when the text is not a JSON object, lacks `cluster` or
            `task`, names an unknown task type, has a task index outside its list,
            holds an address that is not `host:port` with a port in 1..65535, lists
            one address twice, or has more than one chief.
    """
    if text is None:
        text = (os.environ if env is None else env).get("TF_CONFIG", "")
    if not text or not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({e.msg} at position {e.pos}). "
            'Expected e.g. {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}.'
        ) from None
    if not isinstance(data, dict):
        raise ClusterConfigError(f"TF_CONFIG must be a JSON object. Received: {type(data).__name__}.")
    cluster = data.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterConfigError(
            "TF_CONFIG has no 'cluster' mapping. Expected e.g. "
            '"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}.'
        )
    seen = {}
    parsed = {}
    for task_type, addresses in cluster.items():
        if task_type not in TASK_TYPES:
            raise ClusterConfigError(
                f"TF_CONFIG cluster has unknown task type {task_type!r}. "
                f"Expected one of: {', '.join(TASK_TYPES)}."
            )
        if not isinstance(addresses, list) or not addresses:
            raise ClusterConfigError(
                f"TF_CONFIG cluster.{task_type} must be a non-empty list of 'host:port'. "
                f"Received: {addresses!r}."
            )
        for i, address in enumerate(addresses):
            _check_address(task_type, i, address)
            if address in seen:
                raise ClusterConfigError(
                    f"TF_CONFIG lists address {address!r} twice ({seen[address]} and "
                    f"{task_type}[{i}]); every task needs its own port."
                )
            seen[address] = f"{task_type}[{i}]"
        parsed[task_type] = tuple(addresses)
    if len(parsed.get("chief", ())) > 1:
        raise ClusterConfigError(
            f"TF_CONFIG cluster.chief must list one address. Received: {list(parsed['chief'])}."
        )
    task = data.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterConfigError(
            'TF_CONFIG has no valid \'task\'. Expected e.g. "task": {"type": "worker", "index": 0}. '
            f"Received: task={task!r}."
        )
    task_type, task_index = task["type"], task["index"]
    if task_type not in parsed:
        raise ClusterConfigError(
            f"TF_CONFIG task.type {task_type!r} is not in the cluster "
            f"(which has: {', '.join(parsed)})."
        )
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ClusterConfigError(f"TF_CONFIG task.index must be an integer. Received: {task_index!r}.")
    if not 0 <= task_index < len(parsed[task_type]):
        raise ClusterConfigError(
            f"TF_CONFIG task.index {task_index} is out of range: cluster.{task_type} has "
            f"{len(parsed[task_type])} address(es), so the index must be 0..{len(parsed[task_type]) - 1}."
        )
    return ClusterInfo(parsed, task_type, task_index)
