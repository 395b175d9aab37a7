"""Mixed precision: choosing, setting and restoring Keras's global dtype policy.

`mixed_float16` computes in float16 and keeps variables in float32; Keras's
`Model.compile` wraps the optimizer in a `LossScaleOptimizer` (dynamic loss scaling)
under that policy, so small float16 gradients do not underflow. `mixed_bfloat16`
needs no loss scaling (bfloat16 has float32's exponent range). Either way the
model's final outputs should be float32 for a numerically stable loss and softmax.

Sources: https://www.tensorflow.org/guide/mixed_precision and
https://keras.io/api/mixed_precision/policy/
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from typing import Callable, Optional

import keras

from tftrain import host
from tftrain.config import PRECISIONS  # noqa: F401 (the one list of names; re-exported here)
from tftrain.runtime.devices import DeviceInfo, min_compute_capability


def cpu_has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    """True when the CPU described at `cpuinfo_path` has native bfloat16 arithmetic (AVX512-BF16 or
    AMX-BF16: `tftrain.host.native_bf16`, the doctor's rule too).

    Args:
        cpuinfo_path: Linux CPU description to read. Defaults to `/proc/cpuinfo`;
            when it cannot be read (another system) the answer is False.
    """
    if not os.path.isfile(cpuinfo_path):
        return False
    flags, _ = host.cpu_flags(cpuinfo_path)
    return host.native_bf16(flags)


def resolve_precision(name: str, devices: DeviceInfo, native_bf16: Optional[bool] = None) -> str:
    """Turns a precision name (possibly `"auto"`) into a Keras dtype policy name.

    `auto` picks `mixed_float16` when every GPU has compute capability >= 7.0
    (Volta and newer have float16 Tensor Cores), `float32` on older GPUs,
    `mixed_bfloat16` on a CPU with native bfloat16, else `float32`.

    Args:
        name: one of `PRECISIONS`.
        devices: the run's `DeviceInfo`.
        native_bf16: override for the CPU check (tests). Defaults to None
            (read the CPU flags).

    Returns:
        `"float32"`, `"mixed_float16"` or `"mixed_bfloat16"`.

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
    """The dtype policy in force.

    Attributes:
        policy: Keras policy name, e.g. `"mixed_float16"`.
        compute_dtype: dtype layers compute in, e.g. `"float16"`.
        variable_dtype: dtype variables are stored in (`"float32"` for mixed).
        loss_scaling: True when `Model.compile` will wrap the optimizer in a
            `LossScaleOptimizer` (policy `mixed_float16`).
    """

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
    """Sets Keras's global dtype policy.

    Args:
        name: one of `PRECISIONS`; `"auto"` needs `devices`.
        devices: the run's `DeviceInfo`, used by `"auto"` and for the CPU
            warning. Defaults to None.

    Returns:
        The `PrecisionInfo` now in force. Models built afterwards use it.

    Raises:
        ValueError: when `name` is unknown, or is `"auto"` without `devices`.

    Warns:
        UserWarning: `mixed_float16` on a CPU-only run (CPUs have no fast float16
            arithmetic, so it is slower than float32).
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


def ensure_float32_outputs(model: keras.Model) -> keras.Model:
    """Makes a functional or Sequential model's outputs float32.

    Under a mixed policy the last layer computes in float16/bfloat16; a softmax or
    loss in that dtype loses precision. When any output is not float32 this returns a
    new functional model that appends a float32 linear `Activation` to those outputs
    (sharing all weights with `model`); otherwise it returns `model` unchanged.

    Args:
        model: a built Keras model with symbolic `outputs` (functional or Sequential
            with an `Input`).

    Returns:
        A model whose outputs are all float32.

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

    # The outputs' structure (a dict keyed as the losses are, a list, one tensor) and the inputs' (a dict fed by
    # name) are kept. A Sequential model in Keras 3.15 has `outputs` but no `output` until it is called.
    struct = getattr(model, "_outputs_struct", None)
    if not isinstance(struct, (list, tuple, dict)):
        struct = outputs[0] if len(outputs) == 1 else list(outputs)
    inputs_struct = getattr(model, "_inputs_struct", None)
    fixed = keras.Model(inputs_struct if isinstance(inputs_struct, dict) else inputs,
                        keras.tree.map_structure(cast, struct), name=model.name)
    if getattr(model, "output_names", None) and not isinstance(struct, dict):  # a loss dict keyed by output name
        fixed.output_names = list(model.output_names)
    return fixed


def overridden_steps(model) -> tuple:
    """Names of the Keras step methods `model`'s class replaces (`"train_step"`, `"test_step"`).

    Args:
        model: a Keras model.

    Returns:
        A tuple, empty for a functional, Sequential or subclassed model that keeps
        Keras's own steps.
    """
    return tuple(name for name in ("train_step", "test_step")
                 if getattr(type(model), name, None) is not getattr(keras.Model, name))


def step_scales_loss(model, compile_with: Callable, data, scales: tuple = (1.0, 16.0)) -> Optional[bool]:
    """Whether `model`'s training step applies loss scaling as `mixed_float16` needs, judged by running it.

    Keras's own `train_step` scales the loss (`optimizer.scale_loss`) before taking gradients,
    and `LossScaleOptimizer.apply` divides them by the scale. A step of the user's own that does
    not scale its loss gets its gradients divided by the scale (2**15 at first): the model silently
    does not learn (keras-team/keras#20894). The step is run on `batch` once under each loss scale
    of `scales`, from the same weights, with plain SGD inside the `LossScaleOptimizer`: a step that
    scales its loss moves the weights alike under both; one that does not moves them `16` times
    less under the larger scale.

    Args:
        model: a built Keras model (its weights change; use a model of its own).
        compile_with: compiles `model` with the optimizer it is given (and the task's loss and metrics).
        data: a `tf.data.Dataset` of one batch.
        scales: the two loss scales. Defaults to (1.0, 16.0).

    Returns:
        True when the weights moved alike (within 4x) under both scales, False when they moved
        at least 4x less under the larger, None when the step moved no weight.

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
    """The policy `precision: auto` takes instead of `mixed_float16` for a model whose own
    `train_step` does not scale its loss (`step_scales_loss`): `mixed_bfloat16` where every
    GPU computes bfloat16 natively (compute capability >= 8.0, Ampere and newer), else
    `float32`. Neither needs loss scaling.

    Args:
        devices: the run's `DeviceInfo`.

    Returns:
        `"mixed_bfloat16"` or `"float32"`.

    Source: https://www.tensorflow.org/guide/mixed_precision#supported_hardware
    """
    cap = min_compute_capability(devices) if devices.kind == "gpu" else None
    return "mixed_bfloat16" if cap is not None and cap >= (8, 0) else "float32"


def is_dtype_mismatch(error: BaseException, compute_dtype: str) -> bool:
    """Whether `error` is a mixed policy's dtype clash: one line of its message names both the compute
    dtype (`bfloat16`; `float16` or `half`) and `float32` (`float` in eager messages): TensorFlow's
    "Input 'y' of 'Mul' Op has type float32 that does not match type bfloat16 of argument 'x'", "...
    expected to be a bfloat16 tensor but is a float tensor", XLA's "f32[..], bf16[..]), but mixed precision is
    disallowed". An out-of-memory error, whose message names the dtype too, is not one.

    Args:
        error: the exception raised.
        compute_dtype: the policy's compute dtype, e.g. `"bfloat16"`.

    Returns:
        A bool.
    """
    import re

    import tensorflow as tf

    if isinstance(error, tf.errors.ResourceExhaustedError):
        return False
    # XLA's HLO names them bf16, f16 and f32: "Seen floating point types of different precisions in %ReluGrad =
    # f32[..] relu-grad(f32[..], bf16[..]), but mixed precision is disallowed" (keras-team/keras#20931).
    mixed = r"\b(bfloat16|bf16)\b" if compute_dtype == "bfloat16" else r"\b(float16|half|f16)\b"
    float32 = r"\b(float32|float|f32)\b"  # eager messages call float32 "float"
    return any(re.search(mixed, line) and re.search(float32, line) for line in str(error).splitlines())


KEEP_FLOAT32_WITHIN = 0.05
"""`choose_precision` keeps float32 (plain Keras's numerics) unless mixed_bfloat16 is more than this
fraction faster: on a busy machine a few executions' medians differ by about that much."""


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """What `choose_precision` measured and chose.

    Attributes:
        policy: `"float32"` or `"mixed_bfloat16"`.
        step_time_s: policy -> median seconds per optimizer step (graph mode).
        reason: one sentence on why.
        complete: False when the run was too short to time mixed_bfloat16. Defaults
            to True.
        time_twin_from_steps: with `complete` False, the planned training steps from
            which a run repays timing the twin (`bfloat16_repays_from`): the choice is
            remembered for shorter runs, and a run at least that long (or of unknown
            length) times the twin. Defaults to None.
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
"""The most mixed_bfloat16 is taken to speed a CPU's whole training step up over float32, for deciding
whether a run is long enough to repay timing it. AMX tiles multiply bfloat16 matrices many times
faster than float32, but a step's casts, elementwise ops, optimizer update and memory traffic bound
the gain: the largest measured on this project's hosts was 1.38x (a 784-512-256-10 MLP at batch 256 on
an AVX512-BF16/AMX Xeon), while convolutions lost (`benchmarks/results/precision.md`)."""


def bfloat16_repays_from(float32_step_s: float, probe_s: float) -> int:
    """The planned training steps from which timing mixed_bfloat16 can pay for itself:
    `BF16_MAX_SPEEDUP` over that many float32 steps saves what the float32 timing cost (`probe_s`:
    building, tracing and timing the twin costs about as much again).

    Args:
        float32_step_s: seconds per training step under float32 (> 0).
        probe_s: wall seconds the float32 timing took.

    Returns:
        Steps, >= 1.
    """
    import math

    return max(1, math.ceil(probe_s / ((1 - 1 / BF16_MAX_SPEEDUP) * float32_step_s)))


def bfloat16_repays(float32_step_s: float, probe_s: float, planned_steps: Optional[int]) -> bool:
    """Whether a run of `planned_steps` training steps (None or 0: unknown, True) is long enough to
    repay timing mixed_bfloat16 (`bfloat16_repays_from`)."""
    return not planned_steps or planned_steps >= bfloat16_repays_from(float32_step_s, probe_s)


def choose_precision(float32_model, build_bfloat16, dataset, steps: int = 16, batch_size: Optional[int] = None,
                     planned_steps: Optional[int] = None) -> PrecisionChoice:
    """Times the training step of a model under float32 and of its mixed_bfloat16 twin, on a CPU.

    Native bfloat16 (AVX512-BF16, AMX) speeds up matmuls, but casts, convolutions and
    elementwise ops gain less or lose: measured on this 2-core EPYC with AVX512-BF16, a
    depthwise-separable CNN trained at half the float32 speed under mixed_bfloat16, a
    dense MLP faster. So the choice is timed on the run's own model and batches, graph
    mode at the model's own `steps_per_execution` (`time_graph_step`: state restored).
    float32, plain Keras's policy, is timed first; the twin is built and timed only when the
    run is long enough to repay it (`bfloat16_repays`).

    Args:
        float32_model: the compiled model, built under float32.
        build_bfloat16: `() -> compiled model`, the same model built under
            mixed_bfloat16 (the caller sets the global policy).
        dataset: training batches (a few dozen; repeated as needed).
        steps: optimizer steps timed per policy. Defaults to 16.
        batch_size: examples per step (the global batch size); None reads it from
            the dataset, whose batch dimension must then be static (a
            `padded_batch` without `drop_remainder` has none). Defaults to None.
        planned_steps: training steps of the whole run. Defaults to None
            (mixed_bfloat16 always timed).

    Returns:
        A `PrecisionChoice`: mixed_bfloat16 only when more than
        `KEEP_FLOAT32_WITHIN` faster than float32; float32 when the run is too
        short to time the twin (`step_time_s` holds float32's only; `complete`
        False, `time_twin_from_steps` set), or when the
        twin does not build or its step raises (a layer or step of the user's that
        mixes bfloat16 with float32 tensors).

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
