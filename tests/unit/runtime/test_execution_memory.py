"""`--execution auto`'s memory: which changes retime, and a cache file that is bad or unwritable."""

from pathlib import Path

import numpy as np
import pytest

from tftrain.runtime.execution import ExecutionChoice, StepTiming
from tftrain.runtime.execution_memory import CACHE_ENV, ExecutionMemory, cache_dir, execution_key


def _compiled(width=8, steps_per_execution=1):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width), keras.layers.Dense(1)])
    model.compile("adam", "mse", steps_per_execution=steps_per_execution)
    return model


def _batches(batch_size):
    import tensorflow as tf

    x = np.zeros((64, 4), "float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(batch_size, drop_remainder=True)


def _choice():
    timing = StepTiming(0.002, 16000.0, 0.0021, 32, 1, 16, 0.5, (0.002, 0.002))
    return ExecutionChoice("xla", {"graph": timing, "xla": timing}, "1.20x faster than graph")


def test_the_key_changes_with_the_model_the_batch_and_the_steps_per_execution():
    key = execution_key(_compiled(), _batches(32), ("graph", "xla"))
    assert key == execution_key(_compiled(), _batches(32), ("graph", "xla"))  # a rebuilt model: same key
    others = {execution_key(_compiled(width=16), _batches(32), ("graph", "xla")),
              execution_key(_compiled(), _batches(16), ("graph", "xla")),
              execution_key(_compiled(steps_per_execution=8), _batches(32), ("graph", "xla")),
              execution_key(_compiled(), _batches(32), ("graph",))}
    assert len(others) == 4 and key not in others


def test_the_key_ignores_the_learning_rate_schedule_and_has_no_memory_addresses():
    import keras

    from tftrain.runtime.execution_memory import _loss_description

    def compiled(decay_steps):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        schedule = keras.optimizers.schedules.CosineDecay(2e-3, decay_steps=decay_steps)  # changes with --epochs
        model.compile(keras.optimizers.Adam(schedule), keras.losses.MeanSquaredError())
        return model

    assert execution_key(compiled(100), _batches(32), ("graph",)) == execution_key(compiled(900), _batches(32),
                                                                                    ("graph",))
    for loss in (keras.losses.MeanSquaredError(), keras.losses.mean_squared_error, "mse"):
        assert "0x" not in _loss_description(loss)  # the same in every process


def test_a_remembered_choice_comes_back_with_its_timings_and_date(tmp_path):
    memory = ExecutionMemory(tmp_path / "execution.json")
    assert memory.get("k") is None
    memory.put("k", _choice())
    back = ExecutionMemory(tmp_path / "execution.json").get("k")
    assert back.execution == "xla" and back.timings["graph"].step_time_s == 0.002 and back.remembered
    assert "remembered: timed by a run at" in back.describe() and back.to_dict()["remembered"] == back.remembered


def test_a_corrupt_or_unwritable_memory_only_costs_a_retime(tmp_path):
    path = tmp_path / "execution.json"
    path.write_text("{not json")
    assert ExecutionMemory(path).get("k") is None
    path.write_text('{"k": {"execution": "xla"}}')  # an entry of another shape
    assert ExecutionMemory(path).get("k") is None
    path.write_text('{"k": {"execution": "eager", "timings": [], "reason": "", "saved_at": "x"}}')
    assert ExecutionMemory(path).get("k") is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    choice = _choice()
    assert ExecutionMemory(blocked / "execution.json").put("k", choice) is choice  # no error


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv(CACHE_ENV)
    import platformdirs

    assert cache_dir() == Path(platformdirs.user_cache_dir("tftrain"))


_PUTTER = """
import sys, time
from pathlib import Path

from tftrain.runtime.execution_memory import ExecutionMemory  # no TensorFlow: it starts in a fraction of a second


class Choice:  # `put` only calls `to_dict()`
    def to_dict(self):
        return {"execution": "graph", "timings": {}, "reason": "fake"}


path, worker, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
Path(f"{go}.ready-{worker}").touch()
while not go.exists():  # start together, after the slow imports
    time.sleep(0.005)
memory = ExecutionMemory(path)
for i in range(count):
    memory.put(f"{worker}-{i}", Choice())
"""


@pytest.mark.slow
def test_concurrent_processes_keep_each_others_entries(tmp_path):
    import json
    import os
    import subprocess
    import sys
    import time

    path, go, workers, count = tmp_path / "execution.json", tmp_path / "go", 4, 25  # 100 < MAX_ENTRIES
    processes = []
    try:
        for worker in range(workers):
            processes.append(subprocess.Popen([sys.executable, "-c", _PUTTER, str(path), str(worker), str(count),
                                               str(go)], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}))
        deadline = time.monotonic() + 120
        while not all(Path(f"{go}.ready-{w}").exists() for w in range(workers)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in processes), "a child did not start"
            time.sleep(0.05)
        go.touch()
        assert [p.wait(timeout=120) for p in processes] == [0] * workers
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    entries = json.loads(path.read_text(encoding="utf-8"))
    expected = {f"{w}-{i}" for w in range(workers) for i in range(count)}
    assert not expected - set(entries), f"{len(expected - set(entries))} of {len(expected)} entries lost"


def test_a_forgotten_choice_is_timed_again_and_the_others_stay(tmp_path):
    path = tmp_path / "execution.json"
    memory = ExecutionMemory(path)
    memory.put("a", _choice())
    memory.put("b", _choice())
    memory.forget("a")
    assert memory.get("a") is None and ExecutionMemory(path).get("b").execution == "xla"
    before = path.read_text()
    memory.forget("a")  # not remembered
    memory.forget(None)
    assert path.read_text() == before
    blocked = tmp_path / "file"
    blocked.write_text("")
    ExecutionMemory(blocked / "execution.json").forget("a")  # unwritable: no error


def test_a_write_that_cannot_take_the_lock_in_time_is_skipped(monkeypatch, tmp_path):
    import filelock

    from tftrain.runtime import execution_memory

    monkeypatch.setattr(execution_memory, "LOCK_TIMEOUT_S", 0.1)
    memory = ExecutionMemory(tmp_path / "execution.json")
    memory.put("a", _choice())
    choice = _choice()
    with filelock.FileLock(memory.lock_path):  # as another process writing for longer than the timeout
        assert memory.put("b", choice) is choice  # no error
        memory.forget("a")
    assert memory.get("a") is not None and memory.get("b") is None


def test_the_memory_imports_no_tensorflow():
    """The memory (and the usable-core count in its key, `tftrain.host.usable_cores`) loads without TensorFlow:
    the processes of the test above start in a fraction of a second, and a launcher reading it stays light."""
    from tests.conftest import run_python

    proc = run_python("import sys; from tftrain.runtime.execution_memory import ExecutionMemory; "
                      "print('tensorflow' in sys.modules)", timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["False"], proc.stderr[-2000:]
