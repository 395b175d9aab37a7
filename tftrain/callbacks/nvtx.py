"""NvtxSteps: each training execution as an NVTX range for Nsight Systems (NVIDIA's `nvtx` package), named like
`ProfilerWindow`'s markers: `"train 16"`, or `"train(8 steps) 16"` for steps 16..23."""

from __future__ import annotations

import keras

from tftrain.callbacks._steps import steps_per_execution
from tftrain.callbacks._trace_steps import step_marker_name
from tftrain.errors import ConfigError
from tftrain.runtime.nvtx import NVTX_DOMAIN, NVTX_INSTALL


class NvtxSteps(keras.callbacks.Callback):
    """Names each training execution of `fit` as an NVTX range. Steps count executions x `steps_per_execution`
    from `fit`'s start, not the optimizer's counter (no device round trip).

    Args:
        domain: the NVTX domain (one row in Nsight Systems). Defaults to `"tftrain"`.

    Raises:
        ConfigError: NVIDIA's `nvtx` package is not installed.

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
