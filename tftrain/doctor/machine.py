"""The machine facts the doctor reports: they live in `tftrain.host` (the bottom layer, without
TensorFlow, which runtime and benchmarks read too); re-exported here for the doctor's callers."""

from tftrain.host import *  # noqa: F401,F403
from tftrain.host import (  # noqa: F401 (the names the doctor and its tests use)
    CPUINFO, NVIDIA_PROC, cgroup_cpu_quota, cgroup_memory_limit, cpu_facts, cpu_flags, cpu_model, features,
    nvidia_hardware, usable_cores,
)
