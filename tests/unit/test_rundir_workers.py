"""Tests of the chief-only run directory (tftrain.rundir.task_run_dir)."""

from __future__ import annotations

import json

from tftrain import rundir


def _interrupted_run(path):
    (path / "backup").mkdir(parents=True)
    (path / "config.yaml").write_text("seed: 0\n")
    (path / "backup" / "training_metadata.json").write_text(json.dumps({"epoch": 2, "batch": 0}))
    return rundir.RunDir(path, resumed_epochs=2)


def test_chief_writes_the_run_directory(tmp_path):
    run_dir = rundir.RunDir(tmp_path / "run")
    with rundir.task_run_dir(run_dir, "seed: 1\n", is_chief=True) as out:
        assert out is run_dir
    assert (tmp_path / "run" / "config.yaml").read_text() == "seed: 1\n"


def test_other_workers_write_a_temporary_copy_that_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(rundir.tempfile, "tempdir", None)  # re-read TMPDIR
    run_dir = _interrupted_run(tmp_path / "run")
    stale = rundir.worker_scratch_dir(run_dir.path, "worker:1")
    stale.mkdir()
    (stale / "left-by-a-killed-run").write_text("x")
    with rundir.task_run_dir(run_dir, "seed: 1\n", is_chief=False, task="worker:1") as out:
        assert out.path == stale and out.path.parent == tmp_path / "tmp"
        assert not (out.path / "left-by-a-killed-run").exists()
        assert out.resumed_epochs == 2
        assert rundir.completed_epochs(out.backup_dir) == 2  # resumes where the chief does
        (out.path / "model.keras").write_text("weights")
    assert not stale.exists()
    assert sorted(p.name for p in run_dir.path.iterdir()) == ["backup", "config.yaml"]  # untouched
    assert (run_dir.path / "config.yaml").read_text() == "seed: 0\n"
