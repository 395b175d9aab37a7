"""`even_first_batch` and the tuner's validation data: the first batch splits evenly over the
replicas, nothing is lost, added or reordered, and an evenly split dataset stays as it is. (The
runs on 2 logical CPUs are in tests/integration/test_tune_uneven_validation.py.)"""

import numpy as np
import pytest
import tensorflow as tf

from tftrain.errors import TuningError
from tftrain.tuning.keras_tuner import evenly_first, even_first_batch


def _sizes_and_values(dataset):
    batches = [b.numpy().tolist() for b in dataset]
    return [len(b) for b in batches], sum(batches, [])


@pytest.mark.parametrize("examples, batch, replicas, sizes", [
    (25, 32, 2, [24, 1]),           # the whole set in one uneven batch
    (401, 512, 2, [400, 1]),
    (10, 4, 3, [3, 1, 4, 2]),       # a batch not divisible by the replicas: only the first is cut
    (7, 2, 2, [2, 2, 2, 1]),        # an even first batch: later, uneven batches stay
    (8, 8, 2, [8]),
    (1, 8, 2, [0, 1]),              # fewer examples than replicas: an empty first batch splits evenly
])
def test_first_batch_splits_evenly_and_every_example_stays_in_order(examples, batch, replicas, sizes):
    got_sizes, values = _sizes_and_values(even_first_batch(tf.data.Dataset.range(examples).batch(batch), replicas))
    assert got_sizes == sizes
    assert values == list(range(examples))


def test_every_leaf_of_several_inputs_outputs_and_weights_is_cut_alike():
    x = {"a": np.arange(25 * 3, dtype="float32").reshape(25, 3)}
    y = {"label": np.arange(25), "value": np.arange(25 * 2, dtype="float32").reshape(25, 2)}
    dataset = even_first_batch(tf.data.Dataset.from_tensor_slices((x, y, np.ones(25, "float32"))).batch(32), 2)
    batches = list(dataset)
    assert [[t.shape[0] for t in tf.nest.flatten(b)] for b in batches] == [[24] * 4, [1] * 4]
    assert batches[1][1]["label"].numpy().tolist() == [24]


def test_a_dataset_that_splits_evenly_is_returned_as_it_is():
    static = tf.data.Dataset.range(64).batch(32, drop_remainder=True)
    assert even_first_batch(static, 2) is static
    uneven = tf.data.Dataset.range(25).batch(32)
    assert even_first_batch(uneven, 1) is uneven
    even_first = tf.data.Dataset.range(70).batch(32)  # 32, 32, 6: the batch dimension is not static
    assert evenly_first(even_first, 32, 2) is even_first  # read once: its first batch splits evenly
    assert evenly_first(uneven, 32, 1) is uneven and evenly_first(None, 32, 2) is None
    with pytest.raises(TuningError, match="num_replicas"):
        even_first_batch(uneven, 0)


def test_validation_arrays_become_batches_with_an_even_first_batch():
    x, y = np.arange(25, dtype="float32")[:, None], np.arange(25)
    sizes = [int(xb.shape[0]) for xb, _ in evenly_first((x, y), 32, 2)]
    assert sizes == [24, 1]


def test_validation_made_even_first_keeps_a_known_cardinality_so_keras_ends_its_epoch_without_a_warning():
    import tensorflow as tf

    from tftrain.tuning.keras_tuner import evenly_first

    odd_first = tf.data.Dataset.from_tensor_slices(tf.range(83)).batch(51)  # batches of 51 and 32 over 2 replicas
    even = evenly_first(odd_first, 51, 2)
    assert int(even.cardinality()) == 3  # unknown (-2) before: Keras then warned the input "ran out of data"
    assert [int(tf.shape(b)[0]) for b in even] == [50, 1, 32]


def test_validation_arrays_of_a_list_of_inputs_become_one_dataset_of_a_tuple():
    x = [np.zeros((5, 3), "float32"), np.zeros((5, 2), "float32")]  # two inputs of other shapes
    batches = list(evenly_first((x, np.zeros((5, 1), "float32")), 8, 2))
    assert [tuple(int(d) for d in t.shape) for t in batches[0][0]] == [(4, 3), (4, 2)]  # cut evenly, not stacked
