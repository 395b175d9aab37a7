"""`--execution auto`'s memory: which changes retime, and a cache file that is bad or unwritable."""

from pathlib import Path

import numpy as np

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
