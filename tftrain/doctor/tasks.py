"""The work the advice is for: the task's models (default: the MNIST recipe's) and their FLOPs per example."""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from tftrain.errors import ConfigError

DEFAULT_BATCH_SIZE = 128
"""Global batch size of a task that declares none (tftrain's default for one replica)."""


def load_tasks(spec: Optional[str] = None) -> Tuple[List[tuple], Optional[str]]:
    """`([(name, build function, global batch size), ...], data_dir or None)` for `spec` (`FILE.py:NAME`,
    `MODULE:NAME`; None: the MNIST recipe), not building models so the runtime stays unstarted.

    Raises ConfigError when the spec is malformed or names no task.
    """
    if spec is None:
        from tftrain.recipes.mnist import BATCH_SIZES, MODELS

        return [(f"mnist {name}", build, BATCH_SIZES[name]) for name, build in MODELS.items()], None
    from tftrain.run import load_task

    task = load_task(spec)
    bound = task.bind(task.default_config())
    name = task.name if task.name != "task" else spec.rpartition(":")[2]
    return [(name, bound.build_model, bound.default_batch_size or DEFAULT_BATCH_SIZE)], bound.config.data.data_dir


def build_models(loaded: List[tuple]) -> List[tuple]:
    """`[(name, keras.Model, batch size), ...]` from `load_tasks`' list; ConfigError when a build raises."""
    from tftrain.errors import one_line

    out = []
    for name, build, batch in loaded:
        try:
            out.append((name, build(), batch))
        except Exception as e:  # the user's code: one line naming it
            raise ConfigError(f"Could not build the model of task {name!r}: {one_line(e)}.") from None
    return out


def _input_bytes(model) -> Optional[int]:
    """Bytes of one example's model inputs, or None when a dimension is unknown."""
    import numpy as np

    try:
        inputs = model.inputs
    except AttributeError:  # a subclassed model has none
        return None
    total = 0
    for tensor in inputs:
        dims = tuple(tensor.shape[1:])
        if any(d is None for d in dims):
            return None
        total += math.prod(dims) * np.dtype(str(tensor.dtype)).itemsize
    return total


def task_figures(name: str, model, batch_size: int) -> dict:
    """What the advice needs about one model: FLOPs (None when uncountable, with a `note`),
    trainable parameters, float32 gradient bytes and input bytes per example."""
    from tftrain.flops import count_training_flops

    trainable = int(sum(math.prod(w.shape) for w in model.trainable_weights))
    out = {"name": name, "batch_size": batch_size, "parameters": trainable, "gradient_bytes": 4 * trainable,
           "input_bytes_per_example": _input_bytes(model), "training_flops_per_example": None,
           "forward_flops_per_example": None, "note": ""}
    if not model.weights:
        out["note"] = ("The model has no weights before it sees data (a subclassed model): call it on a batch in "
                       "build_model for its figures.")
        return out
    try:
        count = count_training_flops(model)
    except ValueError as e:
        out["note"] = str(e)
        return out
    if not count.training:
        out["note"] = "No Dense, convolution or EinsumDense layer to count (tftrain.flops)."
        return out
    out.update(training_flops_per_example=count.training, forward_flops_per_example=count.forward)
    return out
