"""What the automatic settings read off a run's model, batches and callbacks before choosing: a batch
dimension whose size varies (XLA recompiles), convolution layers (XLA on a CPU runs them without oneDNN),
and the user's own per-batch callback hooks (steps per execution makes them fire once per execution).
"""

from __future__ import annotations

from typing import Optional


def varying_shape(element_spec) -> Optional[str]:
    """Which input or label of a batch has a dimension past the batch one whose size varies (None in
    its `element_spec`: sequences padded per batch), e.g. `"dimension 1 of input 0 (shape (None, None))"`;
    None when every such dimension is fixed. XLA compiles a program for each input shape it meets, so
    over such batches it compiles again and again (an Embedding + GRU over `padded_batch` sequences of
    5-59 tokens: 39 ms/step under XLA against 20 under graph, and 3.9 s to compile the first shape).

    Source: https://www.tensorflow.org/xla#known_issues ("XLA ... recompile for every new input shape").
    """
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
    """`["ClassName", ...]`, sorted, of the convolution layers (`CONVOLUTION_LAYERS`, nested layers included)
    in `model`; `[]` when it has none.

    On a CPU, XLA in this TensorFlow runs convolutions without the oneDNN kernels graph mode uses
    (oneDNN convolutions only in XLA:CPU's classic runtime: https://github.com/openxla/xla/issues/18586):
    in `benchmarks/results/zoo-oracle-run.json` the zoo's three convolutional models trained 5-10x (cnn,
    separable) and up to 2.5x (resnet) slower under XLA than under graph, at every steps per execution,
    and one conv + max-pool training step took 85 ms under XLA against 6 under graph.
    """
    import keras

    classes = tuple(getattr(keras.layers, name) for name in CONVOLUTION_LAYERS if hasattr(keras.layers, name))
    from tftrain import _compat

    layers = _compat.flatten_layers(model)
    return sorted({type(layer).__name__ for layer in layers if isinstance(layer, classes)})


BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
"""Keras callback methods that run once per training batch, or once per execution of several."""


def batch_hooks(callbacks) -> list:
    """`["Class.method", ...]` for the callbacks' own per-batch hooks (`BATCH_HOOKS`): a method defined
    outside Keras (a user's class, or a user's subclass of a Keras callback that overrides it), or one
    given to an instance (`keras.callbacks.LambdaCallback(on_train_batch_end=...)`). Keras's own
    callbacks count their batches themselves and are not listed."""
    found = []
    for callback in callbacks:
        for hook in BATCH_HOOKS:
            owner = next((k for k in type(callback).__mro__ if hook in vars(k)), None)
            given = callable(getattr(callback, "__dict__", {}).get(hook))  # set on the instance
            keras_own = owner is not None and (owner.__module__ == "keras" or owner.__module__.startswith("keras."))
            if given or (owner is not None and not keras_own):
                found.append(f"{type(callback).__name__}.{hook}")
    return found
