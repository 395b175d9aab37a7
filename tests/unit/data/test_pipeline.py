import numpy as np
import pytest
import tensorflow as tf

from tftrain.config import DataConfig
from tftrain.data.pipeline import BatchSize, build_dataset, resolve_batch_size, scale_pixels
from tftrain.errors import ConfigError

X = np.arange(100 * 4 * 4, dtype=np.uint8).reshape(100, 4, 4)
Y = (np.arange(100) % 10).astype(np.uint8)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(batch_size=256, num_replicas=2), BatchSize(256, 128, 2)),
        (dict(per_replica_batch_size=64, num_replicas=4), BatchSize(256, 64, 4)),
        (dict(num_replicas=2, default_per_replica=32), BatchSize(64, 32, 2)),
        (dict(batch_size=7), BatchSize(7, 7, 1)),
    ],
)
def test_resolve_batch_size(kwargs, expected):
    assert resolve_batch_size(**kwargs) == expected


def test_indivisible_global_batch_names_the_fix():
    with pytest.raises(ConfigError) as e:
        resolve_batch_size(batch_size=100, num_replicas=3)
    assert "--batch-size 99 or 102" in str(e.value) and "--per-replica-batch-size 33" in str(e.value)


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(per_replica_batch_size=-1), dict(num_replicas=0),
                                    dict(batch_size=8, per_replica_batch_size=4)])
def test_resolve_batch_size_rejects_bad_input(kwargs):
    with pytest.raises(ConfigError):
        resolve_batch_size(**kwargs)


def batches(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_training_batches_are_scaled_shuffled_and_full():
    ds = build_dataset((X, Y), 32, training=True, seed=1, preprocess=scale_pixels)
    out = batches(ds)
    assert len(out) == 3 and all(x.shape == (32, 4, 4) for x, _ in out)
    x0, y0 = out[0]
    assert x0.dtype == np.float32 and x0.max() <= 1.0 and y0.dtype == np.int32
    firsts = [int(round(x[0, 0] * 255)) for x in x0]
    assert firsts != sorted(firsts)  # shuffled


def test_evaluation_keeps_order_and_every_example():
    out = batches(build_dataset((X, Y), 32, training=False))
    assert [len(y) for _, y in out] == [32, 32, 32, 4]
    np.testing.assert_array_equal(np.concatenate([y for _, y in out]), Y)


def test_same_seed_same_order_and_different_seed_differs():
    def order(seed):
        return np.concatenate([y for _, y in batches(build_dataset((X, np.arange(100)), 10, training=True, seed=seed))])

    assert (order(3) == order(3)).all()
    assert not (order(3) == order(4)).all()


def test_reshuffles_each_epoch():
    ds = build_dataset((X, np.arange(100)), 100, training=True, seed=0)
    first, second = [y.numpy() for _, y in ds], [y.numpy() for _, y in ds]
    assert not (first[0] == second[0]).all()


def test_options_auto_shard_deterministic_and_private_threads():
    ds = build_dataset((X, Y), 10, training=True, seed=0, config=DataConfig(private_threads=3))
    options = ds.options()
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA
    assert options.deterministic is True
    assert options.threading.private_threadpool_size == 3


def test_pipeline_options_off():
    cfg = DataConfig(cache=False, parallel_map=False, prefetch=False, shuffle_buffer=10)
    out = batches(build_dataset((X, Y), 25, training=True, seed=0, config=cfg, preprocess=scale_pixels))
    assert len(out) == 4


def test_input_context_shards_and_batches_per_replica():
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    ds = build_dataset((X, np.arange(100)), 40, training=False, input_context=ctx)
    ys = np.concatenate([y for _, y in batches(ds)])
    assert [len(y) for _, y in batches(ds)][0] == 10  # 40 global / 4 replicas
    np.testing.assert_array_equal(ys, np.arange(1, 100, 2))
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_tfrecord_files(tmp_path):
    paths = []
    for shard in range(2):
        path = str(tmp_path / f"part-{shard}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for i in range(shard * 50, shard * 50 + 50):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[X[i].tobytes()])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(Y[i])])),
                }))
                w.write(ex.SerializeToString())
        paths.append(path)

    spec = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        f = tf.io.parse_single_example(record, spec)
        return tf.reshape(tf.io.decode_raw(f["x"], tf.uint8), (4, 4)), f["y"]

    ds = build_dataset(paths, 20, training=False, parse_fn=parse, preprocess=scale_pixels)
    out = batches(ds)
    assert sum(len(y) for _, y in out) == 100
    assert sorted(np.concatenate([y for _, y in out]).tolist()) == sorted(Y.tolist())
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.FILE


def test_bad_arguments():
    with pytest.raises(ConfigError, match="batch_size"):
        build_dataset((X, Y), 0, training=True)
    with pytest.raises(ConfigError, match="differ in length"):
        build_dataset((X, Y[:5]), 4, training=True)
    with pytest.raises(ConfigError, match="parse_fn"):
        build_dataset(["a.tfrecord"], 4, training=True)


def test_index_batches_permute_every_index_once_an_epoch_and_reshuffle():
    import numpy as np

    from tftrain.data.pipeline import index_batches

    ds = index_batches(10, 3, shuffle=True, seed=7)
    assert int(ds.cardinality()) == 3 and ds.element_spec.shape.as_list() == [3]
    first, second = ([b.numpy() for b in ds] for _ in range(2))
    for epoch in (first, second):
        flat = np.concatenate(epoch)
        assert len(flat) == 9 and len(set(flat.tolist())) == 9 and set(flat.tolist()) <= set(range(10))
    assert not np.array_equal(np.concatenate(first), np.concatenate(second))  # a new permutation each epoch
    again = [b.numpy() for b in index_batches(10, 3, shuffle=True, seed=7)]
    np.testing.assert_array_equal(np.concatenate(again), np.concatenate(first))  # the seed fixes the order
    kept = [b.numpy().tolist() for b in index_batches(10, 4, shuffle=False, drop_remainder=False)]
    assert kept == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_arrays_take_index_batches_by_default_and_shuffle_single_indices_with_a_small_buffer():
    import numpy as np

    from tftrain.config import DataConfig
    from tftrain.data.pipeline import build_dataset, index_batches

    x = np.arange(40, dtype="float32")[:, None]
    y = np.arange(40, dtype="int64")
    default = np.concatenate([b[1].numpy() for b in build_dataset((x, y), 8, training=True, seed=3)])
    expected = np.concatenate([b.numpy() for b in index_batches(40, 8, shuffle=True, seed=3)])
    np.testing.assert_array_equal(default, expected)  # shuffle_buffer 0 (the whole set): one permutation an epoch
    small = build_dataset((x, y), 8, training=True, seed=3, config=DataConfig(shuffle_buffer=4))
    order = np.concatenate([b[1].numpy() for b in small])
    assert sorted(order.tolist()) == list(range(40)) and not np.array_equal(order, expected)


def test_index_batches_under_an_input_context_take_disjoint_shards_of_every_index():
    import numpy as np
    import tensorflow as tf

    from tftrain.data.pipeline import index_batches

    shards = []
    for pipeline_id in (0, 1):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=2)
        batches = [b.numpy() for b in index_batches(20, 5, shuffle=True, seed=1, input_context=context)]
        assert [len(b) for b in batches] == [5, 5]
        shards.append(set(np.concatenate(batches).tolist()))
    assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == set(range(20))
