"""Cluster descriptions: TF_CONFIG or a SLURM job step -> a validated `ClusterInfo`.

TensorFlow reports a wrong TF_CONFIG obscurely; `parse_tf_config` names the mistake first. `resolve_cluster`
tries TF_CONFIG, then SLURM (`SlurmClusterResolver`). Only `slurm_cluster` imports TensorFlow.
Sources: https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable,
https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Mapping, Optional

from tftrain.config import MULTI_PROCESS_STRATEGIES
from tftrain.errors import ClusterConfigError

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
"""Task types TensorFlow's distributed runtime knows."""


SLURM_PORT_BASE = 8888
"""First port of the tasks on each SLURM node (`SlurmClusterResolver`'s default)."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A validated cluster (task type -> `host:port` tuple) and this process's place in it."""

    cluster: Mapping[str, tuple]
    task_type: str
    task_index: int
    source: str = "TF_CONFIG"

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
        """True for the chief, or worker 0 when there is no chief (TensorFlow's convention)."""
        if self.task_type == "chief":
            return True
        return "chief" not in self.cluster and self.task_type == "worker" and self.task_index == 0

    @property
    def address(self) -> str:
        """This task's `host:port`."""
        return self.cluster[self.task_type][self.task_index]

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


def _check_address(task_type: str, i: int, address, source: str = "TF_CONFIG") -> None:
    where = f"cluster.{task_type}[{i}]"
    if not isinstance(address, str) or ":" not in address:
        raise ClusterConfigError(
            f"{source} {where} must be a 'host:port' string. Received: {address!r}."
        )
    host, _, port = address.rpartition(":")
    if not host:
        raise ClusterConfigError(f"{source} {where} has no host. Received: {address!r}.")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ClusterConfigError(
            f"{source} {where} has an invalid port {port!r}; expected 1..65535. "
            f"Received: {address!r}."
        )


def drop_blank_tf_config(env: Optional[dict] = None) -> bool:
    """Removes a blank `TF_CONFIG` (`TFConfigClusterResolver` rejects it) from `env` (default environ); True if so."""
    env = os.environ if env is None else env
    if "TF_CONFIG" in env and not env["TF_CONFIG"].strip():
        del env["TF_CONFIG"]
        return True
    return False


