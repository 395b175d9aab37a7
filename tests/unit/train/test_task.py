"""Task and its adapters: splits, pipelines, compile arguments, binding, errors."""

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

import tftrain
from tftrain.config import RecipeConfig, hparam
from tftrain.errors import ConfigError


def _model():
    import keras

    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def _arrays(n=100):
    x = np.arange(n * 3, dtype="float32").reshape(n, 3)
    return x, x[:, :1] * 2


def _labels(ds):
    return np.concatenate([y.numpy() for _, y in ds]).ravel()


def test_a_builder_gets_the_hparams_only_when_it_needs_or_can_take_them():
    from tftrain.train.tasks.base import _call_builder

    assert _call_builder(lambda width=32: width, None) == 32  # no task hparams: its own default
    assert _call_builder(lambda hp=None: hp, "hp") == "hp"
    assert _call_builder(lambda hp: hp, None) is None  # a required argument always gets them
    assert _call_builder(lambda: "none", "hp") == "none"
    assert _call_builder(lambda *, width=3: width, "hp") == 3  # keyword-only: not for the hparams


def test_array_task_holds_out_the_last_fraction_for_validation():
    x, y = _arrays(100)
    task = tftrain.ArrayTask(_model, x, y, loss="mse").bind(RecipeConfig().override({"validation_split": 0.2}))
    assert task.num_train_examples == 80
    val = _labels(task.validation_data(16))
    np.testing.assert_array_equal(val, y[80:].ravel())  # in order, every example
    train = _labels(task.train_data(16))
    assert len(train) == 80 and set(train) == set(y[:80].ravel())  # shuffled, whole batches (80 = 5 x 16)


def test_train_examples_cap_applies_before_the_split():
    x, y = _arrays(100)
    task = tftrain.ArrayTask(_model, x, y, loss="mse").bind(
        RecipeConfig().override({"train_examples": 50, "validation_split": 0.1}))
    assert task.num_train_examples == 45 and len(_labels(task.validation_data(8))) == 5


def test_array_task_with_its_own_validation_set_ignores_the_split():
    x, y = _arrays(40)
    task = tftrain.ArrayTask(_model, x, y, validation_data=(x[:7], y[:7]), loss="mse").bind(
        RecipeConfig().override({"validation_split": 0.5}))
    assert task.num_train_examples == 40 and len(_labels(task.validation_data(4))) == 7


def test_array_task_takes_dicts_of_arrays_for_multi_input_models():
    x = {"a": np.zeros((10, 2), "float32"), "b": np.ones((10, 5), "float32")}
    task = tftrain.ArrayTask(_model, x, np.arange(10), loss="mse").bind(RecipeConfig())
    features, labels = next(iter(task.train_data(4)))
    assert features["a"].shape == (4, 2) and features["b"].shape == (4, 5) and labels.shape == (4,)


def test_array_task_refuses_arrays_of_different_lengths():
    with pytest.raises(ConfigError, match="differ in length"):
        tftrain.ArrayTask(_model, {"a": np.zeros((10, 2)), "b": np.zeros((9, 2))}, np.zeros(10), loss="mse")


def test_sharded_training_data_keeps_whole_global_batches_and_disjoint_shards():
    x, y = _arrays(70)
    task = tftrain.ArrayTask(_model, x, y, loss="mse").bind(RecipeConfig())
    shards = [_labels(task.train_data(16, tf.distribute.InputContext(2, i, 2))) for i in range(2)]
    assert [len(s) for s in shards] == [32, 32]  # 64 = 4 whole global batches; 6 examples dropped
    assert not set(shards[0]) & set(shards[1])


def test_array_task_converts_each_array_once_per_run(monkeypatch):
    converted = []
    real = tf.constant
    monkeypatch.setattr(tf, "constant", lambda value, *a, **k: converted.append(type(value)) or real(value, *a, **k))
    x, y = _arrays(64)
    task = tftrain.ArrayTask(_model, x, y, x[:8], y[:8], loss="mse").bind(RecipeConfig())
    first = [b for b, _ in task.train_data(16)]
    for _ in range(3):  # the probe batches and training build the pipeline again
        task.train_data(16)
    task.test_data(8)
    assert converted.count(np.ndarray) == 4  # x, y, x_test, y_test: once each
    task.release()  # the run ended: its copies go
    assert not task._tensor_memo
    again = [b for b, _ in task.train_data(16)]
    assert sorted(np.concatenate(first)[:, 0]) == sorted(np.concatenate(again)[:, 0]) == sorted(x[:, 0])
    x[0, 0] = -1.0  # a new run binds anew and sees the arrays as they are now
    rebound = tftrain.ArrayTask(_model, x, y, loss="mse").bind(RecipeConfig())
    assert -1.0 in np.concatenate([b for b, _ in rebound.train_data(16)])[:, 0]


