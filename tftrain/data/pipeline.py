"""The tf.data input pipeline: global batch size, sharding, shuffling, prefetching.

Order of stages, following the tf.data performance guide
(https://www.tensorflow.org/guide/data_performance): read -> shard (when given an
`InputContext`) -> cache -> shuffle (seeded) -> batch -> vectorised map (parallel,
AUTOTUNE) -> prefetch (AUTOTUNE). Mapping whole batches instead of single examples
calls the preprocessing function once per batch, which is much cheaper for small
examples such as MNIST digits.

In-memory arrays take the same path over example *indices*: each epoch one op permutes
the indices and reshapes them into batches (`index_batches`), and the batch map gathers
the examples of a batch from the arrays in one vectorised `tf.gather`. tf.data then
handles one element per batch, not one per example, and no shuffle buffer refills at each
epoch start (a `shuffle_buffer` smaller than the data keeps `Dataset.shuffle`'s partial
shuffle over single indices).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tftrain.config import DataConfig, check_batch_divides
from tftrain.errors import ConfigError, check_int

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class BatchSize:
    """Global and per-replica batch size of a run.

    Attributes:
        global_batch_size: examples per optimizer step, all replicas together.
        per_replica_batch_size: examples each replica processes per step.
        num_replicas: replicas in sync; global = per-replica x replicas.
    """

    global_batch_size: int
    per_replica_batch_size: int
    num_replicas: int


def resolve_batch_size(
    batch_size: Optional[int] = None,
    per_replica_batch_size: Optional[int] = None,
    num_replicas: int = 1,
    default_per_replica: int = 128,
) -> BatchSize:
    """Works out global and per-replica batch size from either one.

    Args:
        batch_size: global batch size, or None. Defaults to None.
        per_replica_batch_size: per-replica batch size, or None. Defaults to None.
        num_replicas: replicas in sync (`strategy.num_replicas_in_sync`), >= 1.
            Defaults to 1.
        default_per_replica: per-replica size used when neither is given.
            Defaults to 128.

    Returns:
        A `BatchSize`.

    Raises:
        ConfigError: when both sizes are given, a size is not positive, or the
            global batch size does not divide evenly by `num_replicas`.
    """
    if batch_size is not None and per_replica_batch_size is not None:
        raise ConfigError(
            "Give either batch_size (global) or per_replica_batch_size, not both. "
            f"Received: batch_size={batch_size}, per_replica_batch_size={per_replica_batch_size}."
        )
    for name, value in (("batch_size", batch_size), ("per_replica_batch_size", per_replica_batch_size),
                        ("num_replicas", num_replicas)):
        check_int(value, name, error=ConfigError, none_ok=True)
    if batch_size is None:
        per_replica = per_replica_batch_size or default_per_replica
        return BatchSize(per_replica * num_replicas, per_replica, num_replicas)
    check_batch_divides(batch_size, num_replicas)
    return BatchSize(batch_size, batch_size // num_replicas, num_replicas)


def num_examples_of(features, labels=None) -> int:
    """The number of examples in arrays (or nested dicts / tuples of arrays).

    Args:
        features: an array, or a dict / tuple of arrays with the same first
            dimension.
        labels: the same for labels, or None. Defaults to None.

    Returns:
        The common first dimension.

    Raises:
        ConfigError: when the arrays disagree in length or there are none.
    """
    leaves = [np.shape(a)[0] for a in tf.nest.flatten((features, labels)) if a is not None]
    if not leaves:
        raise ConfigError("No arrays given: pass features (and labels) as NumPy arrays or dicts of arrays.")
    if len(set(leaves)) > 1:
        raise ConfigError(f"features and labels differ in length: {sorted(set(leaves))} examples.")
    return int(leaves[0])


def integer_labels(features, labels):
    """Passes features through unchanged (e.g. uint8 pixels) and casts labels to int32.

    The batch map for models that scale their own inputs (a `Rescaling` layer),
    such as the MNIST recipe's: the pipeline then only gathers raw batches.

    Args:
        features: tensor of any dtype and shape.
        labels: integer tensor, e.g. `(batch,)`.

    Returns:
        `(features, int32 labels)`.
    """
    return features, tf.cast(labels, tf.int32)


def scale_pixels(images, labels):
    """Maps uint8 pixels 0..255 to float32 0..1; labels pass through as int32.

    Args:
        images: uint8 tensor of any shape, e.g. `(batch, 28, 28)`.
        labels: integer tensor, e.g. `(batch,)`.

    Returns:
        `(float32 images in [0, 1], int32 labels)`.
    """
    return tf.cast(images, tf.float32) * (1.0 / 255.0), tf.cast(labels, tf.int32)


def build_dataset(
    source: Union[Tuple[np.ndarray, np.ndarray], Sequence[str]],
    batch_size: int,
    *,
    training: bool,
    config: Optional[DataConfig] = None,
    seed: Optional[int] = None,
    preprocess: Optional[Callable] = None,
    parse_fn: Optional[Callable] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    drop_remainder: Optional[bool] = None,
    max_examples: Optional[int] = None,
) -> tf.data.Dataset:
    """Builds a batched, prefetched `tf.data.Dataset` for training or evaluation.

    Args:
        source: `(features, labels)` NumPy arrays with the same first dimension
            (either may be a dict or tuple of arrays, for multi-input or
            multi-output models), or a list of TFRecord file paths (then
            `parse_fn` is required).
        batch_size: examples per batch. Without `input_context` this is the
            global batch size (Keras splits it across replicas); with one it is
            still the global size and the per-replica size is derived from it.
        training: True shuffles (when `seed` or not) and, by default, drops the
            last partial batch so every step has the same shape; False keeps order
            and every example.
        config: pipeline options (`cache`, `shuffle_buffer`, `parallel_map`,
            `prefetch`, `private_threads`; `cache` only applies to file sources,
            since arrays are in memory already). Defaults to `DataConfig()`.
        seed: shuffle seed; when given, the order is the same on every run
            (and `deterministic` ordering is enforced). Defaults to None.
        preprocess: function `(features, labels) -> (features, labels)` applied to
            whole batches, e.g. `scale_pixels`. Defaults to None (no map).
        parse_fn: for TFRecord sources, maps one serialized record to
            `(features, labels)`. Defaults to None.
        input_context: from `strategy.distribute_datasets_from_function`; shards
            the data by input pipeline and batches per replica. Defaults to None.
        drop_remainder: overrides the default (True when training). Defaults to
            None.
        max_examples: for file sources, read only the first this-many
            records (before the cache, so the cache is complete). Defaults to
            None (all).

    Returns:
        A `tf.data.Dataset` of `(features, labels)` batches with an explicit
        auto-shard policy (DATA for arrays, FILE for files), so strategies never
        warn that it cannot be sharded.

    Raises:
        ConfigError: when `batch_size` is not positive, the arrays disagree in
            length, or a file source has no `parse_fn`.

    Example:
        >>> ds = build_dataset((x_train, y_train), 256, training=True, seed=0,
        ...                    preprocess=scale_pixels)
    """
    config = config or DataConfig()
    check_int(batch_size, "batch_size", error=ConfigError)
    from_files = not (isinstance(source, tuple) and len(source) == 2 and not isinstance(source[0], str))
    drop_remainder = training if drop_remainder is None else drop_remainder
    parallel = AUTOTUNE if config.parallel_map else None
    files = list(source) if from_files else None  # once: a generator of paths is read once
    if from_files:
        ds = _file_batches(files, batch_size, parse_fn, training=training, config=config, seed=seed,
                           input_context=input_context, drop_remainder=drop_remainder, max_examples=max_examples)
        if preprocess is not None:
            ds = ds.map(preprocess, num_parallel_calls=parallel)
    else:
        ds = _array_batches(source, batch_size, preprocess, training=training, config=config, seed=seed,
                            input_context=input_context, drop_remainder=drop_remainder)
    if config.prefetch:
        ds = ds.prefetch(AUTOTUNE)
    policy = (tf.data.experimental.AutoShardPolicy.OFF if input_context is not None  # already sharded
              else tf.data.experimental.AutoShardPolicy.FILE if from_files and len(files) > 1
              else tf.data.experimental.AutoShardPolicy.DATA)
    return ds.with_options(dataset_options(policy, seed is not None or not training, config.private_threads))


def _shard_shuffle_batch(ds, batch_size, *, training, config, seed, input_context, drop_remainder, num_examples=None):
    """Shards `ds` by input pipeline (per-replica batches then), shuffles it when training (a buffer of
    `config.shuffle_buffer`, else `num_examples`, else 10,000), and batches it."""
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    if training:
        ds = ds.shuffle(config.shuffle_buffer or num_examples or 10_000, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=drop_remainder)


def _file_batches(files, batch_size, parse_fn, *, config, max_examples, **batching):
    """Batches of parsed TFRecord examples: read, cut to `max_examples`, sharded by input pipeline,
    parsed, cached, then shuffled and batched (`_shard_shuffle_batch`)."""
    if parse_fn is None:
        raise ConfigError("A file source needs parse_fn to decode each record into (features, labels).")
    parallel = AUTOTUNE if config.parallel_map else None
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=parallel)
    if max_examples is not None:
        ds = ds.take(max_examples)
    input_context = batching["input_context"]
    if input_context is not None:  # shard the records before parsing them
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batching = {**batching, "input_context": None}
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    ds = ds.map(parse_fn, num_parallel_calls=parallel)
    if config.cache:
        ds = ds.cache()
    return _shard_shuffle_batch(ds, batch_size, config=config, **batching)


def _array_batches(source, batch_size, preprocess, *, training, config, seed, input_context, drop_remainder):
    """Batches gathered from in-memory arrays by batches of example indices: a whole permutation an epoch
    (`index_batches`), or single indices through a shuffle buffer when `config.shuffle_buffer` is smaller
    than the data (see the module docstring); then `preprocess` on each whole batch."""
    num_examples = num_examples_of(*source)
    features, labels = (tf.nest.map_structure(lambda a: a if tf.is_tensor(a) else tf.constant(a), lists_as_tuples(part))
                        for part in source)
    if not config.shuffle_buffer or config.shuffle_buffer >= num_examples:  # 0: a whole permutation an epoch
        per_pipeline = input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
        ds = index_batches(num_examples, per_pipeline, shuffle=training, seed=seed,
                           drop_remainder=drop_remainder, input_context=input_context)
    else:
        ds = _shard_shuffle_batch(tf.data.Dataset.range(num_examples), batch_size, training=training, config=config,
                                  seed=seed, input_context=input_context, drop_remainder=drop_remainder,
                                  num_examples=num_examples)

    def gather(indices):
        batch = tuple(tf.nest.map_structure(lambda t: tf.gather(t, indices), part) for part in (features, labels))
        return batch if preprocess is None else preprocess(*batch)

    return ds.map(gather, num_parallel_calls=AUTOTUNE if config.parallel_map else None)


def lists_as_tuples(structure):
    """`structure` with every Python list made a tuple (dicts and tuples kept, leaves as they are).

    tf.data takes a list that a function returns for one tensor and stacks it, so a multi-input
    model's `[x_a, x_b]` of different shapes fails ("is not convertible to a tensor ... shape (2, 32,
    None)"); as a tuple each is its own component, and Keras's `fit` feeds a tuple to a model's
    inputs as it feeds the list (plain `model.fit([x_a, x_b], y)`).
    """
    if type(structure) in (list, tuple):  # not a namedtuple: its type is kept
        return tuple(lists_as_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: lists_as_tuples(v) for k, v in structure.items()}
    return structure


def index_batches(num_examples: int, batch_size: int, *, shuffle: bool, seed: Optional[int] = None,
                  drop_remainder: bool = True, input_context=None) -> tf.data.Dataset:
    """Batches of example indices, one int64 `[batch]` tensor each, from one permutation an epoch.

    `Dataset.range(n).shuffle(n).batch(b)` costs tf.data one element per example (at
    60,000 examples and batch 256 on 2 cores: 90-116 ms of CPU an epoch for that stage,
    against 53-58 ms for Keras's whole array path) and refills its n-element buffer at
    every epoch start before the first batch. Here each epoch
    draws one seed (`Dataset.random`, new each iteration), permutes the indices with
    one `tf.random.experimental.stateless_shuffle` op and reshapes them into batches:
    one element per batch. The order is a uniformly random permutation each epoch,
    as a full shuffle buffer gives; with `seed` it is the same on every run.

    Args:
        num_examples: examples in the arrays, >= 1.
        batch_size: indices per batch (per replica under `input_context`), >= 1.
        shuffle: permute the indices each epoch; False keeps their order.
        seed: the permutations' seed; None draws them at random. Defaults to None.
        drop_remainder: drop the last, smaller batch. Defaults to True.
        input_context: a `tf.distribute.InputContext`: this pipeline takes every
            `num_input_pipelines`-th index from `input_pipeline_id`, as `Dataset.shard`
            does. Defaults to None (all indices).

    Returns:
        A `tf.data.Dataset` of int64 index batches with known cardinality; the batch
        dimension is static when `drop_remainder` (or when the batches divide evenly).
    """
    start, step = (input_context.input_pipeline_id, input_context.num_input_pipelines) if input_context else (0, 1)
    count = len(range(start, num_examples, step))
    full, rest = divmod(count, batch_size)
    keep_rest = bool(rest) and not drop_remainder

    def batches(epoch_seed):
        indices = tf.range(start, num_examples, step, dtype=tf.int64)
        if shuffle:
            indices = tf.random.experimental.stateless_shuffle(indices, seed=tf.stack([epoch_seed, epoch_seed // 2]))
        ds = tf.data.Dataset.from_tensor_slices(tf.reshape(indices[: full * batch_size], [full, batch_size]))
        return ds.concatenate(tf.data.Dataset.from_tensors(indices[full * batch_size:])) if keep_rest else ds

    seeds = (tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1) if shuffle
             else tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)))
    return seeds.flat_map(batches).apply(tf.data.experimental.assert_cardinality(full + int(keep_rest)))


def dataset_options(shard_policy, deterministic: Optional[bool] = None, private_threads: int = 0) -> tf.data.Options:
    """The tf.data options every tftrain pipeline sets, in one place: the auto-shard policy, the order, and
    a private thread pool.

    Args:
        shard_policy: a `tf.data.experimental.AutoShardPolicy` (OFF where an
            InputContext already shards, FILE or DATA otherwise).
        deterministic: keep the element order (None: tf.data's default, True).
            Defaults to None.
        private_threads: threads of a private pool for this pipeline; 0 uses
            the shared pool (`--private-threads`). Defaults to 0.

    Returns:
        A `tf.data.Options` for `Dataset.with_options`.
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = shard_policy
    if deterministic is not None:
        options.deterministic = deterministic
    if private_threads:
        options.threading.private_threadpool_size = private_threads
    return options
