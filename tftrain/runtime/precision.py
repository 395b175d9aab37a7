"""Mixed precision: choosing, setting and restoring Keras's global dtype policy.

Under `mixed_float16` Keras's `compile` wraps the optimizer in a `LossScaleOptimizer`;
`mixed_bfloat16` needs no loss scaling. Either way the outputs should be float32.

Sources: https://www.tensorflow.org/guide/mixed_precision and
https://keras.io/api/mixed_precision/policy/
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
import weakref
from typing import Callable, Optional

import keras

from tftrain import host
from tftrain.config import PRECISIONS
from tftrain.runtime.devices import DeviceInfo, min_compute_capability


def cpu_has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    """True when the CPU has native bfloat16 arithmetic (AVX512-BF16 or AMX-BF16).

    `cpuinfo_path` defaults to `/proc/cpuinfo`; where it does not exist the answer is False.
    """
    if not os.path.isfile(cpuinfo_path):
        return False
    flags, _ = host.cpu_flags(cpuinfo_path)
    return host.native_bf16(flags)


def resolve_precision(name: str, devices: DeviceInfo, native_bf16: Optional[bool] = None) -> str:
    """Turns a precision name (possibly `"auto"`) into a Keras dtype policy name.

    `auto` picks `mixed_float16` when every GPU has compute capability >= 7.0 (float16
    Tensor Cores), `mixed_bfloat16` on a CPU with native bfloat16, else `float32`.
    `native_bf16` overrides the CPU check. Defaults to None: read the CPU flags.

    Raises:
        ValueError: when `name` is not one of `PRECISIONS`.

    Source: https://www.tensorflow.org/guide/mixed_precision#supported_hardware
    """
    if name not in PRECISIONS:
        raise ValueError(
            f"Invalid precision {name!r}. Expected one of: {', '.join(PRECISIONS)}. "
            f"Received: precision={name!r}."
        )
    if name != "auto":
        return name
    if devices.kind == "gpu":
        cap = min_compute_capability(devices)
        return "mixed_float16" if cap is not None and cap >= (7, 0) else "float32"
    if native_bf16 is None:
        native_bf16 = cpu_has_native_bf16()
    return "mixed_bfloat16" if native_bf16 else "float32"


@dataclasses.dataclass(frozen=True)
class PrecisionInfo:
    """The dtype policy in force; `loss_scaling` is True under `mixed_float16`."""

    policy: str
    compute_dtype: str
    variable_dtype: str
    loss_scaling: bool

    def describe(self) -> str:
        """One line, e.g. `mixed_float16 (compute float16, variables float32, loss scaling on)`."""
        scaling = "on" if self.loss_scaling else "off"
        return (
            f"{self.policy} (compute {self.compute_dtype}, variables {self.variable_dtype}, "
            f"loss scaling {scaling})"
        )


def set_precision(name: str, devices: Optional[DeviceInfo] = None) -> PrecisionInfo:
    """Sets Keras's global dtype policy and returns the `PrecisionInfo` now in force.

    `name` is one of `PRECISIONS`; `"auto"` needs `devices` (defaults to None).

    Raises:
        ValueError: when `name` is unknown, or is `"auto"` without `devices`.

    Warns:
        UserWarning: `mixed_float16` on a CPU-only run (slower than float32).
    """
    if name == "auto" and devices is None:
        raise ValueError("precision='auto' needs the run's DeviceInfo (devices=...).")
    policy_name = resolve_precision(name, devices or DeviceInfo("cpu", ()))
    if policy_name == "mixed_float16" and devices is not None and devices.kind == "cpu":
        warnings.warn(
            "mixed_float16 on a CPU-only run will be slow: CPUs have no fast float16 "
            "arithmetic. Use float32 (or mixed_bfloat16 on CPUs with AVX512-BF16/AMX).",
            UserWarning,
            stacklevel=2,
        )
    keras.mixed_precision.set_global_policy(policy_name)
    return current_precision()


def current_precision() -> PrecisionInfo:
    """Returns the `PrecisionInfo` of Keras's current global dtype policy."""
    policy = keras.mixed_precision.global_policy()
    return PrecisionInfo(
        policy=policy.name,
        compute_dtype=policy.compute_dtype,
        variable_dtype=policy.variable_dtype,
        loss_scaling=policy.name == "mixed_float16",
    )


@contextlib.contextmanager
def precision_policy(name: str, devices: Optional[DeviceInfo] = None):
    """Context manager: sets a dtype policy and restores the previous one on exit.

    Example:
        >>> with precision_policy("mixed_bfloat16"):
        ...     model = build_model()
    """
    previous = keras.mixed_precision.global_policy()
    try:
        yield set_precision(name, devices)
    finally:
        keras.mixed_precision.set_global_policy(previous)


_WRAPPED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # float32-output model -> the model it wraps


def user_model(model: keras.Model) -> keras.Model:
    """The model `ensure_float32_outputs` wrapped to make `model` (its own layers, outputs and output
    names: what `model.keras` holds), else `model`."""
    return _WRAPPED.get(model, model)