def parse_tf_config(text: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Optional[ClusterInfo]:
    """Parses and validates TF_CONFIG (`text`, else `env`'s, default `os.environ`); None when unset or blank.

    Raises:
        ClusterConfigError: invalid JSON, no `cluster` or `task`, or what `validate_cluster` rejects.
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
    task = data.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterConfigError(
            'TF_CONFIG has no valid \'task\'. Expected e.g. "task": {"type": "worker", "index": 0}. '
            f"Received: task={task!r}."
        )
    return validate_cluster(cluster, task["type"], task["index"], source="TF_CONFIG")


def validate_cluster(cluster: Mapping, task_type, task_index, source: str = "TF_CONFIG") -> ClusterInfo:
    """Validates a cluster (task type -> `host:port` list) and this task's place; `source` names it in errors.

    Raises:
        ClusterConfigError: unknown task type, empty list, bad or duplicate `host:port`, two chiefs, task not in it.
    """
    if not isinstance(cluster, Mapping) or not cluster:
        raise ClusterConfigError(
            f"{source} has no 'cluster' mapping. Expected e.g. "
            '"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}.'
        )
    seen = {}
    parsed = {}
    for kind, addresses in cluster.items():
        if kind not in TASK_TYPES:
            raise ClusterConfigError(
                f"{source} cluster has unknown task type {kind!r}. "
                f"Expected one of: {', '.join(TASK_TYPES)}."
            )
        if not isinstance(addresses, list) or not addresses:
            raise ClusterConfigError(
                f"{source} cluster.{kind} must be a non-empty list of 'host:port'. "
                f"Received: {addresses!r}."
            )
        for i, address in enumerate(addresses):
            _check_address(kind, i, address, source)
            if address in seen:
                raise ClusterConfigError(
                    f"{source} lists address {address!r} twice ({seen[address]} and "
                    f"{kind}[{i}]); every task needs its own port."
                )
            seen[address] = f"{kind}[{i}]"
        parsed[kind] = tuple(addresses)
    if len(parsed.get("chief", ())) > 1:
        raise ClusterConfigError(
            f"{source} cluster.chief must list one address. Received: {list(parsed['chief'])}."
        )
    if task_type not in parsed:
        raise ClusterConfigError(
            f"{source} task.type {task_type!r} is not in the cluster "
            f"(which has: {', '.join(parsed)})."
        )
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ClusterConfigError(f"{source} task.index must be an integer. Received: {task_index!r}.")
    if not 0 <= task_index < len(parsed[task_type]):
        raise ClusterConfigError(
            f"{source} task.index {task_index} is out of range: cluster.{task_type} has "
            f"{len(parsed[task_type])} address(es), so the index must be 0..{len(parsed[task_type]) - 1}."
        )
    return ClusterInfo(parsed, task_type, task_index, source)


def check_cluster(strategy: str, cluster: Optional[ClusterInfo]) -> None:
    """Checks that a cluster (None: one process) has the tasks `multi_worker_mirrored` or `parameter_server` needs.

    Raises:
        ClusterConfigError: `multi_worker_mirrored` with ps tasks or on a non-chief/worker task;
            `parameter_server` without a cluster, or without a chief, a worker and a ps task.
    """
    if strategy == "multi_worker_mirrored" and cluster is not None:
        if cluster.num_ps:
            raise ClusterConfigError(
                f"The {cluster.source} cluster has ps tasks, which multi_worker_mirrored does not use. "
                "Remove them, or pass --strategy parameter_server."
            )
        if cluster.task_type not in ("chief", "worker"):
            raise ClusterConfigError(
                f"multi_worker_mirrored runs on chief and worker tasks; this task is {cluster.task}."
            )
    if strategy == "parameter_server":
        if cluster is None:
            raise ClusterConfigError(
                "parameter_server needs a cluster of one chief, workers and ps tasks, and neither "
                "TF_CONFIG nor a SLURM job step describes one. Launch it with e.g. "
                "`python -m tftrain.launch --chief --workers 2 --ps 1 -- python -m tftrain.recipes.mnist "
                "--strategy parameter_server`."
            )
        missing = [t for t in ("chief", "worker", "ps") if t not in cluster.cluster]
        if missing:
            raise ClusterConfigError(
                f"parameter_server needs chief, worker and ps tasks; the {cluster.source} cluster has no "
                f"{' and no '.join(missing)} task (it has: {', '.join(cluster.cluster)})."
            )
        if cluster.task_type == "evaluator":
            raise ClusterConfigError("parameter_server runs on chief, worker and ps tasks; this task is an evaluator.")


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    """The SLURM job-step variables that lay out a cluster.

    Attributes:
        rank: `SLURM_PROCID` (0-based).
        num_tasks: `SLURM_STEP_NUM_TASKS`.
        nodelist: `SLURM_STEP_NODELIST`, compressed (e.g. `node[01-04]`).
        tasks_per_node: `SLURM_STEP_TASKS_PER_NODE` expanded (`2(x3),1` -> `(2, 2, 2, 1)`).
    """

    rank: int
    num_tasks: int
    nodelist: str
    tasks_per_node: tuple

    @property
    def max_tasks_per_node(self) -> int:
        """The most tasks any one node runs."""
        return max(self.tasks_per_node)


SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
"""The variables `srun` sets that `SlurmClusterResolver` reads."""

_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?$")


def in_slurm_step(env: Optional[Mapping[str, str]] = None) -> bool:
    """True inside an `srun` job step of more than one task. `env` defaults to `os.environ`."""
    env = os.environ if env is None else env
    num = env.get("SLURM_STEP_NUM_TASKS", "")
    return "SLURM_PROCID" in env and num.isdigit() and int(num) > 1


def parse_slurm_step(env: Optional[Mapping[str, str]] = None) -> SlurmStep:
    """Reads and checks the SLURM job-step variables of `env` (defaults to `os.environ`).

    Raises:
        ClusterConfigError: a `SLURM_VARIABLES` entry missing or malformed, or inconsistent rank or task counts.
    """
    env = os.environ if env is None else env
    missing = [name for name in SLURM_VARIABLES if not env.get(name)]
    if missing:
        raise ClusterConfigError(
            f"SLURM job step variable(s) {', '.join(missing)} not set. Start every task with "
            "`srun` (e.g. `srun --ntasks=4 python -m tftrain.recipes.mnist ...`), or set TF_CONFIG."
        )
    values = {}
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        text = env[name].strip()
        if not text.isdigit():
            raise ClusterConfigError(f"{name} must be a non-negative integer. Received: {name}={text!r}.")
        values[name] = int(text)
    rank, num_tasks = values["SLURM_PROCID"], values["SLURM_STEP_NUM_TASKS"]
    if num_tasks < 1 or rank >= num_tasks:
        raise ClusterConfigError(
            f"SLURM_PROCID={rank} is outside 0..{num_tasks - 1} (SLURM_STEP_NUM_TASKS={num_tasks})."
        )
    per_node = []
    spec = env["SLURM_STEP_TASKS_PER_NODE"].strip()
    for part in spec.split(","):
        match = _TASKS_PER_NODE.match(part.strip())
        if not match:
            raise ClusterConfigError(
                f"SLURM_STEP_TASKS_PER_NODE {spec!r} is malformed; expected counts such as '2(x3),1'."
            )
        per_node += [int(match.group(1))] * int(match.group(2) or 1)
    if sum(per_node) != num_tasks:
        raise ClusterConfigError(
            f"SLURM_STEP_TASKS_PER_NODE {spec!r} adds up to {sum(per_node)} tasks, but "
            f"SLURM_STEP_NUM_TASKS={num_tasks}."
        )
    return SlurmStep(rank, num_tasks, env["SLURM_STEP_NODELIST"].strip(), tuple(per_node))


def slurm_jobs(num_tasks: int, strategy: str, ps_tasks: int = 1) -> dict:
    """Splits a SLURM step's tasks into task type -> count (`SlurmClusterResolver`'s `jobs`).

    All workers, except `parameter_server`: the resolver assigns ranks alphabetically, so rank 0 is
    the chief, then `ps_tasks` (default 1) ps tasks, then workers.

    Raises:
        ClusterConfigError: when a `parameter_server` job leaves no worker.
    """
    if strategy != "parameter_server":
        return {"worker": num_tasks}
    workers = num_tasks - 1 - ps_tasks
    if ps_tasks < 1 or workers < 1:
        raise ClusterConfigError(
            f"A parameter_server job of {num_tasks} SLURM tasks with {ps_tasks} ps task(s) leaves "
            f"{workers} worker(s). Run at least {ps_tasks + 2} tasks (srun --ntasks), or pass a "
            "smaller --ps-tasks."
        )
    return {"chief": 1, "ps": ps_tasks, "worker": workers}


def _slurm_gpu_arguments(env: Mapping[str, str], step: SlurmStep) -> dict:
    """`SlurmClusterResolver` needs GPU slots: placeholders on CPU nodes or under SLURM's `CUDA_VISIBLE_DEVICES`."""
    if "CUDA_VISIBLE_DEVICES" in env or shutil.which("nvidia-smi") is None:
        return {"gpus_per_node": step.max_tasks_per_node, "gpus_per_task": 1, "auto_set_gpu": False}
    return {"auto_set_gpu": True}


