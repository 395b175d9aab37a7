"""What the automatic settings read off a run's model, batches and callbacks before choosing."""

from __future__ import annotations

from typing import Optional


def varying_shape(element_spec) -> Optional[str]:
    """Which input or label has a non-batch dimension of varying size (e.g. `"dimension 1 of input 0
    (shape (None, None))"`), else None: XLA compiles again for every new input shape.
    Source: https://www.tensorflow.org/xla#known_issues"""
    import tensorflow as tf

    parts = element_spec if isinstance(element_spec, tuple) else (element_spec,)
    for part_name, part in zip(("input", "label", "sample weight"), parts):
        for index, spec in enumerate(tf.nest.flatten(part)):
            shape = getattr(spec, "shape", None)
            if shape is None or shape.rank is None:
                return f"{part_name} {index} (shape of unknown rank)"
            dims = shape.as_list()
            varying = [d for d in range(1, len(dims)) if dims[d] is None]
            if varying:
                return f"dimension {varying[0]} of {part_name} {index} (shape {tuple(dims)})"
    return None


CONVOLUTION_LAYERS = ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
                      "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D", "ConvLSTM1D",
                      "ConvLSTM2D", "ConvLSTM3D")
"""`keras.layers` classes whose step convolves (their subclasses count too)."""


def convolution_layers(model) -> list:
    """Sorted class names of the convolution layers (`CONVOLUTION_LAYERS`, nested too) in `model`.

    On a CPU, XLA runs convolutions without graph mode's oneDNN kernels, so they train slower
    (https://github.com/openxla/xla/issues/18586; figures in benchmarks/results).
    """
    import keras

    classes = tuple(getattr(keras.layers, name) for name in CONVOLUTION_LAYERS if hasattr(keras.layers, name))
    from tftrain import _compat

    layers = _compat.flatten_layers(model)
    return sorted({type(layer).__name__ for layer in layers if isinstance(layer, classes)})


BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
"""Keras callback methods that run once per training batch, or once per execution of several."""


def batch_hooks(callbacks) -> list:
    """`["Class.method", ...]` of the callbacks' own per-batch hooks (`BATCH_HOOKS`): defined
    outside Keras or set on the instance. Under steps per execution they fire once per execution."""
    found = []
    for callback in callbacks:
        for hook in BATCH_HOOKS:
            owner = next((k for k in type(callback).__mro__ if hook in vars(k)), None)
            given = callable(getattr(callback, "__dict__", {}).get(hook))  # set on the instance
            keras_own = owner is not None and (owner.__module__ == "keras" or owner.__module__.startswith("keras."))
            if given or (owner is not None and not keras_own):
                found.append(f"{type(callback).__name__}.{hook}")
    return found