def test_too_large_a_validation_split_is_refused():
    x, y = _arrays(1)
    task = tftrain.ArrayTask(_model, x, y, loss="mse").bind(RecipeConfig().override({"validation_split": 0.5}))
    with pytest.raises(ConfigError, match="leaves none to train on"):
        task.num_train_examples


@dataclasses.dataclass(frozen=True)
class HP:
    units: int = hparam(4, "units", minimum=1)


def test_bind_gives_the_builder_the_configured_hyperparameters():
    import keras

    def build(hp):
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(hp.units)])

    x, y = _arrays(8)
    task = tftrain.ArrayTask(build, x, y, loss="mse", hparams=HP())
    bound = task.bind(task.default_config().override({"units": 7}))
    assert bound.build_model().output_shape == (None, 7)
    assert task.hparams == HP()  # the user's task is left as it was


def test_optimizer_names_instances_and_functions_take_the_run_learning_rate():
    import keras

    x, y = _arrays(8)
    cfg = RecipeConfig().override({"learning_rate": 0.25})
    for spec, cls in (("sgd", keras.optimizers.SGD), (keras.optimizers.RMSprop(0.9, rho=0.5), keras.optimizers.RMSprop),
                      (lambda lr: keras.optimizers.Adam(lr), keras.optimizers.Adam)):
        opt = tftrain.ArrayTask(_model, x, y, loss="mse", optimizer=spec).bind(cfg).compile_args(10)["optimizer"]
        assert isinstance(opt, cls) and float(opt.learning_rate) == pytest.approx(0.25)
    default = tftrain.ArrayTask(_model, x, y, loss="mse", optimizer="sgd").bind(RecipeConfig()).compile_args(None)
    assert float(default["optimizer"].learning_rate) == pytest.approx(0.01)  # SGD's own default
    with pytest.raises(ConfigError, match="Unknown optimizer 'sgdd'"):
        tftrain.ArrayTask(_model, x, y, loss="mse", optimizer="sgdd").bind(RecipeConfig()).compile_args(None)
    with pytest.raises(ConfigError, match="optimizer is a function of the learning rate, and no learning rate"):
        tftrain.ArrayTask(_model, x, y, loss="mse", optimizer=lambda lr: keras.optimizers.Adam(lr)).bind(
            RecipeConfig()).compile_args(None)


def test_metric_classes_and_factories_are_built_fresh_by_compile_args():
    import functools

    import keras

    def rmse(y_true, y_pred):
        return keras.ops.sqrt(keras.ops.mean(keras.ops.square(y_true - y_pred)))

    given = keras.metrics.MeanSquaredError(name="given")
    x, y = _arrays(8)
    metrics = [keras.metrics.MeanAbsoluteError, functools.partial(keras.metrics.AUC, curve="PR"),
               lambda: keras.metrics.MeanAbsolutePercentageError(name="mape"), "mse", rmse, given]
    task = tftrain.ArrayTask(_model, x, y, loss="mse", metrics=metrics).bind(RecipeConfig())
    first, second = task.compile_args(None)["metrics"], task.compile_args(None)["metrics"]
    assert isinstance(first[0], keras.metrics.MeanAbsoluteError)
    assert isinstance(first[1], keras.metrics.AUC) and first[1].curve.name == "PR"
    assert isinstance(first[2], keras.metrics.MeanAbsolutePercentageError) and first[2].name == "mape"
    assert first[3:] == ["mse", rmse, given]  # names, functions (y_true, y_pred) and objects as given
    assert all(a is not b for a, b in zip(first[:3], second[:3]))  # each compile builds its own
    assert task.metrics is metrics and metrics[0] is keras.metrics.MeanAbsoluteError  # the task keeps its specs
    per_output = tftrain.ArrayTask(_model, x, y, loss="mse", metrics={"out": [keras.metrics.MeanAbsoluteError]})
    assert isinstance(per_output.compile_args(None)["metrics"]["out"][0], keras.metrics.MeanAbsoluteError)


def test_metric_classes_that_need_arguments_and_factories_of_non_metrics_are_refused():
    import keras

    x, y = _arrays(8)
    with pytest.raises(ConfigError, match=r"Metric class keras.metrics.MeanIoU cannot be built without arguments "
                                          r"\(num_classes.*functools.partial\(keras.metrics.MeanIoU, num_classes=...\)"):
        tftrain.ArrayTask(_model, x, y, loss="mse", metrics=[keras.metrics.MeanIoU])
    task = tftrain.ArrayTask(_model, x, y, loss="mse", metrics=[lambda: "mae"])
    with pytest.raises(ConfigError, match="takes no arguments, so it was called to build a metric, but it returned str"):
        task.compile_args(None)


