"""TableTask: CSV and Parquet tables with label, numeric and categorical columns; examples counted once;
files sharded across input pipelines when there are enough of them."""

import csv

import numpy as np
import pytest

import tftrain
from tftrain.errors import ConfigError


def _write_csv(path, rows, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["x1", "x2", "city", "y"])
        for _ in range(rows):
            x1, x2, city = rng.normal(), rng.normal(), ("a", "b")[int(rng.integers(2))]
            out.writerow([f"{x1:.4f}", f"{x2:.4f}", city, f"{2 * x1 - x2 + (1.0 if city == 'b' else 0.0):.4f}"])


def _build():
    import keras

    x1, x2, city = keras.Input((), name="x1"), keras.Input((), name="x2"), keras.Input((), name="city", dtype="string")
    numbers = keras.layers.Concatenate()([keras.layers.Reshape((1,))(x1), keras.layers.Reshape((1,))(x2)])
    one_hot = keras.layers.StringLookup(vocabulary=["a", "b"], output_mode="one_hot")(city)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([numbers, one_hot]))
    return keras.Model({"x1": x1, "x2": x2, "city": city}, out)


def _task(files, **kw):
    return tftrain.TableTask(_build, files, label="y", categorical=["city"], loss="mse", optimizer="sgd",
                             learning_rate=0.05, **kw)


@pytest.mark.slow
def test_a_csv_table_trains_with_its_examples_counted_once(tmp_path):
    _write_csv(tmp_path / "train-0.csv", 300, 0)
    _write_csv(tmp_path / "train-1.csv", 212, 1)
    _write_csv(tmp_path / "test.csv", 128, 2)
    task = _task(str(tmp_path / "train-*.csv"), test_files=str(tmp_path / "test.csv"))
    assert task.numeric == ["x1", "x2"] and task.num_train_examples == 512
    record = tftrain.Trainer(task, epochs=3, batch_size=32, verbose=0, seed=0, execution="graph",
                             run_dir=str(tmp_path / "run")).fit()
    assert record.train_examples == 512 and record.steps_per_epoch == 16
    assert record.history["loss"][-1] < record.history["loss"][0] and record.test["loss"] < 0.5


def test_parquet_and_csv_give_the_same_examples(tmp_path):
    import pyarrow
    import pyarrow.csv
    import pyarrow.parquet

    _write_csv(tmp_path / "t.csv", 64, 0)
    pyarrow.parquet.write_table(pyarrow.csv.read_csv(tmp_path / "t.csv"), tmp_path / "t.parquet")
    from_csv, from_parquet = (list(_task(str(tmp_path / name)).read([str(tmp_path / name)]).as_numpy_iterator())
                              for name in ("t.csv", "t.parquet"))
    assert len(from_csv) == len(from_parquet) == 64
    for (a, la), (b, lb) in zip(from_csv, from_parquet):
        assert a["city"] == b["city"] and la == pytest.approx(lb) and a["x1"] == pytest.approx(b["x1"])


def test_input_pipelines_read_their_own_files_when_there_are_enough(tmp_path):
    import tensorflow as tf

    _write_csv(tmp_path / "part-0.csv", 64, 0)
    _write_csv(tmp_path / "part-1.csv", 64, 1)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    task = _task(str(tmp_path / "part-*.csv")).bind(tftrain.RecipeConfig())
    second = task.train_data(16, context)  # 8 per replica, this pipeline: part-1.csv alone
    assert sum(int(tf.shape(y)[0]) for _, y in second) == 64
    _write_csv(tmp_path / "part-2.csv", 32, 2)  # shares of 96 and 64 rows: the smaller would be read more often
    uneven = _task(str(tmp_path / "part-*.csv")).bind(tftrain.RecipeConfig())
    assert uneven.describe_sharding(2).endswith("keeps its share of the examples (files of uneven sizes: 64 to 96 "
                                                "rows a pipeline)")
    assert sum(int(tf.shape(y)[0]) for _, y in uneven.train_data(16, context)) == 80  # every other of 160 rows
    one_file = _task(str(tmp_path / "part-0.csv")).bind(tftrain.RecipeConfig())
    assert sum(int(tf.shape(y)[0]) for _, y in one_file.train_data(16, context)) == 32  # every other example
    # The plan says which way this run's pipelines split the data, and why.
    assert task.describe_sharding(2) == ("sharding:  each of the 2 input pipelines reads its own files (2 files, "
                                         "one in 2 each)")
    assert task.describe_sharding(3).endswith("keeps its share of the examples (2 file(s) for 3 pipelines)")
    held_out = _task(str(tmp_path / "part-*.csv")).bind(tftrain.RecipeConfig().override({"validation_split": 0.25}))
    assert held_out.describe_sharding(2).endswith("(--validation-split holds out the last examples)")
    assert tftrain.ArrayTask(_build, np.zeros((4, 3)), np.zeros(4), loss="mse").describe_sharding(2) is None


def test_bad_tables_are_named_in_one_line(tmp_path):
    _write_csv(tmp_path / "t.csv", 8, 0)
    with pytest.raises(ConfigError, match=r"has no column 'price'; its columns: x1, x2, city, y"):
        tftrain.TableTask(_build, str(tmp_path / "t.csv"), label="price", loss="mse")
    with pytest.raises(ConfigError, match="nothing matches"):
        _task(str(tmp_path / "missing-*.csv"))
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ConfigError, match="pass .csv files or .parquet files"):
        _task(str(tmp_path / "t.*"))


def test_csv_files_whose_headers_differ_are_refused_as_they_are_read_by_position(tmp_path):
    _write_csv(tmp_path / "a.csv", 8, 0)
    rows = (tmp_path / "a.csv").read_text().splitlines()
    swapped = ["x2,x1,city,y"] + [",".join([r.split(",")[1], r.split(",")[0], *r.split(",")[2:]]) for r in rows[1:]]
    (tmp_path / "b.csv").write_text("\n".join(swapped) + "\n")
    with pytest.raises(ConfigError, match=r"b.csv's header \(x2, x1, city, y\) differs from .*a.csv's \(x1, x2, "
                                          r"city, y\); CSV columns are read by position"):
        _task(str(tmp_path / "*.csv"))
    _task(str(tmp_path / "a.csv"), test_files=str(tmp_path / "a.csv"))  # the same header: taken
