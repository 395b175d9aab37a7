"""Makes the packages named in `TFTRAIN_TESTS_WITHOUT` (comma-separated) unimportable in this process.

tests/conftest.py puts this folder on `PYTHONPATH` for every process a test starts, naming the
packages the dev extras install but `pip install tftrain` does not (pandas, scikit-learn, SciPy,
matplotlib). Keras imports each of them at start-up whenever it is installed (2 s of the 7 s that
`import tensorflow, keras` takes on 2 cores), so test processes start as fast as a base install's
and check that tftrain runs without them. A test whose processes need them (the MLflow server,
the benchmark plots) drops the variable (`tests.conftest.with_dev_extras`).

The first finder on `sys.meta_path` answers `import pandas` (and its submodules) with the
ModuleNotFoundError of a package that is not installed. (A `None` in `sys.modules` blocks the
import too, but code that asks `"pandas" in sys.modules` then takes it for imported: pyarrow does.)
"""

import os
import sys


class _NotInstalled:
    """A meta path finder for which the named top-level packages do not exist."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


_names = [n.strip() for n in os.environ.get("TFTRAIN_TESTS_WITHOUT", "").split(",") if n.strip()]
if _names:
    sys.meta_path.insert(0, _NotInstalled(_names))
