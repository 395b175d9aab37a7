"""tftrain.runtime.memory: glibc malloc thresholds after TensorFlow's GeneratorDataset patch."""

import platform

import pytest

from tests.conftest import run_python
from tftrain.runtime import memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Page faults of 200 allocate-fill-free rounds of a 1 MiB buffer: with TensorFlow's patch
# each round maps fresh pages (about 256 faults); with the thresholds restored the heap
# reuses the same pages. Counts, not times, so load on the machine does not change them.
FAULTS = """
import resource
import numpy as np
import tensorflow as tf
from tftrain.runtime import memory

import threading

def faults():
    # In a second thread, as TensorFlow's op threads do: its own malloc arena.
    def loop():
        for _ in range(200):
            buffer = np.ones(1 << 18, dtype=np.float32)  # 1 MiB, written
            del buffer
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    thread = threading.Thread(target=loop)
    thread.start()
    thread.join()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

memory._apply_tensorflow_patch_now()
patched = faults()
settings = memory.restore_malloc_thresholds()
restored = faults()
print("RESULT", settings.applied, patched, restored)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
@pytest.mark.slow
def test_restored_thresholds_stop_the_page_faults_of_large_buffers():
    r = run_python(FAULTS)
    assert r.returncode == 0, r.stderr[-2000:]
    applied, patched, restored = r.stdout.split("RESULT", 1)[1].split()
    assert applied == "True"
    assert int(patched) > 20_000, "TensorFlow's patch no longer makes 1 MiB buffers fault; revisit the module"
    assert int(restored) < int(patched) // 10


@pytest.mark.parametrize("kwargs", [{"mmap_threshold_bytes": 0}, {"trim_threshold_bytes": -1},
                                    {"mmap_threshold_bytes": 2**31}, {"trim_threshold_bytes": True}])
def test_bad_thresholds_are_refused(kwargs):
    with pytest.raises(ValueError, match=r"must be an integer in 1\.\.2147483647"):
        memory.restore_malloc_thresholds(**kwargs)


def test_describe_names_the_thresholds_or_the_reason():
    assert "glibc malloc thresholds 32 MiB / 64 MiB" in memory.MallocSettings(
        True, memory.MMAP_THRESHOLD_BYTES, memory.TRIM_THRESHOLD_BYTES).describe()
    assert "no glibc on darwin" in memory.MallocSettings(False, reason="no glibc on darwin").describe()


def test_nothing_changes_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: (None, "no glibc on darwin"))
    monkeypatch.setattr(memory, "_apply_tensorflow_patch_now", lambda: pytest.fail("must not run TF's patch"))
    settings = memory.restore_malloc_thresholds()
    assert settings == memory.MallocSettings(False, reason="no glibc on darwin")


def test_a_users_own_malloc_settings_are_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setattr(memory, "_apply_tensorflow_patch_now", lambda: pytest.fail("must not run TF's patch"))
    settings = memory.restore_malloc_thresholds()
    assert not settings.applied and "MALLOC_ARENA_MAX is set" in settings.reason


def test_glibc_tunables_count_only_for_malloc(monkeypatch):
    for name in memory.USER_MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
    assert memory._user_malloc_setting() == ""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000")
    assert memory._user_malloc_setting() == "GLIBC_TUNABLES"


SETUP = """
from tftrain import runtime
from tftrain.config import RuntimeConfig
rt = runtime.setup(RuntimeConfig(strategy=STRATEGY))
print("RESULT", None if rt.malloc is None else rt.malloc.applied)
print("\\n".join(rt.describe()))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
@pytest.mark.parametrize("strategy,expected", [("default", "None"), ("mirrored", "True")])
@pytest.mark.slow
def test_setup_restores_the_thresholds_only_for_generator_input_strategies(strategy, expected):
    r = run_python(SETUP.replace("STRATEGY", repr(strategy)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("RESULT", 1)[1].split()[0] == expected
    assert ("memory:    freed buffers kept for reuse" in r.stdout) == (expected == "True")
