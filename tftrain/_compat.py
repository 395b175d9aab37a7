"""What tftrain needs from Keras and TensorFlow that has no public API, in one place.

Each entry names what it relies on and the versions it was checked on: TensorFlow 2.21 with
Keras 3.15 (`CHECKED`). `check_versions()` says in one line when the installed pair is outside them
(tests/unit/test_compat.py runs it). No other module of tftrain imports `keras.src` or
`tensorflow.python`, reads a stack frame or touches a private attribute of Keras or TensorFlow.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

CHECKED = {"tensorflow": ("2.21",), "keras": ("3.15",)}
"""The minor versions each private use below was checked on."""


def set_initial_epoch(model, epoch: int) -> None:
    """Tells a running `Model.fit` (from `on_train_begin`) to start at `epoch`, as Keras's `BackupAndRestore`
    does: `fit` reads `model._initial_epoch` after `on_train_begin` (keras/src/backend/tensorflow/trainer.py,
    Keras 3.15). No public API moves the first epoch of a `fit` already called."""
    model._initial_epoch = epoch


def clear_initial_epoch(model) -> None:
    """Undoes `set_initial_epoch` (from `on_train_end`): Keras never clears it, so a later `fit` of the model would
    start at that epoch too."""
    model._initial_epoch = None


def initial_epoch(model, default: int) -> int:
    """The epoch a restoring callback set with `set_initial_epoch` (or Keras's `BackupAndRestore`), else `default`."""
    return getattr(model, "_initial_epoch", None) or default


def micro_batches_seen(optimizer) -> int:
    """Batches an optimizer with Keras's own `gradient_accumulation_steps` has seen (`optimizer._iterations`,
    Keras 3.15: its public `iterations` is that count floor-divided by the accumulation steps)."""
    return int(optimizer._iterations.numpy())


def register_tensor_conversion(cls, to_tensor) -> None:
    """Lets TensorFlow take `cls` instances as tensors, process-wide (`tf.register_tensor_conversion_function`,
    TensorFlow 2.21), so that Keras's step function reads a `StepCount` as `steps_per_execution`, changeable
    between calls without retracing. `to_tensor(value, dtype)` returns the tensor."""
    import tensorflow as tf

    tf.register_tensor_conversion_function(
        cls, lambda value, dtype=None, name=None, as_ref=False: to_tensor(value, dtype))


def flatten_layers(model) -> list:
    """Every layer inside `model`, nested ones too (Keras's `Model._flatten_layers`, Keras 3.15); `model.layers`
    where it is missing."""
    if hasattr(model, "_flatten_layers"):
        return list(model._flatten_layers(include_self=False))
    return list(model.layers)


def output_structure(model):
    """The nested structure (dict, list or tensor) of a functional model's outputs as it was built (Keras 3.15's
    `Functional._outputs_struct`; the public `outputs` is flat), or None."""
    return getattr(model, "_outputs_struct", None)


def input_structure(model):
    """The nested structure of a functional model's inputs as it was built (Keras 3.15's
    `Functional._inputs_struct`; the public `inputs` is flat), or None."""
    return getattr(model, "_inputs_struct", None)


def compile_config(model) -> dict:
    """The arguments `model.compile` was given, which `model.save` serialises (Keras 3.15's
    `Trainer._compile_config.config`, a live dict); {} before `compile`."""
    return getattr(getattr(model, "_compile_config", None), "config", {})


def make_function(model, step):
    """Keras's compiled function of `step` for `model` (`Trainer._make_function`, Keras 3.15), so that the
    trial runs the very `tf.function` `fit` would (steps_per_execution, jit_compile, strategy)."""
    return model._make_function(step)


def make_function_available(model) -> bool:
    """Whether `make_function` serves `model` (Keras's TensorFlow trainer has `_make_function`)."""
    return getattr(model, "_make_function", None) is not None


def fit_locals(frame_names=("iterator", "epoch_iterator")) -> list:
    """From a callback's hook, the values of `frame_names` in the nearest calling frame of a function named
    `fit` that has the last of them (Keras 3.15's `TensorFlowTrainer.fit` locals holding its tf.data
    iterator); empty when there is none. Python has no public way to keep a function's local alive."""
    import sys

    frame = sys._getframe(1)
    try:
        while frame is not None and not (frame.f_code.co_name == "fit" and frame_names[-1] in frame.f_locals):
            frame = frame.f_back
        if frame is None:
            return []
        found = frame.f_locals
        return [found[name] for name in frame_names if name in found]
    finally:
        del frame


def runtime_started() -> bool:
    """Whether TensorFlow's eager context has initialised (TensorFlow 2.21's `context.context()._initialized`):
    tf.config's setters raise only when asked to change a value, and listing logical devices would start it."""
    from tensorflow.python.eager import context  # TensorFlow 2.21

    return bool(getattr(context.context(), "_initialized", False))


@contextlib.contextmanager
def silenced_deprecations():
    """TensorFlow's deprecation warnings off for the block (`tensorflow.python.util.deprecation.silence`,
    TensorFlow 2.21): `PreemptionCheckpointHandler` calls its own deprecated counter."""
    from tensorflow.python.util import deprecation  # TensorFlow 2.21

    with deprecation.silence():
        yield


def stop_preemption_handler(handler) -> None:
    """Stops a `tf.distribute.experimental.PreemptionCheckpointHandler`'s watcher threads (what its `__del__`
    does, TensorFlow 2.21; its threads hold it alive, so dropping it would not)."""
    for stop in ("_stop_poll_termination_signal_thread", "_stop_cluster_wise_termination_watcher_thread"):
        try:
            getattr(handler, stop)()
        except Exception:  # noqa: BLE001 (a TensorFlow without that method, or a peer already gone)
            pass


def class_weight_map_fn(class_weight: dict):
    """Keras's own map function weighing a dataset's examples by class (Keras 3.15's
    `tf_dataset_adapter.make_class_weight_map_fn`), as `fit(class_weight=...)` applies it."""
    from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn  # Keras 3.15

    return make_class_weight_map_fn(class_weight)


_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def atomic_assign_add():
    """While open, Keras variables (TensorFlow backend) add and subtract with one atomic TensorFlow op.

    Keras's `Variable.assign_add` (`keras.src.backend.tensorflow.core.Variable`, Keras 3.15) reads then
    writes, so two workers adding to one ps variable lose an addition; inside this context it calls the
    wrapped `tf.Variable`'s own. Functions traced inside keep the atomic ops; Keras's are restored on exit.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow.core import Variable  # Keras 3.15

    def add(self, value):
        return self._value.assign_add(tf.cast(value, self._value.dtype)) if _is_tf(self) else keras_add(self, value)

    def sub(self, value):
        return self._value.assign_sub(tf.cast(value, self._value.dtype)) if _is_tf(self) else keras_sub(self, value)

    with _PATCH_LOCK:
        keras_add, keras_sub = Variable.assign_add, Variable.assign_sub
        Variable.assign_add, Variable.assign_sub = add, sub
        try:
            yield
        finally:
            Variable.assign_add, Variable.assign_sub = keras_add, keras_sub


def _is_tf(variable) -> bool:
    """Whether a Keras variable wraps a `tf.Variable` (whose `assign_add` is atomic), outside a stateless scope."""
    import tensorflow as tf
    from keras.src.backend.common.stateless_scope import in_stateless_scope  # Keras 3.15

    return isinstance(getattr(variable, "_value", None), tf.Variable) and not in_stateless_scope()


def check_versions(versions: Optional[dict] = None) -> Optional[str]:
    """One line naming an installed version outside `CHECKED`, or None. `versions`
    (`{"tensorflow": "2.21.0", "keras": "3.15.1"}`) defaults to the installed ones."""
    if versions is None:
        import keras
        import tensorflow as tf

        versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    for name, version in versions.items():
        minor = ".".join(str(version).split(".")[:2])
        if minor not in CHECKED.get(name, (minor,)):
            return (f"{name} {version} is not a version tftrain was checked on ({', '.join(CHECKED[name])}); "
                    f"its use of {name}'s internals (tftrain/_compat.py) may not hold: install {name}=="
                    f"{CHECKED[name][-1]}.*")
    return None
