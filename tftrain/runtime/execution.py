"""Execution modes: eager, graph (`tf.function`), XLA (`jit_compile`), and `auto`.

`compile_options` turns a mode name into `Model.compile` arguments. Which mode is faster depends
on the model and the machine, so `auto` is timed, not guessed; this module holds what the timings
share. `execution_trial` times candidates on the run's own steps, `execution_probe` on probe steps.

Source: https://keras.io/api/models/model_training_apis/#compile-method, https://www.tensorflow.org/xla
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional, Sequence

from tftrain import config as config_lib
from tftrain.errors import check_int

EXECUTIONS = tuple(m for m in config_lib.EXECUTIONS if m != "auto")
"""Modes `compile_options` accepts: `tftrain.config.EXECUTIONS` but `"auto"`."""

AUTO_CANDIDATES = ("graph", "xla")
"""Modes `choose_execution` times by default."""


def compile_options(execution: str = "graph", steps_per_execution: int = 1) -> dict:
    """Keyword arguments for `keras.Model.compile` that select an execution mode.

    Args:
        execution: `"eager"` (`run_eagerly=True`), `"graph"` (`tf.function`) or `"xla"`
            (`jit_compile=True`); not `"auto"`. Defaults to `"graph"`.
        steps_per_execution: optimizer steps per `tf.function` call, >= 1; Keras batch
            hooks fire once per execution. Defaults to 1.

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
    check_int(steps_per_execution, "steps_per_execution")
    return {
        "run_eagerly": execution == "eager",
        "jit_compile": execution == "xla",
        "steps_per_execution": steps_per_execution,
    }


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Measured optimizer-step time of a compiled model.

    Attributes:
        step_time_s: median seconds per optimizer step over the timed executions (the
            `ExecutionTrial` gives the mean instead).
        mean_step_time_s: total seconds / steps timed; unlike the median, includes stalls.
        batch_size: examples per optimizer step (the global batch).
        timed_steps: optimizer steps timed (after warm-up).
        warmup_s: seconds of the warm-up executions (tracing and, for XLA, compiling).
        execution_times_s: seconds of each timed execution, in order.
    """

    step_time_s: float
    examples_per_sec: float
    mean_step_time_s: float
    batch_size: int
    steps_per_execution: int
    timed_steps: int
    warmup_s: float
    execution_times_s: tuple = ()

    def to_dict(self) -> dict:
        """Plain-data form (for JSON)."""
        return dataclasses.asdict(self)


def static_batch_size(data) -> Optional[int]:
    """The static batch dimension of `data`'s first component; None when unknown (batched without
    `drop_remainder=True`) or `data` has no `element_spec` (NumPy arrays, a generator)."""
    import tensorflow as tf

    spec = getattr(data, "element_spec", None)
    if spec is None:
        return None
    first = tf.nest.flatten(spec)[0]
    shape = getattr(first, "shape", None)
    if shape is None or shape.rank is None or shape.rank < 1 or shape[0] is None:
        return None
    return int(shape[0])


def _batch_size_of(dataset) -> int:
    """`static_batch_size`, or a ValueError that says how to make it known."""
    size = static_batch_size(dataset)
    if size is None:
        raise ValueError(
            "The dataset's batch dimension is unknown; batch it with drop_remainder=True "
            "(build_dataset(..., training=True) does), or pass batch_size=."
        )
    return size


@dataclasses.dataclass(frozen=True)
class ExecutionChoice:
    """What `choose_execution` measured and chose.

    Attributes:
        execution: the chosen mode (`"graph"` or `"xla"`).
        timings: label (`label_of`) -> `StepTiming` for every candidate timed.
        reason: one sentence on why (the speed-up, or why a candidate was skipped).
        remembered: for a choice from `execution_memory`, when it was timed (ISO 8601
            local time). Defaults to None (timed in this run).
        steps_per_execution: the chosen steps per `tf.function` call. Defaults to None
            (the model's own).
        skipped: one line per candidate that failed to compile or run. Defaults to ().
        trial: for a choice timed on the run's own steps (`execution_trial`): `{"steps",
            "seconds", "cost_s": an upper bound of what choosing cost beyond a run at the
            chosen setting, "complete": every duel ended, "modes_decided": graph against
            XLA ended or XLA was left untimed (the choice is then remembered)}`. Defaults to None.
        time_again_from_steps: planned steps from which a run repays timing the candidate
            this one left untimed (XLA); shorter runs reuse the choice. Defaults to None.
        compiled_before_fit_s: for a remembered XLA choice, seconds `check_compiles` took
            to compile the train function (which `fit` reuses) before `fit`. Defaults to None.
    """

    execution: str
    timings: Mapping[str, StepTiming]
    reason: str
    remembered: Optional[str] = None
    steps_per_execution: Optional[int] = None
    skipped: tuple = ()
    trial: Optional[Mapping] = None
    time_again_from_steps: Optional[int] = None
    compiled_before_fit_s: Optional[float] = None

    def describe(self) -> str:
        """One line: the choice, each candidate's ms/step and examples/sec (unless the reason quotes its duels'
        figures), and the reason."""
        figures = "" if "side by side (" in self.reason else "; ".join(  # the duels' own figures, not two sets
            f"{label} {t.step_time_s * 1e3:.2f} ms/step, {t.examples_per_sec:,.0f} examples/sec"
            for label, t in self.timings.items()
        )
        counts_timed = any("steps/execution" in label for label in self.timings)
        chosen = f"{self.execution}, {self.steps_per_execution} steps/execution" if counts_timed else self.execution
        if self.remembered:  # the figures are the earlier run's, not this one's
            said = f"that run timed {figures}: {self.reason}" if figures else self.reason
            return (f"{chosen} [remembered: timed by a run at {self.remembered}; --no-remember-execution times it "
                    f"again]; {said}")
        line = f"{chosen} ({figures}): {self.reason}" if figures else f"{chosen}: {self.reason}"
        if self.trial:
            steps = self.trial["steps"]
            line += (f" [timed on the run's first {steps} training step{'s' if steps != 1 else ''}, which trained "
                     "the model; "
                     f"choosing cost {self.trial['cost_s']:.1f} s]")
        return line

    def to_dict(self) -> dict:
        """Plain-data form (for metrics.json)."""
        return {
            "execution": self.execution,
            "steps_per_execution": self.steps_per_execution,
            "reason": self.reason,
            "timings": {label: t.to_dict() for label, t in self.timings.items()},
            "skipped": list(self.skipped),
            "remembered": self.remembered,
            "trial": dict(self.trial) if self.trial else None,
            "time_again_from_steps": self.time_again_from_steps,
            "compiled_before_fit_s": self.compiled_before_fit_s,
        }


_XLA_MARKERS = ("XLA", "tf2xla", "jit_compile", "_JIT")


def xla_failure_reason(error: BaseException) -> Optional[str]:
    """XLA's own first line of why it could not compile or run a step; None when `error` is not
    XLA's (a bug in the model)."""
    text = str(error)
    if not any(marker in text for marker in _XLA_MARKERS):
        return None
    lines = [re.sub(r"\{\{[^}]*\}\}", "", line).strip() for line in text.splitlines()]
    unsupported = next((line for line in lines if "Detected unsupported operations" in line), None)
    if unsupported is not None:
        match = re.search(r"on (\S+): (.*)", unsupported)
        return f"unsupported operations on {match.group(1)}: {match.group(2)}" if match else unsupported
    first = next((line for line in lines if any(m in line for m in _XLA_MARKERS)
                  and not line.startswith("File ")), lines[0])
    return first[:300]


KEEP_FIRST_WITHIN = 0.05
"""Fraction faster another candidate must be to replace the first (graph at the model's own
count): on a busy machine, medians of a few executions of one setting differ by more."""


def best_label(timings: Mapping[str, StepTiming], counts: Mapping[str, int]) -> Optional[str]:
    """The fastest label in `timings` (in the order timed), with two tolerances against noise.

    The first is kept unless another is more than `KEEP_FIRST_WITHIN` faster; among the rest a
    count (`counts[label]`) within 2% of a smaller one loses to it, as fewer steps per call keep
    batch hooks frequent. None when nothing was timed.
    """
    if not timings:
        return None
    fastest = min(t.step_time_s for t in timings.values())
    first = next(iter(timings))
    if timings[first].step_time_s <= fastest * (1 + KEEP_FIRST_WITHIN):
        return first
    near = [label for label, t in timings.items() if t.step_time_s <= fastest * 1.02]
    return min(near, key=lambda label: (counts[label], timings[label].step_time_s))


def choice_reason(timings: Mapping[str, StepTiming], best: str, skipped: Sequence[str]) -> str:
    """One sentence on why `best` won (its speed-up, or kept within the noise), then the skipped."""
    skipped_text = f"; skipped {'; '.join(skipped)}" if skipped else ""
    others = [label for label in timings if label != best]
    if not others:
        return f"only {best} was timed{skipped_text}"
    runner_up = min(others, key=lambda label: timings[label].step_time_s)
    ratio = timings[runner_up].step_time_s / timings[best].step_time_s
    than = runner_up if len(others) == 1 else f"the next best, {runner_up}"
    return (f"{ratio:.2f}x faster than {than}{skipped_text}" if ratio >= 1 else
            f"kept: {runner_up} only {1 / ratio - 1:.0%} faster, within the "
            f"{KEEP_FIRST_WITHIN:.0%} timing noise{skipped_text}")


def label_of(mode: str, spe: int, base_spe: int) -> str:
    """A candidate's name: the mode at the model's own count, `"<mode>, N steps/execution"` otherwise."""
    return mode if spe == base_spe else f"{mode}, {spe} steps/execution"


def failure_line(error: BaseException, about: str = "") -> str:
    """Why a candidate failed, in one line: XLA's reason, else `Type: line` with the error's first
    line naming `about` (e.g. a dtype, below Keras's header), else its first line."""
    import re

    reason = xla_failure_reason(error)
    if reason:
        return reason
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if about and about in line]
    return f"{type(error).__name__}: {(named or lines or [''])[0]}"[:300]

