"""Training FLOPs per example, counted from a Keras model's layer shapes (no TensorFlow op runs).

Counted: `Dense`, `EinsumDense` and convolution multiply-adds, 2 FLOPs each, once forward, once for the weight
gradient and once for the input gradient (not the first such layer's): about 3x forward (Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", section 2.1: `C ~ 6N`). Memory-bound elementwise work (activations,
pooling, normalisation, the optimizer update) is not counted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

__all__ = ["FlopCount", "LayerFlops", "count_training_flops", "layer_macs"]


@dataclasses.dataclass(frozen=True)
class LayerFlops:
    """One layer's FLOPs per example: `macs`, `forward` (2 * macs), `backward` (weight + input gradient, if any)."""

    name: str
    kind: str
    macs: int
    forward: int
    backward: int
    input_gradient: bool


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """Training FLOPs per example of a model: a `LayerFlops` per counted layer, in model order."""

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
        """Forward plus backward FLOPs per example."""
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
    """Forward multiply-accumulates per example of a built Keras layer; None without matrix work (or a wrapper).

    Raises:
        ValueError: when the layer's shapes have unknown (None) dimensions.
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
        # Each output position does one multiply-add per kernel element.
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
    out = []
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:
            out.extend(_flatten_layers(layer))
        else:
            out.append(layer)
    return out


def count_training_flops(model, layers: Optional[Sequence] = None) -> FlopCount:
    """Counts a model's training FLOPs per example (`FlopCount.training`) from its layer shapes.

    The first layer with matrix work gets no input-gradient term: exact for a chain, an upper bound if branching.
    `layers` (what to count, in order) defaults to all the model's, nested models included.

    Raises:
        ValueError: when a counted layer has unknown dimensions.
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
