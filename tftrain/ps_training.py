"""Moved to `tftrain.train.loops.ps_training` (the training layer, beside the other loops); re-exported here."""

from tftrain.train.loops.ps_training import *  # noqa: F401,F403
from tftrain.train.loops.ps_training import evaluate, fit  # noqa: F401
