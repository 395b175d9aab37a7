"""NvtxSteps: each training execution as a named NVTX range, for NVIDIA Nsight Systems.

Nsight Systems (`nsys profile -t cuda,nvtx ...`) shows NVTX ranges on the timeline
above the CUDA kernels they launched, and `nsys stats --report nvtx_sum` tabulates
their durations. `NvtxSteps` pushes one range per execution (one `train_function`
call: `steps_per_execution` training steps), named like the TensorBoard step markers
of `ProfilerWindow`: `"train 16"` for step 16, `"train(8 steps) 16"` for steps 16..23.
Ranges cost next to nothing when no tool is attached (NVTX's own design). Uses
NVIDIA's `nvtx` package (`pip install nvtx`).
"""

from __future__ import annotations

import keras

from tftrain.callbacks._steps import steps_per_execution
from tftrain.callbacks._trace_steps import step_marker_name
from tftrain.errors import ConfigError
from tftrain.runtime.nvtx import NVTX_DOMAIN, NVTX_INSTALL


class NvtxSteps(keras.callbacks.Callback):
    """Names each training execution of `fit` as an NVTX range.

    Steps are counted from the start of this `fit` call as executions x
    `steps_per_execution` (the last execution of an epoch of unknown length may
    have run fewer), without reading the optimizer's step counter, so the
    callback adds no device round trip. Each range opens in
    `on_train_batch_begin` and closes in `on_train_batch_end`.

    Args:
        domain: the NVTX domain, one row in Nsight Systems. Defaults to
            `"tftrain"`.

    Raises:
        ConfigError: when NVIDIA's `nvtx` package is not installed.

    Example:
        >>> model.fit(ds, epochs=2, callbacks=[NvtxSteps()])
        $ nsys profile -t cuda,nvtx,osrt -o train python train.py
    """

    def __init__(self, domain: str = NVTX_DOMAIN):
        super().__init__()
        try:
            import nvtx
        except ImportError:
            raise ConfigError(f"NvtxSteps needs NVIDIA's nvtx package. Run `{NVTX_INSTALL}`.") from None
        self._nvtx = nvtx
        self.domain = domain
        self.steps = 0

    def on_train_begin(self, logs=None):
        self.steps = 0

    def on_train_batch_begin(self, batch, logs=None):
        n = steps_per_execution(self.model)
        self._nvtx.push_range(f"{step_marker_name(n)} {self.steps}", domain=self.domain)
        self.steps += n

    def on_train_batch_end(self, batch, logs=None):
        self._nvtx.pop_range(domain=self.domain)