def test_cosine_schedule_spans_the_run_when_steps_are_known():
    import keras

    x, y = _arrays(8)
    cfg = RecipeConfig().override({"learning_rate": 0.1, "lr_schedule": "cosine", "epochs": 3})
    task = tftrain.ArrayTask(_model, x, y, loss="mse").bind(cfg)
    rate = task.run_learning_rate(steps_per_epoch=5)
    assert isinstance(rate, keras.optimizers.schedules.CosineDecay) and rate.decay_steps == 15
    assert task.run_learning_rate(None) == 0.1  # unknown steps: constant


def test_dataset_task_adds_only_what_is_asked():
    x, y = _arrays(20)

    def train():
        return tf.data.Dataset.from_tensor_slices((x, y))

    task = tftrain.DatasetTask(_model, train, loss="mse", prefetch=False).bind(RecipeConfig())
    assert task.num_train_examples == 20  # the dataset's cardinality
    np.testing.assert_array_equal(_labels(task.train_data(8)), y[:16].ravel())  # not shuffled, remainder dropped
    unbatched = tftrain.DatasetTask(_model, lambda size: train().batch(size), batch=False, loss="mse")
    first = next(iter(unbatched.bind(RecipeConfig()).train_data(5)))
    assert first[0].shape == (5, 3)
    assert "tftrain adds: shard (multi-worker), batch" in task.describe_data()[0] and len(task.describe_data()) == 1
    # Batches given where examples are expected (batch=True): one line says so and how to fix it.
    twice = tftrain.DatasetTask(_model, lambda: train().batch(4), loss="mse").bind(RecipeConfig())
    assert twice.describe_data()[1].startswith("warning:   the training examples' first dimension is unknown")
    assert "pass batch=False" in twice.describe_data()[1]
    # Examples whose own first dimension varies (decoded images, sequences) with a scalar label are no sign of it.
    images = tftrain.DatasetTask(_model, lambda: tf.data.Dataset.from_tensor_slices((x, y[:, 0])).map(
        lambda a, b: (tf.boolean_mask(a, a > -1e9), b)), loss="mse").bind(RecipeConfig())
    assert images.train_fn().element_spec[0].shape.as_list() == [None] and len(images.describe_data()) == 1


def test_dataset_task_validation_split_needs_a_known_count():
    x, y = _arrays(20)
    gen = tftrain.DatasetTask(_model, lambda: tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True),
                              loss="mse").bind(RecipeConfig().override({"validation_split": 0.25}))
    with pytest.raises(ConfigError, match="--validation-split needs unbatched examples of known count"):
        gen.validation_data(4)
    known = tftrain.DatasetTask(_model, lambda: tf.data.Dataset.from_tensor_slices((x, y)), loss="mse",
                                num_train_examples=20).bind(RecipeConfig().override({"validation_split": 0.25}))
    np.testing.assert_array_equal(_labels(known.validation_data(4)), y[15:].ravel())
    assert known.num_train_examples == 15
    [line] = known.describe_data()  # the data line says what was held out
    assert "(15 training examples, 5 held out for validation (the last 0.25))" in line, line


def _write_records(path, n, label_scale):
    """A TFRecord file of n examples: x = [i, i, i], y = [label_scale * i]; returns its path."""
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(n):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i, i])),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=[label_scale * i]))})).SerializeToString())
    return str(path)


def parse(record):
    """The parse function of `_write_records`' files."""
    f = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([3], tf.float32),
                                            "y": tf.io.FixedLenFeature([1], tf.float32)})
    return f["x"], f["y"]


def test_tfrecord_task_reads_files_with_the_parse_function(tmp_path):
    path = _write_records(tmp_path / "d.tfrecord", 12, label_scale=2)

    task = tftrain.TFRecordTask(_model, [path], parse, test_files=[path], num_train_examples=12, loss="mse")
    bound = task.bind(RecipeConfig())
    assert sorted(_labels(bound.train_data(4))) == [2.0 * i for i in range(12)]
    assert len(_labels(bound.test_data(5))) == 12
    with pytest.raises(ConfigError, match="pass validation_files"):
        task.bind(RecipeConfig().override({"validation_split": 0.1})).validation_data(4)


