"""Checks of a task's datasets before any model is built: each answers with one `ConfigError` line and the fix."""

from __future__ import annotations

from typing import Optional

from tftrain.errors import ConfigError


def check_element_spec(dataset, what: str) -> None:
    """Raises `ConfigError` (with the fix) if a dataset's features or labels have an unknown rank, or if
    validation or test data never end (`Model.fit` and `evaluate` would read them forever)."""
    if dataset is None:
        return
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise ConfigError(f"The task's {what} is a {type(dataset).__name__}, not a tf.data.Dataset: return one "
                          "(tf.data.Dataset.from_generator over a keras.utils.PyDataset or a generator).")
    if what != "training data" and int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(f"The task's {what} never ends (an endless .repeat()), so each evaluation would read it "
                          "forever: drop the .repeat(), or .take(N) batches.")
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


def check_dense(dataset, strategy: str) -> None:
    """Raises `ConfigError` on a sparse feature under a mirrored strategy, whose `fit` cannot split a
    `tf.SparseTensor` across replicas (TensorFlow 2.21: "'SparseTensor' object has no attribute 'device'")."""
    import tensorflow as tf

    spec = dataset.element_spec if dataset is not None else None
    features = spec[0] if isinstance(spec, tuple) else spec
    sparse = [path or "features" for path, leaf in _leaves(features) if isinstance(leaf, tf.SparseTensorSpec)]
    if sparse:
        raise ConfigError(f"--strategy {strategy}: the features{sparse[0] if sparse[0] != 'features' else ''} are a "
                          "tf.SparseTensor, which Keras's fit cannot split across replicas. Train with --strategy "
                          "default, or make them dense in the input pipeline (tf.sparse.to_dense).")


def check_class_weight(dataset, class_weight) -> None:
    """Raises `ConfigError` on `class_weight` with labels of several outputs (Keras weighs one) or with batches
    that carry sample weights (Keras takes one or the other)."""
    if class_weight is None or dataset is None:
        return
    spec = dataset.element_spec
    if isinstance(spec, tuple) and len(spec) > 2:
        raise ConfigError("class_weight and sample weights (the third element of each batch) do not go together, as "
                          "in Model.fit: fold the class weights into the sample weights, or drop class_weight.")
    labels = spec[1] if isinstance(spec, tuple) and len(spec) > 1 else None
    if labels is not None and len(list(_leaves(labels))) > 1:
        raise ConfigError(
            "class_weight weighs the classes of one output, and this task's labels are for "
            f"{len(list(_leaves(labels)))} outputs. Drop class_weight and give sample weights per output instead "
            "(a third element of each batch: {output: weights}), or weigh the classes in that output's loss.")


SPARSE_LOSSES = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")
"""Names of the loss whose labels are class indices (`keras.losses.SparseCategoricalCrossentropy`)."""


def check_label_range(labelled, loss, outputs, output_names=()) -> Optional[str]:
    """Raises `ConfigError` when labels held in memory (`Task.label_arrays`) of an output trained with sparse
    categorical crossentropy fall outside its classes, 0 to its last dimension less 1 (its `ignore_class` aside):
    Keras fails on the batch that holds one, mid-training or after it, on a CPU, and gives NaN on a GPU.

    Args:
        labelled: `(what, labels)` pairs; labels an array, or a list or dict of them per output.
        loss: the compiled loss: one for every output, or a list or dict per output.
        outputs: the model's outputs on a batch (a tensor, or a list or dict of them).
        output_names: the model's `output_names`, naming a list's outputs.

    Returns:
        A warning when such labels are not whole numbers (Keras casts them to class indices), else None.
    """
    import numpy as np

    out, losses = _per_output(outputs, output_names), _per_output(loss, output_names, every=True)
    warning = None
    for what, labels in labelled:
        by_output = _per_output(labels, output_names)
        for name, output in out.items():
            fn, y = losses.get(name, losses.get(None)), by_output.get(name)
            shape = getattr(output, "shape", ())
            if y is None or not _sparse(fn) or len(shape) < 2 or shape[-1] is None or shape[-1] < 2:
                continue
            values = np.asarray(y)
            if values.dtype.kind not in "iuf" or values.size == 0:
                continue
            ignore = getattr(fn, "ignore_class", None)
            values = values[values != ignore] if ignore is not None else values.ravel()
            low, high, units = values.min(initial=0), values.max(initial=0), int(shape[-1])
            where = f" of output {name!r}" if name is not None and len(out) > 1 else ""
            fractional = values[values != np.floor(values)] if values.dtype.kind == "f" else values[:0]
            if fractional.size and warning is None:
                warning = (f"the {what} labels{where} are not whole numbers ({fractional[0]:g}, ...), and sparse "
                           "categorical crossentropy reads them as class indices (Keras truncates them): give "
                           "integer class labels")
            if low < 0 or high >= units:
                bad = low if low < 0 else high
                fix = (f"give the output {int(high) + 1} units" if high >= units else
                       f"pass SparseCategoricalCrossentropy(ignore_class={bad:g}) to leave them out")
                raise ConfigError(
                    f"The {what} labels{where} hold class {bad:g}, and the output has {units} classes (0 to "
                    f"{units - 1}) under sparse categorical crossentropy, so Keras would fail on that batch: fix the "
                    f"labels, or {fix}.")
    return warning


def _per_output(structure, names, every: bool = False) -> dict:
    """`{output name: part}` of a structure per output (a dict by name, a list by position); a single part is
    keyed by the one output's name, or by None when `every` (it serves every output)."""
    if isinstance(structure, dict):
        return dict(structure)
    if isinstance(structure, (list, tuple)):
        return {names[i] if i < len(names) else i: part for i, part in enumerate(structure)}
    if every:
        return {None: structure}
    return {names[0] if len(names) == 1 else None: structure}


def _sparse(loss) -> bool:
    """Whether `loss` (a name, a loss object or function) is sparse categorical crossentropy."""
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
    return name in SPARSE_LOSSES
