"""Tests of the cluster description: SLURM parsing, strategy checks, TF_CONFIG validation."""

from __future__ import annotations

import json

import pytest

from tftrain.errors import ClusterConfigError
from tftrain.runtime import cluster as cl

SLURM = {
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "node[07-08]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


def test_parse_slurm_step_expands_tasks_per_node():
    step = cl.parse_slurm_step({**SLURM, "SLURM_STEP_NUM_TASKS": "7", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"})
    assert step.rank == 1 and step.num_tasks == 7
    assert step.tasks_per_node == (2, 2, 2, 1) and step.max_tasks_per_node == 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": None}, "SLURM_PROCID not set"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID must be a non-negative integer"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is outside 0..3"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(y2)"}, "is malformed"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2,1"}, "adds up to 3 tasks, but SLURM_STEP_NUM_TASKS=4"),
    ],
)
def test_parse_slurm_step_names_the_bad_variable(change, message):
    env = {**SLURM, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(ClusterConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cl.parse_slurm_step(env)


def test_in_slurm_step_needs_more_than_one_task():
    assert cl.in_slurm_step(SLURM)
    assert not cl.in_slurm_step({**SLURM, "SLURM_STEP_NUM_TASKS": "1"})
    assert not cl.in_slurm_step({})


def test_slurm_jobs_layout():
    assert cl.slurm_jobs(4, "multi_worker_mirrored") == {"worker": 4}
    assert cl.slurm_jobs(5, "parameter_server", ps_tasks=2) == {"chief": 1, "ps": 2, "worker": 2}
    with pytest.raises(ClusterConfigError, match="leaves 0 worker"):
        cl.slurm_jobs(3, "parameter_server", ps_tasks=2)


def test_slurm_cluster_uses_tensorflows_resolver(monkeypatch):
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU nodes: tftrain keeps it as is
    info = cl.slurm_cluster("parameter_server", ps_tasks=1)
    assert info.source == "SLURM"
    assert info.cluster == {
        "chief": ("node07:8888",), "ps": ("node07:8889",), "worker": ("node08:8888", "node08:8889"),
    }
    assert info.task == "ps:0" and not info.is_chief
    info = cl.slurm_cluster("multi_worker_mirrored")
    assert info.task == "worker:1" and info.num_workers == 4


def test_tf_config_wins_over_a_slurm_step_and_without_it_the_step_is_used(monkeypatch):
    # Both in the process environment, where a job would have them: SLURM's step and TF_CONFIG.
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    tf_config = {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    info = cl.resolve_cluster("multi_worker_mirrored")
    assert info.source == "TF_CONFIG" and info.cluster == {"worker": ("h:1", "h:2")} and info.task == "worker:0"
    assert cl.resolve_cluster("mirrored") is None  # a single-process strategy looks for neither

    monkeypatch.delenv("TF_CONFIG")
    info = cl.resolve_cluster("multi_worker_mirrored")
    assert info.source == "SLURM" and info.task == "worker:1" and info.num_workers == 4
    assert info.cluster == {"worker": ("node07:8888", "node07:8889", "node08:8888", "node08:8889")}

    for key in SLURM:
        monkeypatch.delenv(key)
    assert cl.resolve_cluster("multi_worker_mirrored") is None  # neither: one process


@pytest.mark.parametrize(
    "strategy, cluster, message",
    [
        ("multi_worker_mirrored", {"worker": ["h:1"], "ps": ["h:2"]}, "has ps tasks"),
        ("parameter_server", {"chief": ["h:1"], "worker": ["h:2"]}, "has no ps task"),
        ("parameter_server", {"worker": ["h:1"], "ps": ["h:2"]}, "has no chief task"),
    ],
)
def test_check_cluster_rejects_clusters_that_do_not_suit_the_strategy(strategy, cluster, message):
    text = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    with pytest.raises(ClusterConfigError, match=message):
        cl.resolve_cluster(strategy, env={"TF_CONFIG": text})


def test_parameter_server_without_a_cluster_says_how_to_launch():
    with pytest.raises(ClusterConfigError, match="python -m tftrain.launch --chief --workers 2 --ps 1"):
        cl.resolve_cluster("parameter_server", env={})


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"cluster": ', "not valid JSON"),
        ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 1}}', "index 1 is out of range"),
        ('{"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker", "index": 0}}', "twice"),
        ('{"cluster": {"worker": ["h:0"]}, "task": {"type": "worker", "index": 0}}', "invalid port"),
        ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "chief", "index": 0}}', "not in the cluster"),
    ],
)
def test_malformed_tf_config_names_the_mistake(text, message):
    with pytest.raises(ClusterConfigError, match=message):
        cl.parse_tf_config(text)