@pytest.mark.slow
def test_a_tfrecord_task_that_undercounts_its_records_is_told_after_the_first_epoch(tmp_path, capsys):
    path = _write_records(tmp_path / "d.tfrecord", 32, label_scale=1)
    task = tftrain.TFRecordTask(_model, [path], parse, num_train_examples=8, loss="mse")
    tftrain.Trainer(task, epochs=2, batch_size=4, run_dir=str(tmp_path / "run")).fit()
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "where the plan counts" in line]
    # 8 batches; Keras's step counter may count one more at the end of data of unknown length
    assert len(lines) == 1 and re.search(r"epoch 1 ran [89] steps where the plan counts 2 from the task's 8 training "
                                         r"examples at batch 4: .* reaches 0 early", lines[0])


def test_adapters_refuse_a_missing_model_function():
    x, y = _arrays(4)
    with pytest.raises(ConfigError, match="build_model must be a function"):
        tftrain.ArrayTask("model", x, y, loss="mse")


def test_loss_none_trains_a_model_that_adds_its_own_loss_and_refuses_one_without(tmp_path):
    import keras

    class Regularised(keras.layers.Layer):  # the only loss: compile(loss=None), as plain Keras allows
        def call(self, x):
            self.add_loss(keras.ops.mean(keras.ops.square(x)))
            return x

    def adds_loss():
        inputs = keras.Input((3,))
        return keras.Model(inputs, Regularised()(keras.layers.Dense(1)(inputs)))

    x, y = _arrays(64)
    record = tftrain.Trainer(tftrain.ArrayTask(adds_loss, x, y, loss=None), epochs=2, verbose=0, batch_size=16,
                             run_dir=str(tmp_path / "adds")).fit()
    assert record.history["loss"][1] < record.history["loss"][0]
    with pytest.raises(ConfigError, match="No loss to compute"):
        tftrain.Trainer(tftrain.ArrayTask(_model, x, y, loss=None), epochs=1, verbose=0,
                        run_dir=str(tmp_path / "none")).fit()
    assert not (tmp_path / "none").exists()


def test_base_task_says_what_a_subclass_must_define():
    with pytest.raises(NotImplementedError, match="must define build_model"):
        tftrain.Task().build_model()


def test_image_folder_task_splits_files_and_says_when_decoding_is_the_cost(tmp_path):
    from tests.image_folders import write_mnist_image_folder

    folder = write_mnist_image_folder(tmp_path / "imgs", per_class=4)
    task = tftrain.ImageFolderTask(_model, folder, image_size=(28, 28))
    bound = task.bind(RecipeConfig().override({"validation_split": 0.25, "cache": False}))
    assert bound.num_train_examples == 30 and task.num_train_examples is None  # the user's task is left unbound
    images, labels = next(iter(bound.validation_data(10)))
    assert images.shape == (10, 28, 28, 3) and labels.dtype == tf.int32
    assert bound.example_unit == "images" and "turn --cache back on" in bound.input_bound_hint()
    assert "10 classes" in bound.describe_data()[0] and bound.class_names[0] == "0"


def test_dataset_task_refuses_a_split_of_batched_data():
    task = tftrain.DatasetTask(_model, lambda size: tf.data.Dataset.range(8).batch(size), batch=False, loss="mse")
    with pytest.raises(ConfigError, match="with batch=False DatasetTask gets batches"):
        task.bind(RecipeConfig().override({"validation_split": 0.5}))


def test_image_folder_train_examples_keeps_every_class_and_test_classes_must_match(tmp_path):
    from tests.image_folders import write_mnist_image_folder
    from tftrain.errors import DataError

    folder = write_mnist_image_folder(tmp_path / "imgs", per_class=3)
    bound = tftrain.ImageFolderTask(_model, folder, image_size=(28, 28)).bind(
        RecipeConfig().override({"train_examples": 12}))
    assert bound.num_train_examples == 12 and len(set(bound._files["train"].labels)) >= 5
    import shutil

    other = tmp_path / "other"
    shutil.copytree(folder / "0", other / "0")  # one class of ten
    with pytest.raises(DataError, match="labels would not match"):
        bound.set_test_directory(other)


def test_tfrecord_train_examples_caps_records_before_the_cache(tmp_path):
    path = _write_records(tmp_path / "d.tfrecord", 10, label_scale=1)

    task = tftrain.TFRecordTask(_model, [path], parse, loss="mse").bind(RecipeConfig().override({"train_examples": 6}))
    assert sorted(_labels(task.train_data(2))) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert task.num_train_examples == 6 and len(list(task.probe_data(2, 2))) == 2


