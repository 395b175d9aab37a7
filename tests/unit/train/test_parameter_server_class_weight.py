"""The parameter-server loop weighs classes as plain Keras's `fit(class_weight=...)`.

The loop is run on an in-process cluster (one worker and one ps `tf.distribute.Server` on
127.0.0.1, the coordinator in the same process, as in TensorFlow's parameter-server tutorial), in
a subprocess: servers started in a process live until it exits. One worker and one full batch an
epoch make the asynchronous loop's updates the same as `fit`'s.
"""

import json
import textwrap

import numpy as np
import pytest

from tests.conftest import REPO, run_python

IN_PROCESS_CLUSTER = textwrap.dedent("""
    import json, types
    import keras, portpicker, tensorflow as tf
    from tests.conftest import class_weight_problem
    from tftrain.train.loops.parameter_server import ParameterServerLoop

    ports = {"worker": portpicker.pick_unused_port(), "ps": portpicker.pick_unused_port()}
    spec = tf.train.ClusterSpec({job: [f"127.0.0.1:{port}"] for job, port in ports.items()})
    servers = [tf.distribute.Server(spec, job_name=job, task_index=0, protocol="grpc") for job in ports]
    strategy = tf.distribute.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))

    x, y, WEIGHTS, build = class_weight_problem()

    def loop_losses(class_weight, loss):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = build()
        loop = ParameterServerLoop()
        loop.compile(model, {"optimizer": keras.optimizers.SGD(0.1), "loss": loss},
                     types.SimpleNamespace(strategy=strategy))
        runtime = types.SimpleNamespace(strategy=strategy, requested_steps_per_execution=1)
        history = loop.fit(model, lambda ctx=None: tf.data.Dataset.from_tensor_slices((x, y)).batch(256),
                           epochs=3, steps_per_epoch=1, callbacks=[], verbose=0, runtime=runtime,
                           class_weight=class_weight)
        return history.history["loss"]

    def keras_losses(class_weight, loss):
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(keras.optimizers.SGD(0.1), loss)
        return model.fit(x, y, batch_size=256, epochs=3, verbose=0, shuffle=False,
                         class_weight=class_weight).history["loss"]
""")


@pytest.mark.slow
def test_class_weight_trains_as_keras_fit_with_the_same_weights():
    code = IN_PROCESS_CLUSTER + textwrap.dedent("""
        out = {}
        for name, loss in (("function", "sparse_categorical_crossentropy"),
                           ("object", keras.losses.SparseCategoricalCrossentropy())):
            out[name] = {"loop": loop_losses(WEIGHTS, loss), "keras": keras_losses(WEIGHTS, loss)}
        out["unweighted"] = loop_losses(None, "sparse_categorical_crossentropy")
        print("RESULT", json.dumps(out))
    """)
    proc = run_python(code, timeout=240, cwd=REPO)  # `tests` importable
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    for name in ("function", "object"):  # a loss given by name and a `keras.losses.Loss` object
        assert len(out[name]["loop"]) == 3
        np.testing.assert_allclose(out[name]["loop"], out[name]["keras"], rtol=1e-5)
    assert abs(out["unweighted"][0] - out["function"]["loop"][0]) > 1e-3  # the weights count
