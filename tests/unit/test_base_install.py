"""The processes tests start run as a base install: the dev extras' pandas, scikit-learn, SciPy and
matplotlib cannot be imported there (tests/base_install), and can again with `with_dev_extras`."""

import os
import subprocess
import sys

from tests.conftest import BASE_INSTALL_WITHOUT, REPO, with_dev_extras

_PROBE = ("import importlib, sys\n"
          "missing = []\n"
          "for name in sys.argv[1].split(','):\n"
          "    try:\n"
          "        importlib.import_module(name)\n"
          "    except ModuleNotFoundError:\n"
          "        missing.append(name)\n"
          "print(','.join(missing))\n")


def _missing(env):
    done = subprocess.run([sys.executable, "-c", _PROBE, BASE_INSTALL_WITHOUT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Error in sitecustomize" not in done.stderr, done.stderr
    return done.stdout.strip()


def test_processes_started_by_tests_lack_the_dev_extras_and_get_them_back_on_request():
    assert _missing(dict(os.environ)) == BASE_INSTALL_WITHOUT
    assert _missing(with_dev_extras(dict(os.environ))) == ""
    assert _missing(with_dev_extras(dict(os.environ), "matplotlib")) == BASE_INSTALL_WITHOUT.replace(",matplotlib", "")


def test_a_missing_package_is_not_found_as_where_it_is_not_installed():
    code = ("import importlib.util, sys\n"
            "assert importlib.util.find_spec('pandas') is None and importlib.util.find_spec('json') is not None\n"
            "assert 'pandas' not in sys.modules\n"
            "import pyarrow  # which asks whether pandas is there\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok" and "Error in sitecustomize" not in done.stderr, \
        done.stderr


def test_the_tutorial_tests_offline_sitecustomize_runs_the_shim_after_it():
    offline = REPO / "tests" / "integration" / "tf_tutorial" / "offline"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(offline), os.environ["PYTHONPATH"]])}
    assert _missing(env) == BASE_INSTALL_WITHOUT
