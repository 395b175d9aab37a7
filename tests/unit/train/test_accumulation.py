"""Gradient accumulation: N micro-batches of B update like one batch of N x B.

One replica in this process; two replicas (MirroredStrategy, and MultiWorkerMirrored's
collective all-reduce on 2 local devices) in one subprocess, which splits the CPU into
2 logical devices before TensorFlow starts.
"""

import json
import textwrap
import zipfile

import keras
import numpy as np
import pytest

import tftrain
from tests.conftest import REPO, read_metrics, run_python
from tftrain.config import RecipeConfig
from tftrain.errors import ConfigError
from tftrain.train.accumulation import GradientAccumulationOptimizer, accumulate_gradients
from tftrain.train.loops import loop_for

N, B = 3, 8  # micro-batches per optimizer step, micro-batch size

# The same data, model and comparison run here and in the two-replica subprocess.
EQUIVALENCE = textwrap.dedent("""
    import keras
    import numpy as np
    import tensorflow as tf

    from tftrain.train.accumulation import accumulate_gradients

    N, B = 3, 8
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2 * N * B, 5)).astype("float32")  # two optimizer steps
    Y = rng.normal(size=(2 * N * B, 2)).astype("float32")
    OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9), "adam": lambda: keras.optimizers.Adam(0.05),
                  "adam_cosine": lambda: keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.05, 2))}

    def train(strategy, optimizer, steps, **compile_kw):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"),
                                      keras.layers.Dense(2, dtype="float32")])
            initial = [w.numpy() for w in model.weights]
            model.compile(optimizer=accumulate_gradients(OPTIMIZERS[optimizer](), steps), loss="mse", **compile_kw)
        model.fit(X, Y, batch_size=B if steps > 1 else N * B, epochs=1, shuffle=False, verbose=0)
        return model, initial

    def compare(strategy, optimizer, **compile_kw):
        large, initial = train(strategy, optimizer, 1, **compile_kw)
        micro, _ = train(strategy, optimizer, N, **compile_kw)
        pairs = zip(large.weights, micro.weights)
        return {"max_diff": max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in pairs),
                "moved": max(float(np.abs(a.numpy() - b).max()) for a, b in zip(large.weights, initial)),
                "optimizer_steps": [int(m.optimizer.iterations.numpy()) for m in (large, micro)],
                "optimizers": [type(micro.optimizer).__name__,
                               type(getattr(micro.optimizer, "inner_optimizer", None)).__name__]}
""")
_ns: dict = {}
exec(EQUIVALENCE, _ns)  # noqa: S102 - the one copy of the comparison, shared with the subprocess


def _assert_equivalent(result, atol=1e-6):
    assert result["moved"] > 1e-2  # the weights did change: the comparison is not of two untouched models
    assert result["max_diff"] < atol, result
    assert result["optimizer_steps"] == [2, 2]  # 6 micro-batches = 2 optimizer steps, as 2 large batches


@pytest.mark.parametrize("optimizer, strategy", [("sgd", "default"), ("adam", "default"), ("adam_cosine", "default"),
                                                  ("adam", "one_device")])
@pytest.mark.slow
def test_micro_batches_match_one_large_batch_on_one_replica(optimizer, strategy):
    import tensorflow as tf

    # The default strategy takes the replica-context path, a strategy object the cross-replica one.
    strategy = tf.distribute.get_strategy() if strategy == "default" else tf.distribute.OneDeviceStrategy("/cpu:0")
    _assert_equivalent(_ns["compare"](strategy, optimizer))


@pytest.mark.slow
def test_equivalence_holds_under_steps_per_execution_and_mixed_float16():
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    _assert_equivalent(_ns["compare"](strategy, "adam", steps_per_execution=4))  # an update inside an execution
    keras.mixed_precision.set_global_policy("mixed_float16")  # restored by conftest
    result = _ns["compare"](strategy, "adam")
    # Keras puts its loss scaling around the accumulator, which unscales each micro-batch before adding it.
    assert result["optimizers"] == ["LossScaleOptimizer", GradientAccumulationOptimizer.__name__]
    _assert_equivalent(result, atol=1e-3)  # float16 compute: rounding, not drift


_TWO_CPUS = ("import tensorflow as tf\n"
             "cpu = tf.config.list_physical_devices('CPU')[0]\n"
             "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n")

MIRRORED = EQUIVALENCE + textwrap.dedent("""
    import json
    out = {name: compare(tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]), name) for name in ("sgd", "adam")}
    print("RESULT " + json.dumps(out))
""")

# MultiWorkerMirrored's collective all-reduce over 2 local devices (its own process: its collectives'
# keys clash with a MirroredStrategy's in one process): the gradient all-reduces run in the same 12
# micro-batches (4 optimizer steps of 3), with and without accumulation.
MULTI_WORKER = EQUIVALENCE + textwrap.dedent("""
    import json
    from tests.profile_traces import event_counts, read_xspace
    from tftrain.callbacks import ProfilerWindow

    out = {}
    mwms = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])
    for steps in (1, N):
        with mwms.scope():
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
            model.compile(optimizer=accumulate_gradients(keras.optimizers.SGD(0.1), steps), loss="mse")
        window = ProfilerWindow(LOG_DIR + f"/{steps}", start=3, stop=15, verbose=0)
        model.fit(tf.data.Dataset.from_tensor_slices((X, Y)).repeat(3).batch(B), callbacks=[window], verbose=0)
        counts = event_counts(read_xspace(window.trace_files[0]))
        out[f"mwms_{steps}"] = {"gradient_all_reduces": sum(n for name, n in counts.items()
                                                            if "/sgd" in name and name.endswith(":CollectiveReduceV2")),
                                "captured": list(window.captured)}
    print("RESULT " + json.dumps(out))
""")


