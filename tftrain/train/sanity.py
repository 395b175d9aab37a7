"""The sanity pass (as Lightning's `num_sanity_val_steps`): each requested feature tried on the real model and data
before any training, timing or run directory, refusing what cannot work in one line (`ConfigError`, exit 2). Checks
data shapes, `class_weight`, an eager training and validation step, `--monitor`, labels the outputs' dtype would
round, a `train_step`'s loss scaling, `--init-from` and each `--export`. `--sanity-check` runs only this."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from tftrain.errors import ConfigError, cause_line, words_within

EXACT_INTEGERS = {"bfloat16": 256, "float16": 2048}
"""Up to these, every integer is exact in each low-precision float (8 and 11 significant bits)."""


@dataclasses.dataclass(frozen=True)
class SanityPlan:
    """What the run asked for, as the pass checks it.

    Attributes:
        build, build_float32: return the task's model, built uncompiled, under the current policy / float32 (export's).
        batch_size: examples of the first batch the steps run on (the per-replica batch size).
        replicas: the strategy's replicas in sync. Defaults to 1.
        auto_precision: whether `--precision auto` chose the policy (a rounding output then takes float32).
        loss_scaling: whether the policy scales the loss (`mixed_float16`).
        monitor: `(metric, mode)` that `--keep-best` ranks by, or None; `monitor_by_default`: no `--monitor` named it.
        early_stopping: whether `--early-stopping` watches `val_loss` (no `--monitor`).
        init_from: `(kind, source)` from `init_weights.resolve`, or None.
        export_formats: the `--export` formats to try (the chief's; empty on other workers).
        candidate_build: builds the model under a mixed policy `--precision auto` has still to time, to check a
            subclassed model's outputs for rounding labels. Defaults to None.
        candidate_dtype: the compute dtype of `candidate_build`'s policy. Defaults to `"float32"`.
        graph: the run's steps run in a graph, so the training step is also traced (not run). Defaults to True.
        test_data: evaluated on one batch, as after training. Defaults to None.
        label_arrays: `Task.label_arrays`, checked whole against the outputs' classes. Defaults to ().
    """

    build: Callable
    build_float32: Callable
    compile_args: dict
    train_data: object
    validation_data: object = None
    test_data: object = None
    batch_size: int = 32
    replicas: int = 1
    compute_dtype: str = "float32"
    auto_precision: bool = False
    loss_scaling: bool = False
    class_weight: Optional[dict] = None
    monitor: Optional[Tuple[str, str]] = None
    monitor_by_default: bool = False
    early_stopping: bool = False
    init_from: Optional[Tuple[str, str]] = None
    export_formats: Sequence[str] = ()
    candidate_build: Optional[Callable] = None
    candidate_dtype: str = "float32"
    graph: bool = True
    label_arrays: tuple = ()


@dataclasses.dataclass(frozen=True)
class SanityResult:
    """What the pass found.

    Attributes:
        train_keys, validation_keys: the epoch logs' keys (`val_...`; () without validation data).
        checked: what was checked, in words, in order.
        step_scales_loss: whether the model's own `train_step` scales its loss (None: not checked, or no update).
        float32_needed: why the outputs must be float32 (labels that would round), else None.
        class_weight: the task's `class_weight` with every class of the model (`every_class_weighed`), or None.
    """

    train_keys: Tuple[str, ...]
    validation_keys: Tuple[str, ...]
    checked: Tuple[str, ...]
    step_scales_loss: Optional[bool]
    float32_needed: Optional[str]
    seconds: float
    class_weight: Optional[dict] = None

    def line(self) -> str:
        """One console line: what was checked, in how long."""
        return f"sanity:    {', '.join(self.checked)} checked in {self.seconds:.1f} s"


def _outputs(model, x):
    """`model(x)`, or None for a model whose own `train_step` never calls it on the features (a GAN's `call()`
    takes noise) when that call fails: the checks on its outputs do not apply."""
    from tftrain.runtime.precision import built_by_own_step

    try:
        return model(x, training=False)
    except Exception:  # noqa: BLE001
        if not built_by_own_step(model):
            raise
        return None


def every_class_weighed(class_weight, model, dataset) -> Optional[dict]:
    """`class_weight` with weight 1.0 for each class of `model`'s one output it leaves out, as Keras weighs NumPy
    labels (a dataset's label above the largest key fails mid-training in Keras); the classes: the output's last
    dimension (2 for one unit). Its own classes only when that is unknown."""
    if not class_weight:
        return class_weight
    x, _, _ = _unpacked(dataset)
    output = model(x, training=False)
    units = output.shape[-1] if hasattr(output, "shape") and len(output.shape) >= 2 else None
    return {c: class_weight.get(c, 1.0) for c in range(max(units or 0, 2, max(class_weight) + 1))}


# -- the model ---------------------------------------------------------------------
def run(plan: SanityPlan, say: Callable[[str], None] = print) -> SanityResult:
    """Runs the pass on `plan`, `say` printing warnings; raises `ConfigError` on what cannot work."""
    started = time.perf_counter()
    checked = ["data shapes"]
    train = _one_batch(plan.train_data, plan.batch_size)
    validation = _one_batch(plan.validation_data, plan.batch_size)
    try:
        model = plan.build()
    except Exception as error:  # noqa: BLE001 (the run's build stage reports it, with its traceback file)
        raise BuildFailed(error) from error
    model.compile(**plan.compile_args, run_eagerly=True)  # one step: tracing costs more than it saves
    if plan.init_from is not None:  # float32: a policy still to be timed may wrap the outputs
        from tftrain.train import init_weights

        init_weights.load(_step("float32 build for --init-from", plan.build_float32), *plan.init_from)
        checked.append("--init-from")
    if plan.graph and _user_code(model):  # first: a graph run's first step builds the loss in the graph
        _step("training step in graph mode", lambda: _traced_train_step(model, train), " (a model that runs only "
              "eagerly, with NumPy or .numpy() in its call, trains under --execution eager)")
    class_weight = every_class_weighed(plan.class_weight, model, train)
    # Model.fit itself on one batch: the data as fit passes it; the logs' keys are fit's.
    what = "training and validation step" if validation is not None else "training step"
    history = _step(what, lambda: model.fit(  # one batch, repeated: an unknown cardinality has no end to warn of
        train.repeat(), steps_per_epoch=1, epochs=1, verbose=0, class_weight=class_weight, shuffle=False,
        validation_data=validation.repeat() if validation is not None else None,
        validation_steps=1 if validation is not None else None))
    from tftrain.callbacks.scalar_logs import scalar_logs

    try:
        keys = tuple(scalar_logs({k: v[-1] for k, v in history.history.items()}))  # as the run's callbacks log them
    except ValueError as error:
        raise ConfigError(f"{error}.") from None
    train_keys = tuple(k for k in keys if not k.startswith("val_"))
    validation_keys = tuple(k for k in keys if k.startswith("val_"))
    checked.append("a training step" + (" and a validation step" if validation is not None else ""))
    checked += _after_training(plan, model, keys, validation is not None, say)
    x, y, _ = _unpacked(train)
    outputs = _outputs(model, x)
    if outputs is not None and plan.label_arrays:
        from tftrain.train.data_checks import check_label_range

        if fractional := check_label_range(plan.label_arrays, plan.compile_args.get("loss"), outputs,
                                           getattr(model, "output_names", None) or ()):
            say(fractional)
        checked.append("every label against the outputs' classes")
    float32_needed, step_scaling = _precision_checks(plan, model, x, y, outputs, say)
    del model  # before the compiled model the loss scaling check builds
    scales = None
    if step_scaling:
        from tftrain.runtime.precision import step_scales_loss

        scales = step_scales_loss(*_compiled(plan), train)
        checked.append("the train_step's loss scaling")
    if plan.export_formats:
        _try_exports(plan, x)
        checked.append("export " + ", ".join(plan.export_formats))
    return SanityResult(train_keys, validation_keys, tuple(checked), scales, float32_needed,
                        time.perf_counter() - started, class_weight)


def _precision_checks(plan: SanityPlan, model, x, y, outputs, say: Callable[[str], None]) -> tuple:
    """`(float32_needed, step_scaling)`: labels the outputs' compute dtype would round (refused unless `--precision
    auto` can fall back to float32), and whether a `train_step` of its own must be checked for scaling its loss
    under `mixed_float16`; warns of scalar outputs over several replicas and of held optimizers the loss scaling
    cannot reach."""
    import tensorflow as tf

    from tftrain.callbacks._steps import train_steps
    from tftrain.runtime.precision import overridden_steps

    if plan.replicas > 1 and any(len(getattr(o, "shape", ())) == 1 for o in tf.nest.flatten(outputs)):
        say(f"an output is one scalar per example (shape (batch,)): over {plan.replicas} replicas Keras reports "
            f"its loss, and scales its gradients, {plan.replicas} times too large for a loss that averages over the "
            "last axis (mse, ...); give the output a last axis of 1 (and the labels too)")
    float32_needed = label_rounding(y, outputs, plan.compute_dtype) if outputs is not None else None
    if plan.candidate_build is not None and not _plain(model) and outputs is not None:
        float32_needed = _candidate_rounding(plan, x, y)
    if float32_needed and not plan.auto_precision:
        raise ConfigError(f"{float32_needed}. Give the model's last layer dtype='float32' (or cast its outputs to "
                          "float32), or pass --precision float32.")
    overridden = overridden_steps(model)
    own_optimizers = "train_step" in overridden and getattr(model, "optimizer", None) is not None \
        and train_steps(model) == 0  # the step ran, the compiled optimizer did not
    if plan.loss_scaling and own_optimizers:
        say("the model's train_step does not apply the compiled optimizer (its own optimizers?): the loss scaling "
            "mixed_float16 needs does not reach them. Wrap each in keras.optimizers.LossScaleOptimizer and scale "
            "its loss (scale_loss), or pass --precision float32 or mixed_bfloat16")
    return float32_needed, bool(plan.loss_scaling and "train_step" in overridden and not own_optimizers)


def _after_training(plan: SanityPlan, model, keys: tuple, validates: bool, say: Callable[[str], None]) -> list:
    """What the run does once trained, tried on the stepped `model` and the epoch logs' `keys`: the test step,
    `model.keras` (a line if it cannot be saved whole), `--monitor` and `--early-stopping`; returns what it checked."""
    checked = []
    if plan.test_data is not None:  # its labels' structure, dtypes and shapes
        test = _one_batch(plan.test_data, plan.batch_size)
        _step("test step", lambda: model.evaluate(test.repeat(), steps=1, verbose=0))
        checked.append("a test step")
    why = unserializable(model)
    if why is not None:
        say(f"model.keras: {why[0]}; the run will save its trained weights as model.weights.h5 instead ({why[1]})")
    elif rebuilt := not_rebuilt(model):
        say(f"model.keras: {rebuilt}")
    if plan.monitor is not None:
        from tftrain.callbacks.keep_best import check_monitor

        if plan.monitor_by_default and plan.monitor[0] not in keys:
            raise ConfigError(f"--keep-best ranks by {plan.monitor[0]} when no --monitor is given, and the epoch logs "
                              f"have no {plan.monitor[0]} ({', '.join(keys) or 'none'}). Pass --monitor KEY with "
                              "one of them.")
        check_monitor(plan.monitor[0], plan.monitor[1], keys)
        from tftrain.callbacks.keep_best import monitor_direction

        named = monitor_direction(plan.monitor[0])
        if plan.monitor[1] != "auto" and named not in (None, plan.monitor[1]):
            say(f"--monitor-mode {plan.monitor[1]}: {plan.monitor[0]} is taken as improving as it "
                f"{'falls' if plan.monitor[1] == 'min' else 'rises'}, where its name says it "
                f"{'falls' if named == 'min' else 'rises'}; the worst epochs count as the best")
        checked.append(f"--monitor {plan.monitor[0]}")
    if plan.early_stopping and validates:
        if "val_loss" not in keys:
            raise ConfigError(f"--early-stopping watches val_loss, which is not among the epoch logs' keys "
                              f"({', '.join(keys) or 'none'}): the model's test_step reports no 'loss'. Return a "
                              "'loss' from test_step, or drop --early-stopping.")
        checked.append("--early-stopping")
    return checked


def _one_batch(dataset, size: int):
    """A dataset of `dataset`'s first batch cut to at most `size` examples (None for None)."""
    if dataset is None:
        return None
    import tensorflow as tf

    def first(t):
        if isinstance(t, tf.SparseTensor):
            return tf.sparse.slice(t, tf.zeros_like(t.dense_shape), tf.concat([[size], t.dense_shape[1:]], 0))
        return t[:size]

    def cut(*element):
        return tf.nest.map_structure(first, element if len(element) > 1 else element[0])

    return dataset.take(1).map(cut).cache()


def _user_code(model) -> bool:
    """Whether `model`'s step runs code Keras does not own (its class, a layer's, a name made a graph name scope):
    only then may it work eagerly and fail in a graph."""
    def own(layer) -> bool:
        return type(layer).__module__.startswith("keras.") and all(own(inner) for inner in getattr(layer, "layers", ()))

    try:
        keys = list(model.output) if isinstance(model.output, dict) else []  # a dict's keys name its losses
    except (AttributeError, ValueError):  # subclassed: no symbolic output (and traced anyway)
        keys = []
    names = [f"{name}_loss" for name in [*keys, *(getattr(model, "output_names", None) or ())]]
    return not own(model) or any(not re.fullmatch(r"[A-Za-z0-9_.\\/>-]*", name) for name in names)


def _traced_train_step(model, dataset) -> None:
    """Traces `model.train_step` on `dataset`'s element spec as a `tf.function`, without running a step."""
    import tensorflow as tf

    # Without AutoGraph, as Keras runs the step (`do_not_convert` in keras/src/backend/tensorflow/trainer.py).
    tf.function(model.train_step, autograph=False).get_concrete_function(dataset.element_spec)


def _unpacked(dataset):
    """`(x, y, sample_weight)` of `dataset`'s one batch."""
    import keras

    element = next(iter(dataset))
    return keras.utils.unpack_x_y_sample_weight(element if isinstance(element, tuple) else (element,))


def _step(what: str, fn: Callable, hint: str = ""):
    """`fn()`; an error becomes a `SanityError` naming the step, the cause (`cause_line`) and `hint` where the
    cause speaks of NumPy or of a symbolic tensor."""
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 (the model's own error, in one line)
        hint = hint if re.search(r"numpy|[Ss]ymbolic", str(error)) else ""
        raise SanityError(f"The sanity check's {what} failed on the first batch, before training: "
                          f"{cause_line(error)}{hint}", error) from error


class BuildFailed(Exception):
    """The task's model did not build (`error`); the run's build stage reports it."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class FeaturesRefused(Exception):
    """Calling an unbuilt model on a batch of the training features failed (`error`: the original, whose
    message this keeps, so that a dtype clash reads as one)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class SanityError(ConfigError):
    """A sanity step failed on the user's model or data (`error`: the original)."""

    def __init__(self, message: str, error: BaseException):
        super().__init__(message)
        self.error = error


def label_rounding(labels, outputs, compute_dtype: str) -> Optional[str]:
    """Why the labels would round when Keras casts `y_true` to the outputs' dtype (keras-team/keras#15014), else
    None: bfloat16 holds integers exactly up to 256 (float16: 2048)."""
    import numpy as np
    import tensorflow as tf

    if compute_dtype not in EXACT_INTEGERS or labels is None:
        return None
    pairs = _pairs(labels, outputs)
    for name, label, output in pairs:
        dtype = tf.as_dtype(output.dtype).name
        limit = EXACT_INTEGERS.get(dtype)
        if limit is None:
            continue
        values = np.asarray(label)
        if values.dtype.kind not in "iuf" or values.size == 0:
            continue
        integral = values.dtype.kind in "iu" or bool(np.all(np.mod(values, 1) == 0))
        largest = float(np.max(np.abs(values)))
        classes = int(output.shape[-1]) if len(output.shape) > 1 and values.dtype.kind in "iu" and \
            values.ndim < len(output.shape) else 0
        if integral and (largest > limit or classes - 1 > limit):
            shown = max(int(largest), classes - 1)
            return (f"The model's {name} is computed in {dtype}, which holds integers exactly only up to {limit}; "
                    f"its labels go up to {shown}, so Keras's cast of the labels to {dtype} would move them onto "
                    "other values and the loss and metrics would be wrong (keras-team/keras#15014)")
    return None


def _pairs(labels, outputs, prefix: str = ""):
    """`(name, label, output)` per output: by key for (nested) dicts, by position for lists, else the one."""
    import tensorflow as tf

    if isinstance(outputs, dict) and isinstance(labels, dict):
        return [pair for k in sorted(outputs) if k in labels for pair in _pairs(labels[k], outputs[k], f"{prefix}{k}/")]
    flat_labels, flat_outputs = tf.nest.flatten(labels), tf.nest.flatten(outputs)
    if len(flat_labels) != len(flat_outputs):
        return []
    if len(flat_outputs) == 1:
        return [(f"output {prefix[:-1]!r}" if prefix else "output", flat_labels[0], flat_outputs[0])]
    return [(f"output {prefix}{i}", a, b) for i, (a, b) in enumerate(zip(flat_labels, flat_outputs))]


def _plain(model) -> bool:
    """Whether `model` is functional or Sequential (the run casts its outputs to float32)."""
    import keras

    return type(model) is keras.Sequential or type(model).__name__ == "Functional"


def _candidate_rounding(plan: SanityPlan, x, y) -> Optional[str]:
    """`label_rounding` under the mixed policy still to be timed; None if the model fails there."""
    try:
        return label_rounding(y, plan.candidate_build()(x, training=False), plan.candidate_dtype)
    except Exception:  # noqa: BLE001 (see above)
        return None


def _compiled(plan: SanityPlan):
    """A fresh model and a function compiling it with another optimizer (`step_scales_loss`)."""
    model = plan.build()
    return model, lambda optimizer: model.compile(**{**plan.compile_args, "optimizer": optimizer}, run_eagerly=True)


def _try_exports(plan: SanityPlan, x) -> None:
    """Writes and serves each `--export` format from a float32 model; `ConfigError` names a failing one. What the
    converters print is dropped: the export after training prints it, and a refusal's line names the cause."""
    import tensorflow as tf

    from tftrain.train import export

    composite = [type(t).__name__ for t in tf.nest.flatten(x) if isinstance(t, (tf.SparseTensor, tf.RaggedTensor))]
    if composite:
        raise ConfigError(f"--export {','.join(plan.export_formats)}: the model takes a {composite[0]} input, which "
                          "tftrain's export check cannot feed its serving runtimes. Drop --export, or give the model "
                          "dense inputs (e.g. tf.sparse.to_dense in the input pipeline).")
    model = _step("float32 build for --export", plan.build_float32)
    features = tf.nest.map_structure(lambda t: t[:4].numpy() if hasattr(t, "numpy") else t[:4], x)
    for name in plan.export_formats:
        with tempfile.TemporaryDirectory(prefix="tftrain-sanity-export-") as tmp:
            try:
                with export.native_lines_dropped(fds=(1, 2)), contextlib.redirect_stdout(io.StringIO()), \
                        contextlib.redirect_stderr(io.StringIO()):
                    export.export_all(model, (name,), Path(tmp), features)
            except Exception as error:  # noqa: BLE001 (the converter's own error)
                raise ConfigError(f"--export {name} cannot write or serve this model (tried before training on a "
                                  f"few examples): {cause_line(error)}. Drop {name} from --export.") from error


def unserializable(model) -> Optional[Tuple[str, str]]:
    """Why Keras cannot serialize `model` (its config, build and compile configs), in one sentence, and how to make
    it serializable; None if it can. A subclassed model whose `__init__` takes arguments needs `get_config`; a loss
    or metric that is not a Keras name or class needs registering (https://keras.io/guides/serialization_and_saving/)."""
    import keras

    try:
        keras.saving.serialize_keras_object(model)
    except Exception as error:  # noqa: BLE001 (Keras raises NotImplementedError, TypeError or ValueError)
        sentence = re.split(r"(?<=[.])\s", " ".join(str(error).split()) or type(error).__name__)[0]
        try:
            keras.saving.serialize_keras_object(model.get_config())
        except Exception:  # noqa: BLE001 (the architecture's config is what fails)
            fix = "give the model get_config() to save it whole"
        else:
            fix = ("give compile() losses and metrics Keras can serialize, by name, as keras classes or decorated "
                   "with keras.saving.register_keras_serializable, to save it whole")
        return f"{type(model).__name__} cannot be serialized ({sentence[:300]})", fix
    return None


def not_rebuilt(model) -> Optional[str]:
    """Why a class of `model` or of its layers, not Keras's own, is not made again by `from_config(get_config())`
    as `keras.models.load_model` makes it (an `__init__` argument `get_config` does not return), or a `Lambda`
    layer is not (`_lambdas_not_loaded`), with the fix; else None. Layers are made unbuilt: no weights."""
    import keras

    seen, todo, lambdas = set(), [model], []
    while todo:
        obj = todo.pop()
        todo += [layer for layer in getattr(obj, "layers", None) or () if id(layer) not in seen]
        seen.add(id(obj))
        if isinstance(obj, keras.layers.Lambda):  # Keras's own class, read back as its function allows
            lambdas.append(obj)
            continue
        if type(obj).__module__.split(".")[0] == "keras":
            continue
        try:
            type(obj).from_config(obj.get_config())
        except Exception as error:  # noqa: BLE001 (a TypeError for a missing argument, or the layer's own)
            lines = str(error).split("Exception encountered:")  # Keras's wrapper names the config, then the cause
            cause = " ".join(lines[-1].split()) if len(lines) > 1 else cause_line(error)
            return (f"{type(obj).__name__} is not made again from its config ({words_within(cause, 200)}), so "
                    "keras.models.load_model will not load model.keras: build the model and model.load_weights it, "
                    f"or give {type(obj).__name__} a get_config() returning its __init__ arguments and pass **kwargs "
                    "on to super().__init__")
    return _lambdas_not_loaded(model, lambdas) if lambdas and _plain(model) else None


def _lambdas_not_loaded(model, lambdas) -> Optional[str]:
    """Why `keras.models.load_model` does not load a model holding the `Lambda` layers `lambdas` (Keras refuses a
    Python lambda unless `safe_mode=False`, and may fail to infer an output shape), with the fix; else None. The
    model's config is read back once, in this process (a function it finds here may not be found elsewhere)."""
    import keras

    unsafe = [layer for layer in lambdas if getattr(layer.function, "__name__", "") == "<lambda>"]
    try:
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model), safe_mode=not unsafe)
    except Exception as error:  # noqa: BLE001 (Keras raises many kinds on a config it cannot read back)
        return (f"its Lambda layer {lambdas[0].name!r}{' (or another)' if len(lambdas) > 1 else ''} is not made again "
                f"from the config ({words_within(cause_line(error), 200)}), so keras.models.load_model will not load "
                "model.keras: give the Lambda a function Keras can find (decorated with "
                "keras.saving.register_keras_serializable) and output_shape=, or build the model and "
                "model.load_weights it")
    if unsafe:
        return (f"its Lambda layer {unsafe[0].name!r} holds a Python lambda, which keras.models.load_model reads only "
                "with safe_mode=False: load model.keras so, or give the Lambda a named function")
    return None
