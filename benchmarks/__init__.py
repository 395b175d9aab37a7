"""Side-by-side benchmarks of tftrain on real MNIST (see README.md, "Benchmarks").

Run all: `python -m benchmarks [--quick]`; one: `python -m benchmarks.<name>`.
"""
