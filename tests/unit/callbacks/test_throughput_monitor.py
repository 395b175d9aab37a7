"""ThroughputMonitor: figures on a synthetic clock, and real step counting under steps_per_execution."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.callbacks import ThroughputMonitor


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeIterations:
    def __init__(self):
        self.value = 0

    def numpy(self):
        return np.int64(self.value)


def fake_model():
    return types.SimpleNamespace(optimizer=types.SimpleNamespace(iterations=FakeIterations()), stop_training=False)


def drive(monitor, model, clock, epochs, executions, steps_per_execution, seconds_per_step, first_execution_s,
          epoch_setup_s=0.0):
    """Calls the hooks as Keras 3 does: one batch hook pair per execution."""
    monitor.set_model(model)
    monitor.on_train_begin()
    for epoch in range(epochs):
        monitor.on_epoch_begin(epoch)
        clock.now += epoch_setup_s  # Keras makes the epoch's input iterator before its first batch hook
        for i in range(executions):
            monitor.on_train_batch_begin(i * steps_per_execution)
            slow = epoch == 0 and i == 0
            clock.now += first_execution_s if slow else seconds_per_step * steps_per_execution
            model.optimizer.iterations.value += steps_per_execution
            monitor.on_train_batch_end(i * steps_per_execution + steps_per_execution - 1)
        clock.now += 5.0  # epoch end, validation: not a training step
        monitor.on_epoch_end(epoch)
    monitor.on_train_end()


def test_monitor_figures_on_a_synthetic_clock(tmp_path):
    clock = FakeClock()

    def input_batches():
        while True:
            clock.now += 0.005  # the input alone: 5 ms per batch
            yield None

    monitor = ThroughputMonitor(
        batch_size=32, log_dir=tmp_path, input_data=input_batches(), warmup_steps=4, clock=clock, input_batches=10
    )
    model = fake_model()
    drive(monitor, model, clock, epochs=2, executions=5, steps_per_execution=4, seconds_per_step=0.01,
          first_execution_s=3.0)
    result = monitor.result()
    # 2 epochs x 5 executions x 4 steps = 40 steps, the first execution (4 steps) is warm-up.
    assert result["total_steps"] == 40
    assert result["steps"] == 36
    assert result["examples"] == 36 * 32  # global examples: steps x global batch size
    assert result["seconds"] == pytest.approx(36 * 0.01)
    assert result["examples_per_sec"] == pytest.approx(3200.0)
    assert result["step_time_median_s"] == pytest.approx(0.01)
    assert result["step_time_p90_s"] == pytest.approx(0.01)
    assert [e["steps"] for e in result["epochs"]] == [16, 20]
    assert result["epochs"][1]["examples_per_sec"] == pytest.approx(3200.0)
    assert result["input"]["input_fraction"] == pytest.approx(0.5)
    assert result["input"]["verdict"].startswith("input-bound: 50% of each step waits for data")
    assert "PyDataset workers=N" in result["input"]["verdict"] and "cache()" not in result["input"]["verdict"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "train"))
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {"throughput/examples_per_sec", "throughput/step_time_median_s", "throughput/step_time_p90_s",
            "throughput/input_fraction"} <= tags
    steps = [e.step for e in events.Tensors("throughput/examples_per_sec")]
    assert steps == [0, 1]
    value = tf.make_ndarray(events.Tensors("throughput/examples_per_sec")[1].tensor_proto)
    assert float(value) == pytest.approx(3200.0)


def test_each_epoch_s_input_set_up_counts_in_its_first_execution():
    clock, model = FakeClock(), fake_model()
    monitor = ThroughputMonitor(batch_size=32, warmup_steps=4, clock=clock)
    drive(monitor, model, clock, epochs=2, executions=5, steps_per_execution=4, seconds_per_step=0.01,
          first_execution_s=3.0, epoch_setup_s=0.1)
    result = monitor.result()  # epoch 2: 20 steps in 0.2 s plus its 0.1 s of set-up
    assert result["epochs"][1]["examples_per_sec"] == pytest.approx(20 * 32 / 0.3)
    assert result["step_time_median_s"] == pytest.approx(0.01)  # one slow execution an epoch: not the median


def test_monitor_infers_the_global_batch_size_from_a_dataset():
    ds = tf.data.Dataset.from_tensor_slices(np.zeros((100, 3))).batch(25, drop_remainder=True)
    assert ThroughputMonitor(input_data=ds).batch_size == 25
    assert ThroughputMonitor(input_data=ds.unbatch().batch(25)).batch_size is None  # partial last batch


def test_monitor_counts_real_optimizer_steps_under_steps_per_execution():
    x = np.random.default_rng(0).random((320, 4)).astype("float32")
    y = (x.sum(axis=1) > 2).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)  # 10 batches
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    monitor = ThroughputMonitor(input_data=ds, warmup_steps=4)
    model.fit(ds, epochs=2, callbacks=[monitor], verbose=0, shuffle=False)
    result = monitor.result()
    # Executions per epoch: 4 + 4 + 2 steps (the last one partial): 20 real steps, not 6 hooks x 4.
    assert int(model.optimizer.iterations.numpy()) == 20
    assert result["total_steps"] == 20
    assert result["steps"] == 16
    assert result["examples"] == 16 * 32
    assert [e["steps"] for e in result["epochs"]] == [6, 10]
    assert result["input"] is not None and 0 < result["input"]["input_fraction"] <= 1
    assert result["monitor_overhead_s"] >= 0


def test_monitor_counts_full_last_executions_with_steps_per_epoch_on_repeated_data():
    # steps_per_epoch=10 with steps_per_execution=4: Keras runs 3 full executions, 12 steps per epoch.
    x = np.zeros((64, 4), "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(64, "int32"))).batch(8, drop_remainder=True).repeat()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "sparse_categorical_crossentropy", steps_per_execution=4)
    monitor = ThroughputMonitor(batch_size=8, warmup_steps=0)
    model.fit(ds, epochs=2, steps_per_epoch=10, callbacks=[monitor], verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 24
    assert monitor.result()["total_steps"] == 24
    assert [e["steps"] for e in monitor.result()["epochs"]] == [12, 12]


@pytest.mark.slow
def test_monitor_counts_steps_that_loss_scaling_skipped():
    # An absurd initial loss scale makes the first float16 gradients overflow: LossScaleOptimizer
    # skips those updates and does not advance `iterations`, yet the steps ran and took time.
    # Logits, not probabilities: a probability loss clips outputs above 1, and a model whose random
    # initial weights gave such outputs had zero gradients, which never overflow.
    keras.utils.set_random_seed(0)
    x = np.ones((64, 4), "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.zeros(64, "int32"))).batch(8, drop_remainder=True).repeat()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, dtype="mixed_float16"),
                              keras.layers.Dense(2, dtype="float32")])
    model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0 ** 60),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=2)
    monitor = ThroughputMonitor(batch_size=8, warmup_steps=0)
    model.fit(ds, epochs=2, steps_per_epoch=10, callbacks=[monitor], verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) < 20  # some updates were skipped
    assert monitor.result()["total_steps"] == 20


def test_monitor_refuses_arrays_as_input_data():
    from tftrain.errors import ConfigError

    x = np.zeros((64, 4), "float32")
    with pytest.raises(ConfigError, match="tuple of arrays, which has no input pipeline to time"):
        ThroughputMonitor(batch_size=8, input_data=(x, np.zeros(64)))


def test_a_monitor_without_a_batch_size_says_why_it_gives_no_examples_per_sec(capsys):
    clock, model = FakeClock(), fake_model()
    monitor = ThroughputMonitor(clock=clock, warmup_steps=1, verbose=1)  # e.g. a .batch(64) without drop_remainder
    drive(monitor, model, clock, epochs=1, executions=4, steps_per_execution=1, seconds_per_step=0.01,
          first_execution_s=1.0)
    assert monitor.result()["examples_per_sec"] is None
    assert "examples/sec unknown (the batches have no fixed size: pass batch_size=)" in capsys.readouterr().out