def ensure_float32_outputs(model: keras.Model) -> keras.Model:
    """Makes a functional or Sequential model's outputs float32.

    When any output is not float32, returns a new functional model (sharing `model`'s
    weights) that appends a float32 linear `Activation` to those outputs (`user_model`
    gives `model` back); otherwise returns `model`.

    Raises:
        ValueError: when the model has no symbolic outputs (an unbuilt subclassed
            model); give its last layer `dtype="float32"` instead.

    Source: https://www.tensorflow.org/guide/mixed_precision#building_the_model
    """
    try:
        outputs = model.outputs
        inputs = model.inputs
    except (AttributeError, ValueError):
        outputs = None
    if not outputs:
        raise ValueError(
            f"Cannot check the output dtype of model {model.name!r}: it has no symbolic "
            "outputs (a subclassed model). Give its last layer dtype='float32'."
        )
    if all(str(o.dtype) == "float32" for o in outputs):
        return model
    made = iter(range(len(outputs)))

    def cast(o):
        i = next(made)
        return o if str(o.dtype) == "float32" else \
            keras.layers.Activation("linear", dtype="float32", name=f"float32_output_{i}")(o)

    # Keep the outputs' and inputs' structures (dicts keyed as losses and feeds are).
    # A Sequential model in Keras 3.15 has `outputs` but no `output` until it is called.
    from tftrain import _compat

    struct = _compat.output_structure(model)
    if not isinstance(struct, (list, tuple, dict)):
        struct = outputs[0] if len(outputs) == 1 else list(outputs)
    inputs_struct = _compat.input_structure(model)
    fixed = keras.Model(inputs_struct if isinstance(inputs_struct, dict) else inputs,
                        keras.tree.map_structure(cast, struct), name=model.name)
    if getattr(model, "output_names", None):  # the metrics' names: a list's, and a nested structure's leaves
        fixed.output_names = list(model.output_names)
    _WRAPPED[fixed] = model
    return fixed


def overridden_steps(model) -> tuple:
    """Names of the Keras step methods `model`'s class replaces (`"train_step"`, `"test_step"`)."""
    return tuple(name for name in ("train_step", "test_step")
                 if getattr(type(model), name, None) is not getattr(keras.Model, name))


def built_by_own_step(model) -> bool:
    """Whether `model` replaces `train_step` and every layer it holds is built: `Model.fit` then never calls
    the model on the training features (a GAN's `call()` takes noise; a VAE may have none), so a call that
    fails on them is no error."""
    return "train_step" in overridden_steps(model) and all(layer.built for layer in model.layers)


def step_scales_loss(model, compile_with: Callable, data, scales: tuple = (1.0, 16.0)) -> Optional[bool]:
    """Whether `model`'s training step scales its loss as `mixed_float16` needs, judged by running it.

    `LossScaleOptimizer` divides gradients by the scale, so a custom step that does not
    scale its loss silently stops learning (keras-team/keras#20894). The step runs on
    `data` (one batch) once under each of `scales` (defaults to (1.0, 16.0)) from the same
    weights (they change); `compile_with(optimizer)` compiles `model`.

    Returns:
        True when the weights moved alike (within 4x), False when they moved at least
        4x less under the larger scale, None when no weight moved.

    Source: https://keras.io/guides/custom_train_step_in_tensorflow/ and
    https://keras.io/api/mixed_precision/loss_scale_optimizer/
    """
    import numpy as np

    start = [v.numpy() for v in model.trainable_variables]
    moved = []
    for scale in scales:
        for variable, value in zip(model.trainable_variables, start):
            variable.assign(value)
        compile_with(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=scale))
        model.fit(data, epochs=1, verbose=0, shuffle=False)
        moved.append(sum(float(np.sum(np.abs(v.numpy().astype("float64") - s)))
                         for v, s in zip(model.trainable_variables, start)))
    if not moved[0] or not np.isfinite(moved[0]):
        return None
    return bool(moved[1] * 4 >= moved[0])


def unscaled_step_precision(devices: DeviceInfo) -> str:
    """`auto`'s policy for a model whose `train_step` does not scale its loss.

    `mixed_bfloat16` where every GPU has compute capability >= 8.0, else `float32`;
    neither needs loss scaling.

    Source: https://www.tensorflow.org/guide/mixed_precision#supported_hardware
    """
    cap = min_compute_capability(devices) if devices.kind == "gpu" else None
    return "mixed_bfloat16" if cap is not None and cap >= (8, 0) else "float32"


def is_dtype_mismatch(error: BaseException, compute_dtype: str) -> bool:
    """Whether `error` is a mixed policy's dtype clash (not an out-of-memory error).

    True when one line of its message names both `compute_dtype` and float32, e.g.
    "Input 'y' of 'Mul' Op has type float32 that does not match type bfloat16".
    """
    import re

    import tensorflow as tf

    if isinstance(error, tf.errors.ResourceExhaustedError):
        return False
    # XLA's HLO says bf16, f16, f32: "... relu-grad(f32[..], bf16[..]), but mixed precision is disallowed".
    mixed = r"\b(bfloat16|bf16)\b" if compute_dtype == "bfloat16" else r"\b(float16|half|f16)\b"
    float32 = r"\b(float32|float|f32)\b"  # eager messages call float32 "float"
    return any(re.search(mixed, line) and re.search(float32, line) for line in str(error).splitlines())


