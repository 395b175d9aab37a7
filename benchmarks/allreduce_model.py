"""A cost model of synchronous data-parallel training with ring all-reduce.

Prints the tables of docs/scaling.md:

    python benchmarks/allreduce_model.py

Model (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters
of workstations"; Thakur, Rabenseifner & Gropp 2005): a ring all-reduce of S bytes
over N workers runs 2(N-1) steps (reduce-scatter, then all-gather); in each step
every worker sends and receives S/N bytes. Per step of training:

    T_allreduce(N, S) = 2 (N - 1) * alpha  +  2 (N - 1) / N * S / B

where B is each worker's link bandwidth (bytes/s) and alpha the per-message latency
(s). With T_compute the time one worker needs for its forward and backward pass,

    efficiency (no overlap)   = T_compute / (T_compute + T_allreduce)
    efficiency (full overlap) = T_compute / max(T_compute, T_allreduce)

The bandwidth term approaches 2 S / B as N grows: the bytes each worker sends do
not grow with N, which is why a ring scales; only the latency term grows with N.
Real systems sit between the two efficiencies: all-reduce of late layers' gradients
overlaps the backward pass of early layers (Horovod's tensor fusion, TensorFlow's
collective ops), but the last bucket cannot.

Every input is a named constant below with its source or the word "assumed".
Pure Python; no TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses

GBIT = 1e9 / 8
"""Bytes per second in one Gbit/s."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model's per-step cost on one worker.

    Attributes:
        name: model name.
        params: trainable parameters.
        bytes_per_param: bytes per gradient element (4 for float32).
        compute_s: seconds per training step on one worker (forward + backward of
            its per-worker batch), from `source`.
        source: where the figures come from.
    """

    name: str
    params: int
    bytes_per_param: int
    compute_s: float
    source: str

    @property
    def gradient_bytes(self) -> float:
        """Bytes all-reduced per step."""
        return self.params * self.bytes_per_param


@dataclasses.dataclass(frozen=True)
class Link:
    """A network: per-worker bandwidth (bytes/s) and per-message latency (s)."""

    name: str
    bandwidth: float
    latency_s: float


# 784-512-512-10 MLP of tftrain.recipes.mnist: 784*512+512 + 512*512+512 + 512*10+10.
MNIST_MLP_PARAMS = 669_706

# Measured on this repository's 2-core machine (shared with other jobs) by
# benchmarks/multi_worker_throughput.py: one process, batch 128, float32, last epoch
# 4,923 examples/sec -> 128 / 4,923 s = 26 ms per step. See docs/scaling.md.
MNIST_MLP_STEP_S = 128 / 4_923

WORKLOADS = (
    Workload("MNIST MLP (this repo, CPU)", MNIST_MLP_PARAMS, 4, MNIST_MLP_STEP_S,
             "params counted; step time measured here"),
    # Keras Applications table (https://keras.io/api/applications/): ResNet101 44.7M
    # parameters, VGG16 138.4M. Step times: per-GPU batch 64 on a Pascal P100, as in
    # Horovod's 512-GPU benchmark; throughputs assumed (about 130 and 180 images/sec
    # in float32), good to a factor of ~1.5.
    Workload("ResNet-101 (P100, batch 64)", 44_700_000, 4, 64 / 130,
             "Keras Applications params; ~130 img/s/GPU assumed"),
    Workload("VGG-16 (P100, batch 64)", 138_400_000, 4, 64 / 180,
             "Keras Applications params; ~180 img/s/GPU assumed"),
)

LOOPBACK = Link("loopback gRPC, 2 shared cores (measured here)", 242e6, 3.4e-3)
"""Fitted to benchmarks/loopback_allreduce.py on this machine: a = 7.2 ms (N=2) and
19.3 ms (N=4) fixed cost per all-reduce = 2(N-1) x 3.6 / 3.2 ms; 242 / 244 MB/s."""

LOOPBACK_MEASURED_MS = {2: 22.28, 4: 39.44}
"""Measured ms per all-reduce of the MNIST MLP's 2,678,824 gradient bytes on 127.0.0.1
(benchmarks/loopback_allreduce.py, median of 30, shared 2-core machine)."""

LINKS = (
    # Horovod's benchmark network (RoCE, 25 Gbit/s); RDMA latency assumed 10 us.
    Link("25 Gbit/s RoCE", 25 * GBIT, 10e-6),
    # Commodity data-centre Ethernet over TCP; latency assumed 50 us.
    Link("10 Gbit/s TCP", 10 * GBIT, 50e-6),
    # HDR InfiniBand; latency assumed 5 us.
    Link("200 Gbit/s InfiniBand", 200 * GBIT, 5e-6),
)

WORKER_COUNTS = (2, 8, 64, 512)

HOROVOD_512_GPU = {"ResNet-101 (P100, batch 64)": 0.90, "VGG-16 (P100, batch 64)": 0.68}
"""Horovod's published scaling efficiency on 512 Pascal GPUs (128 servers x 4, RoCE
25 Gbit/s): Sergeev & Del Balso 2018, arXiv:1802.05799, and Horovod's
docs/benchmarks page."""


def bytes_sent_per_worker(num_workers: int, gradient_bytes: float) -> float:
    """Bytes each worker sends in one ring all-reduce: 2 (N-1)/N x S."""
    return 2 * (num_workers - 1) / num_workers * gradient_bytes


def allreduce_seconds(num_workers: int, gradient_bytes: float, link: Link) -> float:
    """Ring all-reduce time (s): 2 (N-1) latency terms plus the bandwidth term."""
    if num_workers < 2:
        return 0.0
    return 2 * (num_workers - 1) * link.latency_s + bytes_sent_per_worker(num_workers, gradient_bytes) / link.bandwidth


def efficiency(compute_s: float, comm_s: float, overlap: bool) -> float:
    """Fraction of linear speed-up: compute / (compute + comm), or / max(...) with full overlap."""
    return compute_s / (max(compute_s, comm_s) if overlap else compute_s + comm_s)


def table(workloads=WORKLOADS, links=LINKS, counts=WORKER_COUNTS) -> str:
    """The markdown table of all-reduce time and efficiency, one row per workload x link."""
    head = "| model | gradient MB | compute s/step | link | " + " | ".join(
        f"N={n}: all-reduce ms, eff. (no / full overlap)" for n in counts
    ) + " |"
    lines = [head, "|" + "---|" * (4 + len(counts))]
    for w in workloads:
        for link in links:
            cells = []
            for n in counts:
                t = allreduce_seconds(n, w.gradient_bytes, link)
                cells.append(
                    f"{t * 1e3:,.1f} ms, {efficiency(w.compute_s, t, False):.0%} / {efficiency(w.compute_s, t, True):.0%}"
                )
            lines.append(
                f"| {w.name} | {w.gradient_bytes / 1e6:,.1f} | {w.compute_s:.3f} | {link.name} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def overlap_needed(workload: Workload, link: Link, num_workers: int, target: float) -> float:
    """Fraction of the all-reduce that must overlap compute to reach `target` efficiency.

    With a fraction f hidden behind compute, step time = T_compute + (1 - f) T_allreduce.
    """
    comm = allreduce_seconds(num_workers, workload.gradient_bytes, link)
    if comm == 0:
        return 0.0
    exposed = workload.compute_s / target - workload.compute_s
    return max(0.0, min(1.0, 1 - exposed / comm))


def main(argv=None) -> None:
    """Prints the tables of docs/scaling.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print("Ring all-reduce per step and scaling efficiency (no overlap / full overlap),")
    print("fixed per-worker batch (weak scaling, as in Horovod's benchmark)\n")
    print(table())
    mlp = WORKLOADS[0]
    print("\nThe model against this machine's loopback (MNIST MLP gradients, 2.68 MB):")
    for n, measured in LOOPBACK_MEASURED_MS.items():
        t = allreduce_seconds(n, mlp.gradient_bytes, LOOPBACK)
        print(f"  N={n}: model {t * 1e3:.1f} ms, measured {measured:.1f} ms; efficiency at a 26 ms step: "
              f"{efficiency(mlp.compute_s, t, False):.0%} (no overlap)")
    print("\nBytes each worker sends per all-reduce, 2(N-1)/N x S, as a multiple of S:")
    print("  " + ", ".join(f"N={n}: {bytes_sent_per_worker(n, 1.0):.3f}" for n in (1, 2, 4, 8, 64, 512)))
    print("\nComparison with Horovod's published 512-GPU efficiency (25 Gbit/s RoCE):")
    roce = LINKS[0]
    for w in WORKLOADS:
        if w.name not in HOROVOD_512_GPU:
            continue
        t = allreduce_seconds(512, w.gradient_bytes, roce)
        published = HOROVOD_512_GPU[w.name]
        print(
            f"  {w.name}: model {efficiency(w.compute_s, t, False):.0%} (no overlap) .. "
            f"{efficiency(w.compute_s, t, True):.0%} (full overlap); published {published:.0%}, which needs "
            f"{overlap_needed(w, roce, 512, published):.0%} of the {t * 1e3:.0f} ms all-reduce hidden behind compute"
        )


if __name__ == "__main__":
    main()
