"""Training FLOPs per example, counted from a Keras model's layer shapes.

The count is what a roofline needs: the multiply-adds of the layers that do matrix
work (`Dense`, `Conv1D/2D/3D`, `DepthwiseConv2D`, `SeparableConv2D`'s two parts and
`EinsumDense`), two FLOPs each. For training, each such layer costs

* forward: `2 * MACs`;
* backward, gradient of the weights: `2 * MACs` (the same product, transposed);
* backward, gradient of the inputs: `2 * MACs`, except for layers whose input does
  not depend on any trainable weight (the first layer of a plain model), since
  nothing upstream needs that gradient.

So a deep stack costs about 3x its forward pass (the rule used by Kaplan et al.,
"Scaling Laws for Neural Language Models", 2020, section 2.1: `C ~ 6N` per token,
`2N` forward and `4N` backward). Elementwise work (bias adds, activations, dropout,
pooling, normalisation, the optimizer update) is not counted: it is memory-bound,
not matmul-bound. For the MNIST models the activations, dropout and pooling are under
1% of the multiply-adds; the optimizer update is per step, not per example: Adam's
roughly 10 FLOPs per parameter and step, spread over the batch, add about 7% to the
MLP's count at batch 32 (670,000 parameters) and under 1% from batch 256 up.

This module reads layer configurations and shapes only; it runs no TensorFlow ops.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

__all__ = ["FlopCount", "LayerFlops", "count_training_flops", "layer_macs"]


@dataclasses.dataclass(frozen=True)
class LayerFlops:
    """FLOPs of one layer, per example.

    Attributes:
        name: the layer's name.
        kind: the layer's class name, e.g. `"Dense"`.
        macs: multiply-accumulates of the forward pass.
        forward: forward FLOPs (`2 * macs`).
        backward: backward FLOPs (weight gradient, plus the input gradient when
            `input_gradient`).
        input_gradient: whether the gradient of the layer's input is counted.
    """

    name: str
    kind: str
    macs: int
    forward: int
    backward: int
    input_gradient: bool


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """Training FLOPs per example of a model.

    Attributes:
        layers: a `LayerFlops` per counted layer, in model order.
    """

    layers: tuple

    @property
    def forward(self) -> int:
        """Forward-pass FLOPs per example."""
        return sum(layer.forward for layer in self.layers)

    @property
    def backward(self) -> int:
        """Backward-pass FLOPs per example."""
        return sum(layer.backward for layer in self.layers)

    @property
    def training(self) -> int:
        """Forward plus backward FLOPs per example (one training step's work per example)."""
        return self.forward + self.backward

    def to_dict(self) -> dict:
        """Plain-data form: totals and the per-layer rows."""
        return {
            "forward": self.forward,
            "backward": self.backward,
            "training": self.training,
            "layers": [dataclasses.asdict(layer) for layer in self.layers],
        }


def _shape_tail(shape) -> tuple:
    """A layer's shape without the batch dimension, as ints (None is an error)."""
    tail = tuple(shape[1:])
    if any(d is None for d in tail):
        raise ValueError(
            f"Cannot count FLOPs for a shape with unknown dimensions: {tuple(shape)}. "
            "Build the model with a fixed input shape, e.g. keras.Input((28, 28))."
        )
    return tuple(int(d) for d in tail)


def _prod(values) -> int:
    return int(math.prod(values)) if values else 1


def layer_macs(layer) -> Optional[int]:
    """Forward multiply-accumulates per example of one built Keras layer.

    Args:
        layer: a built `keras.layers.Layer` with known input and output shapes.

    Returns:
        The MAC count, or None for layers without matrix work (activations,
        pooling, dropout, reshapes, ...). Nested models and wrappers are not
        descended into; pass their inner layers instead.

    Raises:
        ValueError: when the layer's shapes have unknown (None) dimensions.

    Example:
        >>> layer_macs(model.get_layer("dense_0"))  # Dense(512) on 784 inputs
        401408
    """
    kind = type(layer).__name__
    if kind == "Dense":
        in_tail = _shape_tail(layer.input.shape)
        return _prod(in_tail[:-1]) * in_tail[-1] * int(layer.units)
    if kind == "EinsumDense":
        # Every output element is a dot product over the kernel's contracted axes.
        _, rest = layer.equation.split(",")
        kernel_spec, output_spec = rest.split("->")
        contracted = [int(d) for d, c in zip(layer.kernel.shape, kernel_spec) if c not in output_spec]
        return _prod(_shape_tail(layer.output.shape)) * _prod(contracted)
    if kind in _CONV_LIKE:
        # Kernel (*window, in_channels / groups, out_channels) or the depthwise
        # (*window, in_channels, multiplier): each output position does one
        # multiply-add per kernel element.
        kernels = [layer.depthwise_kernel, layer.pointwise_kernel] if kind.startswith("Separable") else [layer.kernel]
        size = sum(_prod(tuple(int(d) for d in k.shape)) for k in kernels)
        if kind.endswith("Transpose"):  # each input position scatters the whole kernel
            spatial, _ = _split_channels(layer, _shape_tail(layer.input.shape))
        else:
            spatial, _ = _split_channels(layer, _shape_tail(layer.output.shape))
        return _prod(spatial) * size
    return None


_CONV_LIKE = (
    "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
    "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D",
)


def _split_channels(layer, tail) -> tuple:
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        return tail[1:], tail[0]
    return tail[:-1], tail[-1]


def _flatten_layers(model) -> list:
    """The model's layers in order, descending into nested models."""
    out = []
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:
            out.extend(_flatten_layers(layer))
        else:
            out.append(layer)
    return out


def count_training_flops(model, layers: Optional[Sequence] = None) -> FlopCount:
    """Counts a model's training FLOPs per example from its layer shapes.

    The first layer with matrix work gets no input-gradient term (its input is the
    data); every later one does. That is exact for a chain of layers (Sequential
    models and single-path functional models such as the MNIST recipe's) and an
    upper bound for branching models.

    Args:
        model: a built Keras model with a fixed input shape (functional or
            Sequential).
        layers: the layers to count, in order. Defaults to None (all the model's
            layers, nested models included).

    Returns:
        A `FlopCount`; `.training` is the forward plus backward FLOPs per example.

    Raises:
        ValueError: when a counted layer has unknown dimensions.

    Example:
        >>> from tftrain.recipes.mnist import mlp
        >>> count_training_flops(mlp()).training  # 784-512-512-10
        3209216
    """
    rows = []
    first = True
    for layer in layers if layers is not None else _flatten_layers(model):
        macs = layer_macs(layer)
        if macs is None:
            continue
        input_gradient = not first
        first = False
        forward = 2 * macs
        backward = forward + (forward if input_gradient else 0)
        rows.append(LayerFlops(layer.name, type(layer).__name__, macs, forward, backward, input_gradient))
    return FlopCount(tuple(rows))