KEEP_FLOAT32_WITHIN = 0.05
"""`choose_precision` keeps float32 unless mixed_bfloat16 is more than this fraction faster (timing noise)."""


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """What `choose_precision` measured (`step_time_s`: policy -> median seconds per step) and chose.

    `complete` is False when the run was too short to time mixed_bfloat16; then
    `time_twin_from_steps` says from how many planned steps it would be timed.
    """

    policy: str
    step_time_s: dict
    reason: str
    complete: bool = True
    time_twin_from_steps: Optional[int] = None

    def describe(self) -> str:
        """E.g. `float32 (float32 2.10 ms/step; mixed_bfloat16 4.31 ms/step): 2.05x faster`."""
        figures = "; ".join(f"{p} {t * 1e3:.2f} ms/step" for p, t in self.step_time_s.items())
        return f"{self.policy} ({figures}): {self.reason}" if figures else f"{self.policy}: {self.reason}"

    def to_dict(self) -> dict:
        """Plain-data form (for the memory and metrics.json)."""
        return dataclasses.asdict(self)


BF16_MAX_SPEEDUP = 3.0
"""The most mixed_bfloat16 is assumed to speed up a CPU training step over float32, for deciding
whether a run repays timing it: casts, elementwise ops and memory traffic bound the matmul gain
(figures in `benchmarks/results/precision.md`)."""


def bfloat16_repays_from(float32_step_s: float, probe_s: float) -> int:
    """Planned training steps (>= 1) from which timing mixed_bfloat16 can pay for itself.

    That many float32 steps of `float32_step_s` seconds, sped up by `BF16_MAX_SPEEDUP`,
    save the `probe_s` seconds the float32 timing took (timing the twin costs about as much).
    """
    import math

    return max(1, math.ceil(probe_s / ((1 - 1 / BF16_MAX_SPEEDUP) * float32_step_s)))


def bfloat16_repays(float32_step_s: float, probe_s: float, planned_steps: Optional[int]) -> bool:
    """Whether a run of `planned_steps` (None or 0: unknown, True) repays timing mixed_bfloat16."""
    return not planned_steps or planned_steps >= bfloat16_repays_from(float32_step_s, probe_s)


def choose_precision(float32_model, build_bfloat16, dataset, steps: int = 16, batch_size: Optional[int] = None,
                     planned_steps: Optional[int] = None) -> PrecisionChoice:
    """Times a model's training step under float32 and its mixed_bfloat16 twin's, on a CPU.

    Native bfloat16 speeds up matmuls, but convolutions and elementwise ops can lose, so
    the choice is timed on the run's own model and batches in graph mode. float32 is
    timed first; the twin only when the run is long enough to repay it.

    Args:
        build_bfloat16: `() -> compiled model` under mixed_bfloat16 (the caller sets the policy).
        steps: optimizer steps timed per policy. Defaults to 16.
        batch_size: the global batch size. Defaults to None: the dataset's static one.
        planned_steps: training steps of the whole run. Defaults to None (always time the twin).

    Returns:
        A `PrecisionChoice`: mixed_bfloat16 only when more than `KEEP_FLOAT32_WITHIN`
        faster; float32 when the run is too short (`complete` False) or the twin fails.

    Raises:
        Exception: what the float32 model's step raised (the model's own error).
    """
    import time

    from tftrain.runtime.execution import failure_line
    from tftrain.runtime.execution_probe import time_graph_step

    started = time.perf_counter()
    times = {"float32": time_graph_step(float32_model, dataset, steps, batch_size)}
    probe_s = time.perf_counter() - started
    if not bfloat16_repays(times["float32"], probe_s, planned_steps):
        repays_from = bfloat16_repays_from(times["float32"], probe_s)
        return PrecisionChoice("float32", times, (
            f"mixed_bfloat16 not timed: this run of {planned_steps} steps is too short to repay timing it (about "
            f"{probe_s:.1f} s); a run of {repays_from} steps or more times it"), complete=False,
            time_twin_from_steps=repays_from)
    try:
        times["mixed_bfloat16"] = time_graph_step(build_bfloat16(), dataset, steps, batch_size)
    except Exception as error:  # noqa: BLE001 (a step that mixes dtypes: float32, as plain Keras, trains it)
        return PrecisionChoice("float32", times, f"mixed_bfloat16 fails ({failure_line(error, 'bfloat16')})")
    ratio = times["float32"] / times["mixed_bfloat16"]
    if ratio > 1 + KEEP_FLOAT32_WITHIN:
        return PrecisionChoice("mixed_bfloat16", times, f"{ratio:.2f}x faster than float32")
    reason = (f"{1 / ratio:.2f}x faster than mixed_bfloat16" if ratio < 1 else
              f"kept: mixed_bfloat16 only {ratio - 1:.0%} faster, within the {KEEP_FLOAT32_WITHIN:.0%} timing noise")
    return PrecisionChoice("float32", times, reason)
