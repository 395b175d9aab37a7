"""benchmarks.common: what results files record of the command line."""

from benchmarks import common
from tests.conftest import REPO


def test_portable_argv_makes_repo_paths_relative_and_drops_empty_flags():
    argv = ["--out", str(REPO / "benchmarks" / "results"), "--prefix", "", "--device", "cpu", "--quick"]
    assert common.portable_argv(argv) == ["--out", "benchmarks/results", "--device", "cpu", "--quick"]
    assert common.portable_argv([f"--out={REPO / 'benchmarks'}", "--prefix="]) == ["--out=benchmarks", "--prefix="]


def test_portable_argv_keeps_paths_outside_the_repo_and_non_empty_values(tmp_path):
    argv = ["--out", str(tmp_path), "--prefix", "gpu-"]
    assert common.portable_argv(argv) == ["--out", str(tmp_path), "--prefix", "gpu-"]


def test_jobs_is_for_quick_runs_only(capsys):
    import pytest

    from benchmarks.__main__ import parse_args

    assert parse_args(["--quick", "--jobs", "2"]).jobs == 2
    with pytest.raises(SystemExit) as e:
        parse_args(["--jobs", "2"])
    assert e.value.code == 2 and "it is for --quick only" in capsys.readouterr().err
