"""Times TensorFlow's ring all-reduce between local workers on 127.0.0.1.

    python benchmarks/loopback_allreduce.py                 # 2 workers
    python benchmarks/loopback_allreduce.py --workers 4

Starts N tasks with `tftrain.launch`; each builds a `MultiWorkerMirroredStrategy`
(`CommunicationImplementation.RING`, gRPC) and all-reduces float32 tensors of several
sizes, including the 2.68 MB of gradients of the MNIST MLP (669,706 parameters).
Worker 0 reports the median time per all-reduce; the driver fits
`t = a + b * bytes_sent` with bytes_sent = 2(N-1)/N x size, the per-worker traffic of
a ring (benchmarks/allreduce_model.py), and prints a (fixed cost per all-reduce, s) and
1/b (effective bandwidth, bytes/s). On a shared machine, repeat and compare. The
workers and the fit live in `tftrain.doctor.allreduce` (shared with
`python -m tftrain.doctor`).
"""

from __future__ import annotations

import argparse
import os

from tftrain.doctor.allreduce import SIZES, fit_ring, loopback_allreduce


def main(argv=None) -> None:
    """Runs the job and prints the table and the fit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args(argv)
    try:
        rows = loopback_allreduce(args.workers, SIZES, args.iterations, timeout_s=600)
    except RuntimeError as e:
        raise SystemExit(f"launch failed: {e}") from None
    n = args.workers
    fit = fit_ring(rows, n)
    print(f"Ring all-reduce on 127.0.0.1, {n} workers, {os.cpu_count()} CPU cores (median of {args.iterations})\n")
    print("| tensor bytes | bytes sent per worker | ms per all-reduce | effective MB/s |")
    print("|---|---|---|---|")
    for r in fit["rows"]:
        ms, mb_s = r["median_s"] * 1e3, r["bytes_per_s"] / 1e6
        print(f"| {r['bytes']:,} | {r['bytes_sent']:,.0f} | {ms:.2f} | {mb_s:,.0f} |")
    fixed = "n/a" if fit["fixed_s"] is None else f"{fit['fixed_s'] * 1e3:.2f} ms"
    print(f"\nfit: fixed cost a = {fixed} per all-reduce, bandwidth 1/b = {fit['bytes_per_s'] / 1e6:,.0f} MB/s")


if __name__ == "__main__":
    main()
