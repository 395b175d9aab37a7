"""NvtxSteps: each training execution as a named NVTX range, for NVIDIA Nsight Systems.

Ranges are named like `ProfilerWindow`'s step markers: `"train 16"`, or `"train(8 steps) 16"` for
steps 16..23. Uses NVIDIA's `nvtx` package.
"""

from __future__ import annotations

import keras

from tftrain.callbacks._steps import steps_per_execution
from tftrain.callbacks._trace_steps import step_marker_name
from tftrain.errors import ConfigError
from tftrain.runtime.nvtx import NVTX_DOMAIN, NVTX_INSTALL


class NvtxSteps(keras.callbacks.Callback):
    """Names each training execution of `fit` as an NVTX range.

    Steps are counted as executions x `steps_per_execution` from the start of `fit`, without
    reading the optimizer's counter, so no device round trip is added.

    Args:
        domain: the NVTX domain (one row in Nsight Systems). Defaults to `"tftrain"`.

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
