"""`python -m benchmarks.zoo`: see `benchmarks.zoo`."""

from benchmarks.zoo import main

if __name__ == "__main__":
    raise SystemExit(main())
