"""Execution modes: eager, graph (`tf.function`) and XLA (`jit_compile`).

Source: https://keras.io/api/models/model_training_apis/#compile-method
"""

from __future__ import annotations

EXECUTIONS = ("eager", "graph", "xla")


def compile_options(execution: str = "graph", steps_per_execution: int = 1) -> dict:
    """Keyword arguments for `keras.Model.compile` that select an execution mode.

    Args:
        execution: `"eager"` (`run_eagerly=True`: Python runs every step, easiest
            to debug, slowest), `"graph"` (each step traced into a `tf.function`)
            or `"xla"` (the `tf.function` compiled by XLA, `jit_compile=True`).
            Defaults to `"graph"`.
        steps_per_execution: optimizer steps per `tf.function` call, >= 1; larger
            values amortise Python overhead for small models. Keras batch hooks
            then fire once per execution. Defaults to 1.

    Returns:
        `{"run_eagerly": bool, "jit_compile": bool, "steps_per_execution": int}`.

    Raises:
        ValueError: on an unknown mode or `steps_per_execution` < 1.

    Example:
        >>> model.compile(optimizer="adam", loss="mse", **compile_options("xla", 8))
    """
    if execution not in EXECUTIONS:
        raise ValueError(
            f"Invalid execution {execution!r}. Expected one of: {', '.join(EXECUTIONS)}. "
            f"Received: execution={execution!r}."
        )
    if isinstance(steps_per_execution, bool) or not isinstance(steps_per_execution, int) or steps_per_execution < 1:
        raise ValueError(
            f"steps_per_execution must be an integer >= 1. Received: steps_per_execution={steps_per_execution!r}."
        )
    return {
        "run_eagerly": execution == "eager",
        "jit_compile": execution == "xla",
        "steps_per_execution": steps_per_execution,
    }