def _run_result(code: str) -> dict:
    r = run_python(_TWO_CPUS + code, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("mwms_profile")
    return {**_run_result(MIRRORED), **_run_result(f"LOG_DIR = {str(log_dir)!r}\n" + MULTI_WORKER)}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.slow
def test_micro_batches_match_one_large_batch_on_two_replicas(two_replicas, optimizer):
    _assert_equivalent(two_replicas[optimizer])


@pytest.mark.slow
def test_multi_worker_all_reduce_runs_once_per_optimizer_step(two_replicas):
    every_step, accumulated = two_replicas["mwms_1"], two_replicas[f"mwms_{N}"]
    assert every_step["captured"] == accumulated["captured"] == [3, 15]  # the same 12 micro-batches traced
    assert every_step["gradient_all_reduces"] > 0
    # 12 all-reduce rounds without accumulation, 12 / N with it: once per optimizer step, not per micro-batch.
    assert accumulated["gradient_all_reduces"] * N == every_step["gradient_all_reduces"]


# -- the Trainer -------------------------------------------------------------------

def _task(n=520):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32"))[:, None]
    model = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),  # noqa: E731
                                      keras.layers.Dense(1)])
    return tftrain.ArrayTask(model, x, y, x[:64], y[:64], loss="mse", optimizer="adam", learning_rate=0.01,
                             name="tiny")


class _Spy(keras.callbacks.Callback):
    """Records the optimizer steps and learning rate at each epoch end."""

    def __init__(self):
        super().__init__()
        self.steps, self.rates = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.steps.append(int(self.model.optimizer.iterations.numpy()))
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


@pytest.mark.slow
def test_trainer_counts_optimizer_steps_and_records_the_effective_batch(tmp_path):
    spy = _Spy()
    record = tftrain.Trainer(_task(), callbacks=[spy], epochs=2, verbose=0, seed=0, execution="graph",
                             precision="float32", batch_size=32, gradient_accumulation_steps=2,
                             steps_per_execution=3, lr_schedule="cosine", run_dir=str(tmp_path / "run")).fit()
    metrics = read_metrics(tmp_path / "run")
    assert metrics["global_batch_size"] == 32 and metrics["gradient_accumulation_steps"] == 2
    assert metrics["effective_global_batch_size"] == 64
    assert metrics["steps_per_epoch"] == 520 // 64 == 8  # optimizer steps
    assert spy.steps == [8, 16]  # examples / (global batch x N) per epoch
    # The cosine schedule counts optimizer steps: halfway (8 of 16) after the first epoch, 0 at the end.
    assert spy.rates == pytest.approx([0.005, 0.0], abs=1e-6)
    throughput = metrics["throughput"]
    assert throughput["total_steps"] == 2 * 16  # every micro-batch counted, warm-up included
    assert throughput["examples"] == throughput["steps"] * 32 and throughput["steps"] > 16
    assert record.examples_per_sec == pytest.approx(2 * 8 * 64 / record.fit_time_s)
    with zipfile.ZipFile(tmp_path / "run" / "model.keras") as saved:  # loadable without importing tftrain
        assert json.loads(saved.read("config.json"))["compile_config"]["optimizer"]["class_name"] == "Adam"
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert isinstance(model.optimizer, keras.optimizers.Adam) and int(model.optimizer.iterations.numpy()) == 16


@pytest.mark.slow
def test_a_resumed_run_continues_the_accumulation_exactly(tmp_path):
    def fit(epochs, backup=None):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.compile(optimizer=accumulate_gradients(keras.optimizers.Adam(0.05), N), loss="mse")
        callbacks = [keras.callbacks.BackupAndRestore(str(backup), delete_checkpoint=False)] if backup else []
        history = model.fit(_ns["X"], _ns["Y"], batch_size=B, epochs=epochs, shuffle=False, verbose=0,
                            callbacks=callbacks)
        return model, history.epoch

    straight, _ = fit(2)
    fit(1, tmp_path / "backup")  # stops after epoch 1; its checkpoint holds Adam's moments and the counters
    resumed, epochs_run = fit(2, tmp_path / "backup")  # as a new process would: restore, then train epoch 2
    assert epochs_run == [1]  # only the second epoch ran here: the first came from the checkpoint
    assert int(resumed.optimizer.iterations.numpy()) == 4 and int(resumed.optimizer.micro_steps.numpy()) == 12
    for a, b in zip(straight.weights, resumed.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_flag_yaml_key_and_refusals():
    from tftrain.cli import parse_config

    cfg = parse_config(["--gradient-accumulation-steps", "4"], RecipeConfig(), prog="t")
    assert cfg.train.gradient_accumulation_steps == 4
    assert RecipeConfig.from_dict({"train": {"gradient_accumulation_steps": 2}}).train.gradient_accumulation_steps == 2
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be positive"):
        RecipeConfig().override({"gradient_accumulation_steps": 0})
    with pytest.raises(ConfigError, match="not supported by the parameter-server coordinator loop"):
        loop_for("parameter_server").check(RecipeConfig().override({"gradient_accumulation_steps": 2}))
    with pytest.raises(ConfigError, match="--tune trains its trials without gradient accumulation"):
        loop_for("mirrored").check(RecipeConfig().override({"gradient_accumulation_steps": 2, "tune": 2}))
    loop_for("multi_worker_mirrored").check(RecipeConfig().override({"gradient_accumulation_steps": 2}))
    with pytest.raises(ConfigError, match="accumulates gradients itself"):
        accumulate_gradients(keras.optimizers.SGD(gradient_accumulation_steps=2), 2)
    assert accumulate_gradients("sgd", 1) == "sgd"  # N = 1 leaves the optimizer alone
