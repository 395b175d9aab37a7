"""`python -m tftrain.doctor`: measure this machine and say how to train on it.

Facts (CPU model, cores, the instruction-set features that matter for training,
memory; each GPU's name, compute capability and memory; TensorFlow's CUDA and
cuDNN build, and why TensorFlow sees no GPU when it sees none), short measurements
(matmul FLOP/s per device and precision, memory bandwidth, the data folder's disk,
host <-> GPU copies, all-reduce between GPUs and between two local processes),
then advice with its reasons, figures and sources: the training FLOPs per example
of the task (`tftrain.flops`), predicted examples/sec on each device (an upper
bound), and the device, precision, threads and strategy to use.

    python -m tftrain.doctor                          # the MNIST recipe's models, under a minute
    python -m tftrain.doctor examples/regression.py:task --data-dir DIR
    python -m tftrain.doctor --json > doctor.json     # for scripts
    python -m tftrain.doctor --quick                  # tiny sizes, seconds (tests)

Modules: `machine` (facts without TensorFlow), `gpus` (what TensorFlow sees and
why no GPU), `measure` (the timed measurements), `allreduce` (ring all-reduce on
127.0.0.1, also used by benchmarks/loopback_allreduce.py), `tasks` (the models and
their FLOPs), `advice` (pure rules), `report` (text), `diagnose` (the order of it
all), `__main__` (flags, exit codes).
"""

from tftrain.doctor.diagnose import diagnose

__all__ = ["diagnose"]
