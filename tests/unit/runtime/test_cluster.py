import json

import pytest

from tftrain.errors import ClusterConfigError
from tftrain.runtime.cluster import ClusterInfo, parse_tf_config

WORKERS = ["127.0.0.1:20001", "127.0.0.1:20002"]


def tf_config(cluster=None, task=None):
    return json.dumps({"cluster": cluster or {"worker": WORKERS}, "task": task or {"type": "worker", "index": 0}})


def test_unset_or_empty_is_single_process():
    assert parse_tf_config(env={}) is None
    assert parse_tf_config("  ") is None


def test_reads_env_by_default(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(task={"type": "worker", "index": 1}))
    info = parse_tf_config()
    assert info.task == "worker:1" and info.num_workers == 2 and not info.is_chief


def test_worker_zero_is_chief_without_a_chief_task():
    info = parse_tf_config(tf_config())
    assert info.is_chief


def test_chief_task_and_ps_counts():
    cluster = {"chief": ["127.0.0.1:20000"], "worker": WORKERS, "ps": ["127.0.0.1:20003"]}
    info = parse_tf_config(tf_config(cluster, {"type": "worker", "index": 0}))
    assert not info.is_chief and info.num_workers == 3 and info.num_ps == 1
    assert parse_tf_config(tf_config(cluster, {"type": "chief", "index": 0})).is_chief


def test_round_trips_through_to_tf_config():
    info = parse_tf_config(tf_config(task={"type": "worker", "index": 1}))
    assert parse_tf_config(info.to_tf_config()) == info


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), "no 'cluster'"),
        (tf_config({"wrker": WORKERS}), "unknown task type 'wrker'"),
        (tf_config({"worker": []}), "non-empty list"),
        (tf_config({"worker": ["localhost"]}), "host:port"),
        (tf_config({"worker": ["127.0.0.1:0"]}), "invalid port '0'"),
        (tf_config({"worker": ["127.0.0.1:70000"]}), "invalid port '70000'"),
        (tf_config({"worker": [":123"]}), "no host"),
        (tf_config({"worker": ["127.0.0.1:1", "127.0.0.1:1"]}), "twice"),
        (tf_config({"chief": ["a:1", "b:2"], "worker": WORKERS}), "one address"),
        (json.dumps({"cluster": {"worker": WORKERS}}), "no valid 'task'"),
        (tf_config(task={"type": "ps", "index": 0}), "'ps' is not in the cluster"),
        (tf_config(task={"type": "worker", "index": 2}), "out of range"),
        (tf_config(task={"type": "worker", "index": "0"}), "must be an integer"),
    ],
)
def test_malformed_tf_config_names_the_mistake(text, pattern):
    with pytest.raises(ClusterConfigError, match=pattern):
        parse_tf_config(text)
