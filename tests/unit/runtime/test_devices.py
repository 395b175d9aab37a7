import textwrap

import pytest

from tests.conftest import run_python
from tftrain.errors import DeviceError


def test_gpu_requested_without_gpu_is_a_clear_error():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU; the error path needs a CPU-only machine")
    from tftrain.runtime import configure_devices

    with pytest.raises(DeviceError, match="no GPU"):
        configure_devices("gpu")


def test_bad_device_name():
    from tftrain.runtime import configure_devices

    with pytest.raises(ValueError, match="Invalid device 'tpu'"):
        configure_devices("tpu")


@pytest.mark.slow
def test_split_cpu_into_logical_devices_and_late_resplit_fails():
    r = run_python(textwrap.dedent("""
        from tftrain.errors import DeviceError
        from tftrain.runtime import configure_devices, split_cpu
        info = configure_devices("cpu", cpu_replicas=3)
        print("DEVICES", info.kind, len(info.devices), info.devices[-1])
        import tensorflow as tf
        tf.constant(1.0) + 1.0  # TensorFlow initialises here
        print("LOGICAL", len(tf.config.list_logical_devices("CPU")))
        print("SAME", split_cpu(3) == list(info.devices))
        try:
            split_cpu(2)
        except DeviceError as e:
            print("ERROR", e)
    """))
    assert r.returncode == 0, r.stderr
    assert "DEVICES cpu 3 /device:CPU:2" in r.stdout
    assert "LOGICAL 3" in r.stdout and "SAME True" in r.stdout
    assert "ERROR Cannot split the CPU into 2 logical devices" in r.stdout
