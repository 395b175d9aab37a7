"""The work the advice is for: the task's models and their training FLOPs per example.

By default the MNIST recipe's two models (`mlp` at batch 256, `cnn` at batch
128); otherwise the task named by `FILE.py:NAME` or `MODULE:NAME` (as
`python -m tftrain.run` takes it), built at its default hyperparameters.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from tftrain.errors import ConfigError

DEFAULT_BATCH_SIZE = 128
"""Global batch size of a task that declares none (tftrain's default: 128 per replica, one replica)."""


def load_tasks(spec: Optional[str] = None) -> Tuple[List[tuple], Optional[str]]:
    """Loads what to advise on, without building a model (TensorFlow's runtime stays unstarted).

    Args:
        spec: `FILE.py:NAME` or `MODULE:NAME` (a `tftrain.Task`, or a function
            or class returning one); None for the MNIST recipe's models.
            Defaults to None.

    Returns:
        `([(name, build function () -> keras.Model, global batch size), ...],
        data_dir)`: data_dir is the task's own data folder (`data.data_dir` of
        its default config), or None (MNIST's: the bundled file).

    Raises:
        ConfigError: when the spec is malformed or names no task (see
            `tftrain.run.load_task`).
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
    """`[(name, keras.Model, batch size), ...]` from `load_tasks`' list.

    Raises:
        ConfigError: when a task's `build_model` raises (one line naming the error).
    """
    from tftrain.train.user_code import one_line

    out = []
    for name, build, batch in loaded:
        try:
            out.append((name, build(), batch))
        except Exception as e:  # the user's code: one line naming it
            raise ConfigError(f"Could not build the model of task {name!r}: {one_line(e)}.") from None
    return out


def _input_bytes(model) -> Optional[int]:
    """Bytes of one example's model inputs at their dtypes, or None when a dimension is unknown."""
    import numpy as np

    total = 0
    for tensor in model.inputs:
        dims = tuple(tensor.shape[1:])
        if any(d is None for d in dims):
            return None
        total += math.prod(dims) * np.dtype(str(tensor.dtype)).itemsize
    return total


def task_figures(name: str, model, batch_size: int) -> dict:
    """What the advice needs to know about one model.

    Returns:
        `{"name", "batch_size", "training_flops_per_example" (None when it cannot
        be counted), "forward_flops_per_example", "parameters" (trainable),
        "gradient_bytes" (float32 gradients: 4 bytes per trainable parameter),
        "input_bytes_per_example" (None when unknown), "note"}`.
    """
    from tftrain.flops import count_training_flops

    trainable = int(sum(math.prod(w.shape) for w in model.trainable_weights))
    out = {"name": name, "batch_size": batch_size, "parameters": trainable, "gradient_bytes": 4 * trainable,
           "input_bytes_per_example": _input_bytes(model), "training_flops_per_example": None,
           "forward_flops_per_example": None, "note": ""}
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
