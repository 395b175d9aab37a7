"""`python -m tftrain.doctor`: measure this machine and say how to train on it.

Reports the CPU, memory, GPUs and TensorFlow build, times matmuls, memory, disk,
copies and all-reduce, and advises device, precision, threads and strategy, with
the predicted examples/sec upper bound for the task.

    python -m tftrain.doctor [FILE.py:NAME] [--data-dir DIR] [--json] [--quick]
"""

from tftrain.doctor.diagnose import diagnose

__all__ = ["diagnose"]
