"""`python -m tftrain.doctor [FILE.py:NAME] [--data-dir DIR] [--json] [--quick]`: measure this machine and advise.

Reports CPU, memory, GPUs and the TensorFlow build; times matmuls, memory, disk, copies and all-reduce; advises
device, precision, threads and strategy, with the task's predicted examples/sec upper bound.
"""

from tftrain.doctor.diagnose import diagnose

__all__ = ["diagnose"]
