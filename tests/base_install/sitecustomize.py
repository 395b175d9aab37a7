"""Makes the packages named in `TFTRAIN_TESTS_WITHOUT` (comma-separated) look not installed in this process.

tests/conftest.py puts this folder on `PYTHONPATH` for every process a test starts, naming
pandas, scikit-learn, SciPy and matplotlib: the dev extras install them (for MLflow, the bayesian
tuner and the benchmark plots), `pip install tftrain` does not, and Keras imports each of them at
start-up whenever it is installed (2 s of the 7 s that `import tensorflow, keras` takes on 2 cores).
So test processes start faster and check that tftrain runs without them. A test whose processes
need them (the MLflow server, the benchmark suite) drops the variable (`tests.conftest.with_dev_extras`).

The path finder on `sys.meta_path` (which finds installed packages) is wrapped so that it finds
none of those packages: `import pandas`
raises ModuleNotFoundError and `importlib.util.find_spec("pandas")` returns None, as where pandas is
not installed (`importlib.metadata` still lists it). The next `sitecustomize` on `sys.path`, if any,
runs after this one.
"""

import importlib.machinery
import importlib.util
import os
import sys


class _Without:
    """A meta path finder that delegates to `finder` except for the top-level packages in `names`."""

    def __init__(self, finder, names):
        self._finder, self._names = finder, names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self._names:
            return None
        return self._finder.find_spec(fullname, path, target)

    def __getattr__(self, name):  # invalidate_caches, find_distributions, ...
        return getattr(self._finder, name)


def _run_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    rest = sys.path[entries.index(here) + 1:] if here in entries else []  # after this one: no cycle
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_names = frozenset(n.strip() for n in os.environ.get("TFTRAIN_TESTS_WITHOUT", "").split(",") if n.strip())
if _names:
    sys.meta_path[:] = [_Without(f, _names) if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
_run_next_sitecustomize()
