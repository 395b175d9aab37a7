"""The sanity pass: every feature a run asked for, tried on the real model and data in seconds,
before the first real step; what cannot work is refused with one line (`ConfigError`, exit 2)
before any training, timing or run directory. `--sanity-check` runs only this pass.

    data        each pipeline's `element_spec`: a feature or label of unknown rank (`tf.numpy_function`
                without `set_shape`); `class_weight` against the labels (one output only)
    model       a model of the task's, built and compiled as the run's (outside the strategy, so that
                no replica or worker takes part), one training and one validation step on a batch of
                the run's own data, run eagerly (tracing one step costs more than running it): the
                epoch logs' keys
    monitor     `--monitor` among those keys, with a known direction (`--monitor-mode`)
    precision   labels that the outputs' dtype would round (bfloat16 holds integers exactly up to 256,
                float16 up to 2048: keras-team/keras#15014); under `mixed_float16`, whether a `train_step`
                of the model's own scales its loss, judged by running it (`step_scales_loss`)
    weights     `--init-from`'s weights loaded into the model (built in float32)
    export      each `--export` format written to a temporary folder, loaded back and compared

The pass builds a model of its own and drops it: the run's build, timing and training are not
changed by it (its cost, a build and two eager steps, plus each export, is `SanityResult.seconds`).
Lightning's sanity steps (`num_sanity_val_steps`) run validation before training in the same spirit.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from tftrain.errors import ConfigError

EXACT_INTEGERS = {"bfloat16": 256, "float16": 2048}
"""The largest integer up to which every integer is exact in each low-precision float (8 and 11 significant bits)."""


@dataclasses.dataclass(frozen=True)
class SanityPlan:
    """What the run asked for, as the pass checks it.

    Attributes:
        build: returns the task's model, built (uncompiled), under the current dtype policy.
        build_float32: returns the task's model built under float32 (the one export writes).
        compile_args: the task's `Model.compile` arguments.
        train_data: the training `tf.data.Dataset` (batched).
        validation_data: the validation dataset, or None (the run validates nothing).
        batch_size: examples of the first batch the steps run on (the per-replica batch size).
        compute_dtype: the dtype policy's compute dtype (`"float32"`, `"bfloat16"`, `"float16"`).
        auto_precision: whether `--precision auto` chose the policy (a rounding output then takes float32).
        loss_scaling: whether the policy scales the loss (`mixed_float16`).
        class_weight: the task's `class_weight`, or None.
        monitor: `(metric, mode)` that `--keep-best` ranks by, or None.
        init_from: `(kind, source)` of `--init-from` (`tftrain.train.init_weights.resolve`), or None.
        export_formats: the `--export` formats to try (the chief's; empty on other workers).
        candidate_build: where `--precision auto` has still to time a mixed policy (the model above is
            then built in float32): builds the model under that policy, whose outputs are checked for
            labels they would round, for a model whose outputs are not cast to float32 (subclassed).
            Defaults to None.
        candidate_dtype: the compute dtype of `candidate_build`'s policy. Defaults to `"float32"`.
    """

    build: Callable
    build_float32: Callable
    compile_args: dict
    train_data: object
    validation_data: object = None
    batch_size: int = 32
    compute_dtype: str = "float32"
    auto_precision: bool = False
    loss_scaling: bool = False
    class_weight: Optional[dict] = None
    monitor: Optional[Tuple[str, str]] = None
    init_from: Optional[Tuple[str, str]] = None
    export_formats: Sequence[str] = ()
    candidate_build: Optional[Callable] = None
    candidate_dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class SanityResult:
    """What the pass found.

    Attributes:
        train_keys: the training epoch logs' keys (`loss`, the metrics, per output).
        validation_keys: the validation logs' keys (`val_...`); () without validation data.
        checked: what was checked, in words, in order.
        step_scales_loss: under loss scaling, whether the model's own `train_step` scales its loss
            (None: not checked, or the step updated no weight).
        float32_needed: why the outputs must be float32 (labels that would round), else None.
        seconds: the pass's wall time.
        overridden_steps: the Keras step methods the model's class replaces (`"train_step"`, ...).
    """

    train_keys: Tuple[str, ...]
    validation_keys: Tuple[str, ...]
    checked: Tuple[str, ...]
    step_scales_loss: Optional[bool]
    float32_needed: Optional[str]
    seconds: float
    overridden_steps: Tuple[str, ...] = ()

    def line(self) -> str:
        """One line for the console: what was checked and how long it took."""
        return f"sanity:    {', '.join(self.checked)} checked in {self.seconds:.1f} s"


# -- data, before any model ------------------------------------------------------
def check_element_spec(dataset, what: str) -> None:
    """Refuses a dataset whose features or labels have an unknown rank: Keras cannot build or
    run a model on them (its error, "Exception encountered when calling ...", hides the cause).

    Args:
        dataset: a batched `tf.data.Dataset`, or None (nothing to check).
        what: the data's name in the message (`"training data"`).

    Raises:
        ConfigError: naming the element and the fix (`set_shape` / `tf.ensure_shape`).
    """
    if dataset is None:
        return
    import tensorflow as tf

    spec = dataset.element_spec
    parts = spec if isinstance(spec, tuple) else (spec,)
    names = ("features", "labels", "sample weights")
    for name, part in zip(names, parts):
        for path, leaf in _leaves(part):
            shape = getattr(leaf, "shape", None)
            if isinstance(leaf, tf.TensorSpec) and shape is not None and shape.rank is None:
                where = f"{name}{path}"
                raise ConfigError(
                    f"The {what}'s {where} have an unknown shape (rank unknown), so Keras cannot build or run the "
                    "model on them; a tf.numpy_function or tf.py_function in the pipeline loses it. Give the shape "
                    "back in the pipeline: tensor.set_shape([None, ...]) or tf.ensure_shape(tensor, [None, ...]).")


def _leaves(structure, path: str = ""):
    """`(path, leaf)` pairs of a nested structure of specs (`["a"]`, `[0]`)."""
    if isinstance(structure, dict):
        for key in sorted(structure):
            yield from _leaves(structure[key], f"{path}[{key!r}]")
    elif isinstance(structure, (tuple, list)):
        for i, item in enumerate(structure):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, structure


def check_class_weight(dataset, class_weight) -> None:
    """Refuses `class_weight` for labels of several outputs (a dict or tuple): Keras weighs the
    classes of one output only.

    Raises:
        ConfigError: naming the fix (sample weights per output).
    """
    if class_weight is None or dataset is None:
        return
    spec = dataset.element_spec
    labels = spec[1] if isinstance(spec, tuple) and len(spec) > 1 else None
    if labels is not None and len(list(_leaves(labels))) > 1:
        raise ConfigError(
            "class_weight weighs the classes of one output, and this task's labels are for "
            f"{len(list(_leaves(labels)))} outputs. Drop class_weight and give sample weights per output instead "
            "(a third element of each batch: {output: weights}), or weigh the classes in that output's loss.")


# -- the model ---------------------------------------------------------------------
def run(plan: SanityPlan, say: Callable[[str], None] = print) -> SanityResult:
    """Runs the pass (module docstring) and returns what it found.

    Args:
        plan: the `SanityPlan`.
        say: prints one line (a warning the pass has). Defaults to `print`.

    Raises:
        ConfigError: on what cannot work, one line naming it and the fix.
    """
    started = time.perf_counter()
    checked = ["data shapes"]
    train = _one_batch(plan.train_data, plan.batch_size)
    validation = _one_batch(plan.validation_data, plan.batch_size)
    try:
        model = plan.build()
    except Exception as error:  # noqa: BLE001 (the run's own build stage raises it, with its traceback file)
        raise BuildFailed(error) from error
    model.compile(**plan.compile_args, run_eagerly=True)  # one step: tracing it would cost more than it runs
    if plan.init_from is not None:  # into the float32 model: a policy still to be timed may wrap the outputs
        from tftrain.train import init_weights

        init_weights.load(_step("float32 build for --init-from", plan.build_float32), *plan.init_from)
        checked.append("--init-from")
    # Model.fit itself on one batch: the data reach train_step / test_step as fit passes them, and the
    # logs' keys are fit's own (validation's with their val_ prefix).
    what = "training and validation step" if validation is not None else "training step"
    history = _step(what, lambda: model.fit(train, validation_data=validation, epochs=1, verbose=0,
                                             class_weight=plan.class_weight, shuffle=False))  # a Dataset: no warning
    keys = tuple(history.history)
    train_keys = tuple(k for k in keys if not k.startswith("val_"))
    validation_keys = tuple(k for k in keys if k.startswith("val_"))
    checked.append("a training step" + (" and a validation step" if validation is not None else ""))
    if plan.monitor is not None:
        from tftrain.callbacks.keep_best import check_monitor

        check_monitor(plan.monitor[0], plan.monitor[1], keys)
        checked.append(f"--monitor {plan.monitor[0]}")
    x, y, _ = _unpacked(train)
    float32_needed = label_rounding(y, model(x, training=False), plan.compute_dtype)
    if plan.candidate_build is not None and not _plain(model):
        float32_needed = _candidate_rounding(plan, x, y)
    if float32_needed and not plan.auto_precision:
        raise ConfigError(f"{float32_needed}. Give the model's last layer dtype='float32' (or cast its outputs to "
                          "float32), or pass --precision float32.")
    scales = None
    overridden = _overridden(model)
    del model
    if plan.loss_scaling and "train_step" in overridden:
        from tftrain.runtime.precision import step_scales_loss

        scales = step_scales_loss(*_compiled(plan), train)
        checked.append("the train_step's loss scaling")
    if plan.export_formats:
        _try_exports(plan, x)
        checked.append("export " + ", ".join(plan.export_formats))
    return SanityResult(train_keys, validation_keys, tuple(checked), scales, float32_needed,
                        time.perf_counter() - started, overridden)


def _one_batch(dataset, size: int):
    """`dataset`'s first batch, cut to at most `size` examples, as a dataset of that one batch (None for None)."""
    if dataset is None:
        return None
    import tensorflow as tf

    def cut(*element):
        return tf.nest.map_structure(lambda t: t[:size], element if len(element) > 1 else element[0])

    return dataset.take(1).map(cut).cache()


def _unpacked(dataset):
    """`(x, y, sample_weight)` of the one batch of `dataset` (`keras.utils.unpack_x_y_sample_weight`)."""
    import keras

    element = next(iter(dataset))
    return keras.utils.unpack_x_y_sample_weight(element if isinstance(element, tuple) else (element,))


def _step(what: str, fn: Callable):
    """`fn()`; an error becomes one line naming the step and Keras's own cause (`cause_line`).

    Raises:
        ConfigError: `the sanity check's <what> failed: <cause>`.
    """
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 (the model's own error, said in one line before training)
        raise SanityError(f"The sanity check's {what} failed on the first batch, before training: "
                          f"{cause_line(error)}", error) from error


class BuildFailed(Exception):
    """The task's model did not build (`error`): the run's build stage reports it as any run that fails."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class SanityError(ConfigError):
    """A step of the sanity pass that failed on the user's model or data (`error`: the original)."""

    def __init__(self, message: str, error: BaseException):
        super().__init__(message)
        self.error = error


def cause_line(error: BaseException) -> str:
    """`Type: line` of `error` at most 300 characters, where the line is its cause: under Keras's
    "Exception encountered when calling X.call()." header, the first line after it (Keras puts the
    cause there, then "Arguments received by ..."); terminal colour codes removed."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    skip = ("Exception encountered when calling", "Arguments received by", "•")
    cause = [line for line in lines if not line.startswith(skip)]
    return f"{type(error).__name__}: {(cause or lines or [''])[0]}"[:300]


def label_rounding(labels, outputs, compute_dtype: str) -> Optional[str]:
    """Why the labels would round when Keras casts them to the outputs' dtype, else None.

    Keras casts `y_true` to the output's dtype before the loss and the metrics
    (keras-team/keras#15014): an output in bfloat16 moves integer labels above 256 onto their
    neighbours (float16: above 2048), so sparse class indices past that train and score as other classes.

    Args:
        labels: one batch's labels (a tensor, or a list / dict per output).
        outputs: the model's outputs on that batch, in the same structure.
        compute_dtype: the policy's compute dtype (only `EXACT_INTEGERS`'s dtypes can round).

    Returns:
        A message naming the output, its dtype and the largest label or class index, or None.
    """
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


def _pairs(labels, outputs):
    """`(name, label, output)` for each output: by key for dicts, by position for lists, else the one."""
    import tensorflow as tf

    if isinstance(outputs, dict) and isinstance(labels, dict):
        return [(f"output {k!r}", labels[k], outputs[k]) for k in sorted(outputs) if k in labels]
    flat_labels, flat_outputs = tf.nest.flatten(labels), tf.nest.flatten(outputs)
    if len(flat_labels) != len(flat_outputs):
        return []
    if len(flat_outputs) == 1:
        return [("output", flat_labels[0], flat_outputs[0])]
    return [(f"output {i}", a, b) for i, (a, b) in enumerate(zip(flat_labels, flat_outputs))]


def _plain(model) -> bool:
    """Whether `model` is a plain functional or Sequential model (the run casts its outputs to float32)."""
    import keras

    return type(model) is keras.Sequential or type(model).__name__ == "Functional"


def _candidate_rounding(plan: SanityPlan, x, y) -> Optional[str]:
    """`label_rounding` of the model built under the mixed policy still to be timed; None when it does not
    build or run there (the timing stage finds that out and keeps float32)."""
    try:
        return label_rounding(y, plan.candidate_build()(x, training=False), plan.candidate_dtype)
    except Exception:  # noqa: BLE001 (see above)
        return None


def _overridden(model) -> tuple:
    from tftrain.runtime.precision import overridden_steps

    return overridden_steps(model)


def _compiled(plan: SanityPlan):
    """A fresh model of the task's with `plan.compile_args`, and a function that compiles it with another
    optimizer (for `step_scales_loss`)."""
    model = plan.build()
    return model, lambda optimizer: model.compile(**{**plan.compile_args, "optimizer": optimizer}, run_eagerly=True)


def _try_exports(plan: SanityPlan, x) -> None:
    """Each `--export` format written from a float32 model of the task's to a temporary folder, loaded back
    and run on a few examples (`tftrain.train.export.export_all`).

    Raises:
        ConfigError: naming the format that cannot be written or served, with the cause.
    """
    import tensorflow as tf

    from tftrain.train import export

    model = _step("float32 build for --export", plan.build_float32)
    features = tf.nest.map_structure(lambda t: t[:4].numpy() if hasattr(t, "numpy") else t[:4], x)
    for name in plan.export_formats:
        with tempfile.TemporaryDirectory(prefix="tftrain-sanity-export-") as tmp:
            try:
                export.export_all(model, (name,), Path(tmp), features)
            except Exception as error:  # noqa: BLE001 (the converter's own error, said before training)
                raise ConfigError(f"--export {name} cannot write or serve this model (tried before training on a "
                                  f"few examples): {cause_line(error)}. Drop {name} from --export.") from error
