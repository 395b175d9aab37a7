import textwrap

import pytest

from tests.conftest import run_python


@pytest.mark.slow
def test_threads_apply_before_tf_starts():
    r = run_python(textwrap.dedent("""
        import tensorflow as tf
        from tftrain.runtime import set_threads
        s = set_threads(intra_op=1, inter_op=2)
        print("RESULT", s.intra_op, s.inter_op, s.applied,
              tf.config.threading.get_intra_op_parallelism_threads(),
              tf.config.threading.get_inter_op_parallelism_threads())
    """))
    assert r.returncode == 0, r.stderr
    assert "RESULT 1 2 True 1 2" in r.stdout


@pytest.mark.slow
def test_late_thread_setting_warns_once_with_values_in_effect():
    r = run_python(textwrap.dedent("""
        import warnings
        import tensorflow as tf
        from tftrain.runtime import set_threads
        set_threads(intra_op=1)
        tf.constant(1.0) + 1.0  # TensorFlow initialises here
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = set_threads(intra_op=3, inter_op=3)
            b = set_threads(intra_op=4, inter_op=4)
        print("RESULT", a.applied, a.intra_op, b.applied, len(caught))
        print("MESSAGE", caught[0].message)
    """))
    assert r.returncode == 0, r.stderr
    assert "RESULT False 1 False 1" in r.stdout
    assert "In effect: intra-op 1, inter-op default" in r.stdout


def test_negative_threads_rejected():
    import pytest

    from tftrain.runtime import set_threads

    with pytest.raises(ValueError, match="intra_op"):
        set_threads(intra_op=-1)