def _dataset_ops(ds) -> list:
    """The op names of a dataset's graph, input first (e.g. RangeDataset ... PrefetchDataset)."""
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    return [node.op for node in graph.node]


def _shuffle_buffer(ds) -> int:
    """The buffer size of the one shuffle in a dataset's graph."""
    nodes = {node.name: node for node in tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy()).node}
    (shuffle,) = [n for n in nodes.values() if n.op.startswith("ShuffleDataset")]
    return int(nodes[shuffle.input[1]].attr["value"].tensor.int64_val[0])  # inputs: dataset, buffer_size, ...


def _tasks_for_flags(tmp_path):
    from tftrain.recipes import mnist

    x, y = _arrays(64)
    records = _write_records(tmp_path / "d.tfrecord", 64, label_scale=1)
    return {
        "mnist-arrays": mnist.TASK,
        "tfrecord": tftrain.TFRecordTask(_model, [records], parse, num_train_examples=64, loss="mse"),
        "dataset": tftrain.DatasetTask(_model, lambda: tf.data.Dataset.from_tensor_slices((x, y)), loss="mse",
                                       shuffle=True),
    }


@pytest.mark.parametrize("name", ["mnist-arrays", "tfrecord", "dataset"])
@pytest.mark.slow
def test_pipeline_flags_reach_the_training_dataset(tmp_path, name):
    from tftrain.cli import parse_config

    task = _tasks_for_flags(tmp_path)[name]

    def train_data(argv):
        return task.bind(parse_config(argv, task.default_config(), "prog")).train_data(16)

    default = train_data([])
    assert "PrefetchDataset" in _dataset_ops(default)
    assert default.options().threading.private_threadpool_size is None
    if name == "mnist-arrays":  # the whole set: one permutation of the indices an epoch (pipeline.index_batches)
        assert "ShuffleDataset" not in " ".join(_dataset_ops(default)) and "FlatMapDataset" in _dataset_ops(default)
    else:
        assert _shuffle_buffer(default) == 10_000

    flagged = train_data(["--no-prefetch", "--shuffle-buffer", "77", "--private-threads", "3"])
    assert "PrefetchDataset" not in _dataset_ops(flagged)
    assert _shuffle_buffer(flagged) == 77
    assert flagged.options().threading.private_threadpool_size == 3
    assert len(list(flagged.take(2))) == 2  # still a working pipeline


def test_array_task_takes_a_list_of_arrays_for_a_multi_input_model(tmp_path):
    """`fit([x_a, x_b], y)` trains a two-input model in plain Keras; tf.data would stack the list into one
    tensor and fail on their different shapes."""
    import keras

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 4)).astype("float32"), rng.standard_normal((64, 3)).astype("float32")
    y = a[:, :1] + b[:, :1]

    def two_inputs():
        ia, ib = keras.Input((4,)), keras.Input((3,))
        return keras.Model([ia, ib], keras.layers.Dense(1)(keras.layers.Concatenate()([ia, ib])))

    task = tftrain.ArrayTask(two_inputs, [a, b], y, [a[:8], b[:8]], y[:8], loss="mse")
    features, _ = next(iter(task.bind(RecipeConfig()).train_data(16)))
    assert [tuple(f.shape) for f in features] == [(16, 4), (16, 3)]
    record = tftrain.Trainer(task, epochs=1, batch_size=16, verbose=0, execution="graph", precision="float32",
                             run_dir=str(tmp_path / "run")).fit()
    assert record.extras["optimizer_steps"] == 4
    assert np.isfinite(record.test["loss"])


def test_loss_weights_reach_compile():
    import numpy as np

    task = tftrain.ArrayTask(lambda: None, np.ones((4, 2)), {"a": np.ones(4), "b": np.ones(4)},
                             loss={"a": "mse", "b": "mae"}, loss_weights={"a": 1.0, "b": 0.5})
    assert task.compile_args(None)["loss_weights"] == {"a": 1.0, "b": 0.5}
    assert "loss_weights" not in tftrain.ArrayTask(lambda: None, np.ones((4, 2)), np.ones(4), loss="mse").compile_args(None)


def test_a_task_whose_data_is_not_a_tf_data_dataset_is_refused_in_one_line():
    import keras

    from tftrain.errors import ConfigError
    from tftrain.train.data_checks import check_element_spec

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return np.zeros((2, 3), "float32"), np.zeros((2, 1), "float32")

    with pytest.raises(ConfigError, match=r"^The task's training data is a Batches, not a tf\.data\.Dataset: return "
                                          r"one \(tf\.data\.Dataset\.from_generator over a keras\.utils\.PyDataset"):
        check_element_spec(Batches(), "training data")
