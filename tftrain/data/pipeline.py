"""The tf.data input pipeline, staged as https://www.tensorflow.org/guide/data_performance: read -> shard -> cache ->
shuffle -> batch -> vectorised map -> prefetch. Arrays are batched as example indices (`index_batches`) and gathered
per batch: one tf.data element per batch, not per example."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from tftrain.config import DataConfig, check_batch_divides
from tftrain.errors import ConfigError, check_int

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class BatchSize:
    """Global (all replicas) and per-replica batch size; global = per-replica x `num_replicas`."""

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
        batch_size: global batch size, or `per_replica_batch_size`. Defaults to None.
        num_replicas: `strategy.num_replicas_in_sync`. Defaults to 1.
        default_per_replica: used when neither size is given. Defaults to 128.

    Raises:
        ConfigError: both sizes given, a size not positive, or a global size not divisible by `num_replicas`.
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


def num_examples_of(*arrays) -> int:
    """The common first dimension of `arrays` (features, labels, sample weights; each may be a nested dict / tuple of
    arrays, or None); `ConfigError` if none or unequal."""
    leaves = [a for a in tf.nest.flatten(arrays) if a is not None]
    if any(np.ndim(a) == 0 for a in leaves):
        raise ConfigError("Arrays of features, labels and sample weights need one entry per example; one is a "
                          "scalar. Pass NumPy arrays (or dicts or lists of them).")
    leaves = [np.shape(a)[0] for a in leaves]
    if not leaves:
        raise ConfigError("No arrays given: pass features (and labels) as NumPy arrays or dicts of arrays.")
    if len(set(leaves)) > 1:
        raise ConfigError(f"features, labels and sample weights differ in length: {sorted(set(leaves))} examples.")
    return int(leaves[0])


def integer_labels(features, labels):
    """Passes features through and casts labels to int32 (for models that scale inputs, e.g. with `Rescaling`)."""
    return features, tf.cast(labels, tf.int32)


def scale_pixels(images, labels):
    """Maps uint8 pixels 0..255 to float32 0..1; labels become int32."""
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
        source: `(features, labels)` or `(features, labels, sample_weights)` arrays (each may be a dict or tuple), or
            TFRecord paths (with `parse_fn`).
        batch_size: the global batch size, also with `input_context`.
        training: shuffle and, by default, drop the last partial batch.
        config: pipeline options (`cache` applies to files only). Defaults to `DataConfig()`.
        seed: shuffle seed; the same order on every run. Defaults to None.
        preprocess: `(features, labels) -> (features, labels)` on whole batches, e.g. `scale_pixels`. Defaults to None.
        parse_fn: for TFRecords, one serialized record -> `(features, labels)`. Defaults to None.
        input_context: shards by input pipeline and batches per replica. Defaults to None.
        drop_remainder: drop the last partial batch. Defaults to None (True when training).
        max_examples: for files, read only the first N records (before the cache). Defaults to None (all).

    Returns:
        `(features, labels[, sample_weights])` batches, auto-shard policy set (DATA for arrays, FILE for files): no
        strategy warning.

    Raises:
        ConfigError: `batch_size` not positive, arrays of unequal length, or files without `parse_fn`.

    Example:
        >>> ds = build_dataset((x_train, y_train), 256, training=True, seed=0, preprocess=scale_pixels)
    """
    config = config or DataConfig()
    check_int(batch_size, "batch_size", error=ConfigError)
    from_files = not (isinstance(source, tuple) and len(source) in (1, 2, 3)
                      and not isinstance(source[0], (str, os.PathLike)))
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
    """Shards, shuffles when training (buffer `config.shuffle_buffer`, else `num_examples`, else 10,000), batches."""
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    if training:
        ds = ds.shuffle(config.shuffle_buffer or num_examples or 10_000, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=drop_remainder)


def _file_batches(files, batch_size, parse_fn, *, config, max_examples, **batching):
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
    """Array batches gathered by index batches (single indices if `config.shuffle_buffer` < the data), preprocessed."""
    num_examples = num_examples_of(*source)
    parts = tuple(tf.nest.map_structure(lambda a: a if tf.is_tensor(a) else tf.constant(a), lists_as_tuples(part))
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
        batch = tuple(tf.nest.map_structure(lambda t: tf.gather(t, indices), part) for part in parts)
        return batch if preprocess is None else (*preprocess(*batch[:2]), *batch[2:])

    return ds.map(gather, num_parallel_calls=AUTOTUNE if config.parallel_map else None)


def lists_as_tuples(structure):
    """`structure` with every list made a tuple: tf.data stacks a list into one tensor, which fails for a
    multi-input model's differently shaped inputs; Keras's `fit` feeds the tuple as the list."""
    if type(structure) in (list, tuple):  # not a namedtuple: its type is kept
        return tuple(lists_as_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: lists_as_tuples(v) for k, v in structure.items()}
    return structure


def index_batches(num_examples: int, batch_size: int, *, shuffle: bool, seed: Optional[int] = None,
                  drop_remainder: bool = True, input_context=None) -> tf.data.Dataset:
    """Batches of example indices (int64 `[batch]`, per replica under `input_context`), from one `stateless_shuffle`
    permutation an epoch if `shuffle` (seeded by `seed`, default None: random), with no shuffle buffer to refill.
    `input_context` takes every `num_input_pipelines`-th index, as `Dataset.shard`. The result has known cardinality
    and, with `drop_remainder` (default True) or even batches, a static batch dimension."""
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
    """Every tftrain pipeline's tf.data options: `shard_policy` (OFF where an InputContext shards), `deterministic`
    (default None: tf.data's True), `private_threads` (pool size; default 0: the shared pool)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = shard_policy
    if deterministic is not None:
        options.deterministic = deterministic
    if private_threads:
        options.threading.private_threadpool_size = private_threads
    return options
