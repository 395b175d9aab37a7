"""Runs `python -m MODULE ARGS...` held still after its first checkpoint: once `StepBackup` has
written it, the process sleeps up to `HOLD_S` seconds before training on, so that a test's Ctrl-C
lands in the middle of the run however fast the run is (the rest of a 4-epoch MNIST run can take
less than the time a loaded machine needs to see the checkpoint and send the signal; CI once saw
the run end first). The signal is real: SIGINT's KeyboardInterrupt leaves the sleep inside the
callback, as it would leave any other Python code of the training loop.

Usage: python tests/held_run.py MODULE [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import sys
import time

from tftrain.callbacks import backup

HOLD_S = 60.0
"""Seconds the run waits after its first checkpoint (it trains on if no signal came)."""


def _held_after_first(save):
    held = []

    def save_then_hold(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if not held:
            held.append(True)
            time.sleep(HOLD_S)

    return save_then_hold


if __name__ == "__main__":
    backup.StepBackup._save = _held_after_first(backup.StepBackup._save)
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    sys.path[0] = os.getcwd()  # as `python -m` has it
    runpy.run_module(module, run_name="__main__", alter_sys=True)
