"""`tftrain.errors.check_int`: the one integer check every argument goes through."""

import pytest

from tftrain.errors import ConfigError, check_int


def test_the_one_integer_check_says_the_bound_and_the_value():
    assert check_int(3, "steps") == 3 and check_int(None, "steps", none_ok=True) is None
    for bad in (0, True, 2.0, "3"):
        with pytest.raises(ValueError, match=f"steps must be an integer >= 1. Received: steps={bad!r}."):
            check_int(bad, "steps")
    with pytest.raises(ConfigError, match=r"port must be an integer in 1\.\.65535 or None\. Received: port=70000\."):
        check_int(70000, "port", maximum=65535, error=ConfigError, none_ok=True)


def test_a_tensorflow_op_error_is_told_by_its_cause_not_the_graph_trace_or_the_iterator_chain():
    import tensorflow as tf

    from tftrain.errors import cause_line, one_line

    @tf.function
    def loss(labels):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, tf.zeros((2, 3)))

    with pytest.raises(tf.errors.InvalidArgumentError) as graph:
        loss(tf.constant([0, 3]))
    assert one_line(graph.value).startswith("InvalidArgumentError: Received a label value of 3 which is outside the "
                                            "valid range of [0, 3)"), str(graph.value)
    pipeline = tf.data.Dataset.from_tensor_slices([b"\xff\xd8\xff\xe0garbage"]).map(tf.io.decode_image)
    with pytest.raises(tf.errors.InvalidArgumentError) as data:
        list(pipeline)
    assert "{{" not in cause_line(data.value) and "Iterator::" not in cause_line(data.value)
    assert cause_line(data.value).startswith("InvalidArgumentError: the input pipeline's function (in "
                                             "ParallelMapDatasetV2) failed: ") or \
        cause_line(data.value).startswith("InvalidArgumentError: the input pipeline's function (in MapDataset) "
                                          "failed: "), cause_line(data.value)


def test_the_first_root_error_of_several_replicas_is_the_cause():
    from tftrain.errors import one_line

    class InvalidArgumentError(Exception):
        pass

    error = InvalidArgumentError(
        'Graph execution error:\n\nDetected at node Loss defined at (most recent call last):\n  File "x.py", line 7, '
        "in f\n\n2 root error(s) found.\n  (0) INVALID_ARGUMENT:  Received a label value of 3 which is outside the "
        "valid range of [0, 3).  Label values: 0 3\n\t [[{{node Loss}}]]\n  (1) CANCELLED:  Function was cancelled "
        "before it was started\n0 successful operations.\n0 derived errors ignored. [Op:__inference_step_22]")
    assert one_line(error) == ("InvalidArgumentError: Received a label value of 3 which is outside the valid range of "
                               "[0, 3).  Label values: 0 3")