def slurm_cluster(strategy: str = "multi_worker_mirrored", ps_tasks: int = 1, port_base: int = SLURM_PORT_BASE) -> ClusterInfo:
    """This SLURM step's cluster, from `SlurmClusterResolver` (task types: `slurm_jobs`; ports from `port_base`).

    Raises:
        ClusterConfigError: bad SLURM variables, or the resolver rejects them (e.g. more tasks per node than GPUs).
    """
    step = parse_slurm_step()
    jobs = slurm_jobs(step.num_tasks, strategy, ps_tasks)
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=port_base, **_slurm_gpu_arguments(os.environ, step)
        )
        spec = resolver.cluster_spec().as_dict()
        task_type, task_index = resolver.get_task_info()
    except (RuntimeError, ValueError) as e:
        raise ClusterConfigError(f"SlurmClusterResolver rejected this SLURM job step: {e}") from None
    return validate_cluster({k: list(v) for k, v in spec.items()}, task_type, task_index, source="SLURM")


def resolve_cluster(strategy: str, env: Optional[Mapping[str, str]] = None, ps_tasks: int = 1) -> Optional[ClusterInfo]:
    """This process's checked cluster (TF_CONFIG, else a SLURM step), or None for one process.

    Only `MULTI_PROCESS_STRATEGIES` look for one. SLURM is tried only when `env` is None (`os.environ`),
    as `SlurmClusterResolver` reads `os.environ`. `ps_tasks` (default 1) sizes a SLURM `parameter_server` job.

    Raises:
        ClusterConfigError: malformed TF_CONFIG or SLURM step, or a cluster unfit for the strategy.
    """
    if strategy not in MULTI_PROCESS_STRATEGIES:
        return None
    cluster = parse_tf_config(env=env)
    if cluster is None and env is None and in_slurm_step():
        cluster = slurm_cluster(strategy, ps_tasks)
    check_cluster(strategy, cluster)
    return cluster
