import textwrap

import pytest

from tests.conftest import run_python
from tftrain.errors import ClusterConfigError, ConfigError
from tftrain.runtime.cluster import parse_tf_config
from tftrain.runtime.devices import DeviceInfo

CPU = DeviceInfo("cpu", ("/device:CPU:0",))


@pytest.mark.slow
def test_strategies_on_two_logical_cpus():
    r = run_python(textwrap.dedent("""
        from tftrain.config import RuntimeConfig
        from tftrain.runtime import setup, make_strategy
        rt = setup(RuntimeConfig(strategy="mirrored", cpu_replicas=2))
        print("MIRRORED", type(rt.strategy).__name__, rt.num_replicas)
        print("DEFAULT", make_strategy("default", rt.devices).num_replicas_in_sync)
        s = make_strategy("one_device", rt.devices)
        print("ONE", type(s).__name__, s.num_replicas_in_sync)
        s = make_strategy("multi_worker", rt.devices)
        import tensorflow as tf
        print("MWMS", isinstance(s, tf.distribute.MultiWorkerMirroredStrategy), s.num_replicas_in_sync)
        # Keras's fit reduces the first batch before building the model; a string column there failed.
        values = rt.strategy.experimental_distribute_values_from_function(
            lambda ctx: (tf.constant(["ab"[ctx.replica_id_in_sync_group]] * 2), tf.constant([True, False]),
                         tf.constant([1.0, 3.0]) * float(ctx.replica_id_in_sync_group + 1)))
        text, mask, number = rt.strategy.reduce("MEAN", values, axis=None)
        print("REDUCED", text.numpy().tolist(), mask.numpy().tolist(), number.numpy().tolist())
    """))
    assert r.returncode == 0, r.stderr
    assert "MIRRORED KerasMirroredStrategy 2" in r.stdout
    assert "REDUCED [b'a', b'a'] [True, False] [1.5, 4.5]" in r.stdout  # the first replica's strings
    assert "DEFAULT 1" in r.stdout
    assert "ONE OneDeviceStrategy 1" in r.stdout
    assert "MWMS True 1" in r.stdout


def test_unknown_strategy_and_communication():
    from tftrain.runtime import make_strategy

    with pytest.raises(ConfigError, match="Invalid strategy 'mirorred'"):
        make_strategy("mirorred", CPU)
    with pytest.raises(ConfigError, match="Invalid communication 'mpi'"):
        make_strategy("multi_worker_mirrored", CPU, communication="mpi")
    with pytest.raises(ConfigError, match="nccl"):
        make_strategy("multi_worker_mirrored", CPU, communication="nccl")


def test_multi_worker_refuses_ps_tasks():
    from tftrain.runtime import make_strategy

    cluster = parse_tf_config(
        '{"cluster": {"worker": ["127.0.0.1:20001"], "ps": ["127.0.0.1:20002"]},'
        ' "task": {"type": "worker", "index": 0}}'
    )
    with pytest.raises(ClusterConfigError, match="ps tasks"):
        make_strategy("multi_worker_mirrored", CPU, cluster)


def test_setup_validates_tf_config_before_building_the_strategy():
    from tftrain.config import RuntimeConfig
    from tftrain.runtime import setup

    with pytest.raises(ClusterConfigError, match="not valid JSON"):
        setup(RuntimeConfig(strategy="multi_worker_mirrored"), env={"TF_CONFIG": "{oops"})


def test_the_eager_overhead_warning_is_silenced_and_others_are_kept(caplog):
    import logging

    from tftrain.runtime.devices import DeviceInfo
    from tftrain.runtime.strategy import make_strategy

    make_strategy("default", DeviceInfo("cpu", ("/device:CPU:0",)), None)
    logger = logging.getLogger("tensorflow")
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        logger.warning("Using MirroredStrategy eagerly has significant overhead currently.")
        logger.warning("something a user needs")
    assert [r.getMessage() for r in caplog.records] == ["something a user needs"]
