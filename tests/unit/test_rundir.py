import datetime
import json
import os

import pytest

from tftrain import config as config_lib
from tftrain import rundir
from tftrain.config import RecipeConfig, TrainConfig
from tftrain.errors import RunDirError

CFG = RecipeConfig(run_dir="x")


def started(path, cfg=CFG):
    run = rundir.check_run_dir(path, cfg.to_dict())
    rundir.create_run_dir(run, config_lib.to_yaml(cfg))
    return run


def test_new_directory(tmp_path):
    run = started(tmp_path / "run")
    assert run.resumed_epochs == 0
    assert config_lib.from_yaml(tmp_path / "run" / "config.yaml") == CFG


def test_same_config_resumes_from_checkpoint_epoch(tmp_path):
    started(tmp_path / "run")
    (tmp_path / "run" / "backup").mkdir()
    (tmp_path / "run" / "backup" / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": -1}))
    verbose_changed = RecipeConfig(run_dir="x", train=TrainConfig(verbose=2))
    assert rundir.check_run_dir(tmp_path / "run", verbose_changed.to_dict()).resumed_epochs == 3


def test_other_runs_checkpoint_is_refused_and_kept(tmp_path):
    started(tmp_path / "run")
    before = (tmp_path / "run" / "config.yaml").read_text()
    other = RecipeConfig(run_dir="x", train=TrainConfig(epochs=3))
    with pytest.raises(RunDirError, match=r"another run's files \(its config differs"):  # nothing trained yet
        rundir.check_run_dir(tmp_path / "run", other.to_dict())
    (tmp_path / "run" / "backup").mkdir()
    with pytest.raises(RunDirError, match=r"another run's checkpoint.*train\.epochs: 10 -> 3.*\(--config "
                                          r".*config\.yaml --run-dir .*run\) to resume it"):
        rundir.check_run_dir(tmp_path / "run", other.to_dict())  # its config.yaml may name the folder it moved from
    assert (tmp_path / "run" / "config.yaml").read_text() == before


@pytest.mark.parametrize("damage", [b"\xff\xfe\x00garbage", b"runtime: [unclosed"])
def test_a_damaged_config_beside_a_checkpoint_names_the_file_and_how_to_resume(tmp_path, damage):
    started(tmp_path / "run")
    (tmp_path / "run" / "backup").mkdir()
    (tmp_path / "run" / "config.yaml").write_bytes(damage)
    other = RecipeConfig(run_dir="x", train=TrainConfig(epochs=3))  # not the settings it was written with
    with pytest.raises(RunDirError, match=r"holds a damaged or no config\.yaml .*its backup may be intact\. Write "
                                          r"config\.yaml back .* and rerun to resume"):
        rundir.check_run_dir(tmp_path / "run", other.to_dict())
    assert (tmp_path / "run" / "config.yaml").read_bytes() == damage  # nothing a user could restore is touched


@pytest.mark.parametrize("damage", [b"\xff\xfe\x00garbage", b"runtime: [unclosed", b"train: {epochs: 1"[:9],
                                    b"data:\n  cache:\n"])
def test_a_damaged_config_is_written_back_by_the_command_whose_settings_match_its_digest(tmp_path, damage):
    started(tmp_path / "run")
    (tmp_path / "run" / "backup").mkdir()
    (tmp_path / "run" / "config.yaml").write_bytes(damage)  # some still parse as YAML, as a cut file may
    run_dir = rundir.check_run_dir(tmp_path / "run", CFG.to_dict())
    assert run_dir.config_repaired
    rundir.create_run_dir(run_dir, config_lib.to_yaml(CFG))
    assert (tmp_path / "run" / "config.yaml").read_text() == config_lib.to_yaml(CFG)
    assert not rundir.check_run_dir(tmp_path / "run", CFG.to_dict()).config_repaired


@pytest.mark.parametrize("digest", ["", "a1b2", "\x00" * 10])
def test_a_damaged_digest_leaves_an_intact_config_in_charge_and_is_written_again(tmp_path, digest):
    started(tmp_path / "run")
    (tmp_path / "run" / "backup").mkdir()
    (tmp_path / "run" / rundir.DIGEST_FILE).write_text(digest)
    run_dir = rundir.check_run_dir(tmp_path / "run", CFG.to_dict())
    assert not run_dir.config_repaired
    rundir.create_run_dir(run_dir, config_lib.to_yaml(CFG))
    assert (tmp_path / "run" / rundir.DIGEST_FILE).read_text().strip() == rundir.config_digest(CFG.to_dict())
    other = RecipeConfig(run_dir="x", train=TrainConfig(epochs=3))
    with pytest.raises(RunDirError, match="another run's checkpoint"):  # the config still guards the checkpoint
        rundir.check_run_dir(tmp_path / "run", other.to_dict())


def test_a_deleted_config_is_written_back_by_the_command_whose_settings_match_its_digest(tmp_path):
    started(tmp_path / "run")
    (tmp_path / "run" / "backup").mkdir()
    (tmp_path / "run" / "config.yaml").unlink()
    other = RecipeConfig(run_dir="x", train=TrainConfig(epochs=3))
    with pytest.raises(RunDirError, match=r"holds a damaged or no config\.yaml"):
        rundir.check_run_dir(tmp_path / "run", other.to_dict())
    run_dir = rundir.check_run_dir(tmp_path / "run", CFG.to_dict())
    assert run_dir.config_repaired
    rundir.create_run_dir(run_dir, config_lib.to_yaml(CFG))
    assert (tmp_path / "run" / "config.yaml").read_text() == config_lib.to_yaml(CFG)


def test_a_trained_model_without_metrics_or_checkpoint_is_not_trained_over(tmp_path):
    started(tmp_path / "run")
    (tmp_path / "run" / "model.keras").write_bytes(b"trained")
    with pytest.raises(RunDirError, match=r"holds a trained model \(model\.keras or model\.weights\.h5\) but no "
                                          r"metrics\.json and no checkpoint"):
        rundir.check_run_dir(tmp_path / "run", CFG.to_dict())
    assert (tmp_path / "run" / "model.keras").read_bytes() == b"trained"


def test_finished_run_is_refused(tmp_path):
    started(tmp_path / "run")
    (tmp_path / "run" / "metrics.json").write_text("{}")
    with pytest.raises(RunDirError, match="finished run"):
        rundir.check_run_dir(tmp_path / "run", CFG.to_dict())


def test_a_restart_of_the_job_that_finished_the_run_finds_it_finished_and_nothing_else_does(tmp_path):
    run = started(tmp_path / "run").path
    rundir.note_job(run, {"SLURM_JOB_ID": "77"})
    (run / "metrics.json").write_text("{}")
    again = rundir.check_run_dir(run, CFG.to_dict(), restart_of="slurm77")
    assert again.finished_before and not again.resumed
    for job in (None, "slurm78"):  # not a restart; a restart of another job (a new job on an old run directory)
        with pytest.raises(RunDirError, match="finished run"):
            rundir.check_run_dir(run, CFG.to_dict(), restart_of=job)
    other = RecipeConfig(run_dir="x", train=TrainConfig(epochs=3))
    with pytest.raises(RunDirError, match="finished run"):
        rundir.check_run_dir(run, other.to_dict(), restart_of="slurm77")
    (run / "failure.log").write_text("failed after metrics.json")  # an attempt that failed after writing it
    os.utime(run / "metrics.json", (1, 1))
    with pytest.raises(RunDirError, match="finished run"):
        rundir.check_run_dir(run, CFG.to_dict(), restart_of="slurm77")
    assert not rundir.check_run_dir(tmp_path / "new", CFG.to_dict(), restart_of="slurm77").finished_before
    rundir.note_job(run, {})  # an attempt outside a job forgets the earlier job
    assert not (run / rundir.JOB_FILE).exists()


@pytest.mark.parametrize("env, job", [
    ({}, None), ({"SLURM_JOB_ID": "7"}, None), ({"SLURM_RESTART_COUNT": "0", "SLURM_JOB_ID": "7"}, None),
    ({"SLURM_RESTART_COUNT": "2", "SLURM_JOB_ID": "7"}, "slurm7"), ({"SLURM_RESTART_COUNT": "1"}, None),
    ({"TFTRAIN_RESTART_COUNT": "1", "TFTRAIN_RUN_ID": "20261203-101500"}, "20261203-101500"),
    ({"SLURM_RESTART_COUNT": "x", "SLURM_JOB_ID": "7"}, None)])
def test_restarted_job_is_the_job_id_on_a_slurm_or_launcher_restart(env, job):
    assert rundir.restarted_job(env) == job


def test_foreign_files_are_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="did not write .*notes.txt"):
        rundir.check_run_dir(tmp_path / "run", CFG.to_dict())


def test_file_instead_of_directory(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(RunDirError, match="is a file"):
        rundir.check_run_dir(tmp_path / "f", CFG.to_dict())


def test_empty_existing_directory_is_fine(tmp_path):
    (tmp_path / "run").mkdir()
    assert rundir.check_run_dir(tmp_path / "run", CFG.to_dict()).resumed_epochs == 0


def test_default_run_dir_never_reuses_a_name(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    first = rundir.default_run_dir("mnist", root=str(tmp_path), now=now)
    assert first.name == "mnist-20260102-030405"
    first.mkdir()
    second = rundir.default_run_dir("mnist", root=str(tmp_path), now=now)
    assert second.name == "mnist-20260102-030405-2"


def test_every_task_of_a_cluster_derives_the_same_default_run_id():
    spec = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    assert rundir.cluster_run_id(spec, env={"TFTRAIN_RUN_ID": "20261201-101500", "SLURM_JOB_ID": "7"}) == "20261201-101500"
    assert rundir.cluster_run_id(spec, env={"SLURM_JOB_ID": "4711"}) == "slurm4711"
    hashed = rundir.cluster_run_id(spec, env={})
    assert hashed == rundir.cluster_run_id(dict(reversed(list(spec.items()))), env={}) and hashed.startswith("cluster-")
    assert hashed != rundir.cluster_run_id({**spec, "worker": ["127.0.0.1:3"]}, env={})


def test_history_reads_the_whole_run_and_keeps_an_epoch_logged_twice_once(tmp_path):
    from tftrain.epoch_log import read_history

    path = tmp_path / "history.csv"
    path.write_text("epoch,loss,val_loss\n0,0.9,1.0\n1,0.5,0.7\n1,0.45,0.65\n2,0.3,\n")  # epoch 1 trained again
    history = read_history(path)
    assert list(history) == ["loss", "val_loss"] and history["loss"] == [0.9, 0.45, 0.3]
    assert history["val_loss"][:2] == [1.0, 0.65] and history["val_loss"][2] != history["val_loss"][2]  # NaN
    assert read_history(tmp_path / "missing.csv") == {}


def test_resume_finds_a_run_that_an_earlier_attempt_of_the_restarted_job_finished(tmp_path):
    run = started(tmp_path / "runs" / "mnist-1").path
    rundir.note_job(run, {"SLURM_JOB_ID": "5"})
    (run / "metrics.json").write_text("{}")
    root = str(tmp_path / "runs")
    assert rundir.newest_unfinished("mnist", CFG.to_dict(), root) is None
    assert rundir.newest_unfinished("mnist", CFG.to_dict(), root, restart_of="slurm6") is None
    assert rundir.newest_unfinished("mnist", CFG.to_dict(), root, restart_of="slurm5") == run


def test_a_run_finished_or_taken_between_the_check_and_the_lock_is_refused_untouched(tmp_path):
    """A second command on the same directory: the state is read again once the lock is held."""
    path = tmp_path / "run"
    checked = rundir.check_run_dir(path, CFG.to_dict())  # new, before TensorFlow starts
    path.mkdir()
    (path / "config.yaml").write_text(config_lib.to_yaml(CFG))  # meanwhile the first command finished the run
    (path / "metrics.json").write_text("{}")
    with pytest.raises(RunDirError, match="holds a finished run"):
        with rundir.task_run_dir(checked, config_lib.to_yaml(CFG)):
            pass
    (path / "metrics.json").unlink()
    other = RecipeConfig(run_dir="x", train=TrainConfig(epochs=3))
    with pytest.raises(RunDirError, match="was taken by another run while this one started"):
        with rundir.task_run_dir(checked, config_lib.to_yaml(other)):
            pass
    assert sorted(p.name for p in path.iterdir() if p.name != rundir.LOCK_FILE) == ["config.yaml"]
    verbose = RecipeConfig(run_dir="x", train=TrainConfig(verbose=2))  # same run: takes it and resumes
    with rundir.task_run_dir(checked, config_lib.to_yaml(verbose)) as out:
        assert out.path == path


def test_history_keeps_one_row_per_epoch_the_last_one_logged(tmp_path):
    from types import SimpleNamespace

    from tftrain.epoch_log import tidy_history

    path = tmp_path / "history.csv"  # epoch 1 logged, a kill before its backup, then logged again
    path.write_text("epoch,loss,val_loss\n0,0.9,0.8\n1,0.5,0.6\n1,0.4,0.5\n2,0.3,0.4\n")
    assert tidy_history(path, SimpleNamespace(epoch=[1, 2], history={"loss": [0.4, 0.3]})) is None
    assert path.read_text() == "epoch,loss,val_loss\n0,0.9,0.8\n1,0.4,0.5\n2,0.3,0.4\n"


def test_a_damaged_history_is_rebuilt_from_this_attempt_and_said(tmp_path):
    from types import SimpleNamespace

    from tftrain.epoch_log import read_history, tidy_history

    path = tmp_path / "history.csv"  # its header cut by a full disk, the next row glued onto it
    path.write_text("epoch,loss,val_l0,0.9,0.8\n1,0.5,0.6\n")
    note = tidy_history(path, SimpleNamespace(epoch=[2], history={"loss": [0.3], "val_loss": [0.4]}))
    assert note == f"{path} was damaged; it now holds the 1 epoch(s) this attempt trained"
    assert read_history(path) == {"loss": [0.3], "val_loss": [0.4]}


def test_a_metric_named_with_a_leading_digit_is_not_damage(tmp_path):
    from tftrain.epoch_log import tidy_history

    path = tmp_path / "history.csv"
    path.write_text("epoch,0_accuracy,loss\n0,0.5,0.9\n1,0.7,0.5\n")
    assert tidy_history(path) is None and path.read_text() == "epoch,0_accuracy,loss\n0,0.5,0.9\n1,0.7,0.5\n"


def test_a_run_directory_from_before_the_digest_gets_the_digest_of_its_own_config(tmp_path):
    started(tmp_path / "run")
    (tmp_path / "run" / rundir.DIGEST_FILE).unlink()  # written by a version without it
    (tmp_path / "run" / "config.yaml").write_text(config_lib.to_yaml(CFG).replace("epochs: 10", "epochs: 10.0"))
    run_dir = rundir.check_run_dir(tmp_path / "run", CFG.to_dict())  # the same settings: resumable
    rundir.create_run_dir(run_dir, config_lib.to_yaml(CFG))
    again = rundir.check_run_dir(tmp_path / "run", CFG.to_dict())
    assert not again.config_repaired and "epochs: 10.0" in (tmp_path / "run" / "config.yaml").read_text()


def test_a_folder_left_with_only_the_digest_is_empty(tmp_path):
    started(tmp_path / "run")
    for name in ("config.yaml",):
        (tmp_path / "run" / name).unlink()
    assert rundir.check_run_dir(tmp_path / "run", CFG.to_dict()).resumed_epochs == 0


def test_a_cut_row_is_dropped_and_the_epochs_before_it_and_this_attempt_s_are_kept(tmp_path):
    from types import SimpleNamespace

    from tftrain.epoch_log import read_history, tidy_history

    path = tmp_path / "history.csv"  # epoch 2's row cut by a kill; the rerun's epoch 2 glued onto it
    path.write_text("epoch,loss,val_loss\n0,0.9,0.8\n1,0.5,0.6\n2,0.42,2,0.35,0.45\n3,0.3,0.4\n")
    note = tidy_history(path, SimpleNamespace(epoch=[2, 3], history={"loss": [0.35, 0.3], "val_loss": [0.45, 0.4]}))
    assert note == f"{path} had 1 damaged row(s); dropped, and this attempt's epochs kept"
    assert read_history(path) == {"loss": [0.9, 0.5, 0.35, 0.3], "val_loss": [0.8, 0.6, 0.45, 0.4]}


def test_a_cut_row_whose_epoch_is_not_trained_again_is_named(tmp_path):
    from types import SimpleNamespace

    from tftrain.epoch_log import tidy_history

    path = tmp_path / "history.csv"  # epoch 2's row cut; this attempt resumed after it (its checkpoint was kept)
    path.write_text("epoch,loss\n0,0.9\n1,0.5,7\n")
    note = tidy_history(path, SimpleNamespace(epoch=[2], history={"loss": [0.3]}))
    assert note.endswith("this attempt's epochs kept; no row for epoch(s) 2")


def test_a_row_of_an_epoch_after_the_run_s_last_is_dropped(tmp_path):
    from types import SimpleNamespace

    from tftrain.epoch_log import read_history, tidy_history

    path = tmp_path / "history.csv"  # another program's row appended
    path.write_text("epoch,loss\n0,0.9\n1,0.5\n7,0.1\n")
    note = tidy_history(path, SimpleNamespace(epoch=[1], history={"loss": [0.5]}))
    assert note.startswith(f"{path} had 1 damaged row(s)") and read_history(path) == {"loss": [0.9, 0.5]}


def test_lines_that_are_not_text_are_dropped_so_keras_can_append(tmp_path):
    import keras
    import numpy as np

    from tftrain.epoch_log import mend, read_history

    path = tmp_path / "history.csv"  # saved back in cp1252, and a crash's NUL bytes
    path.write_bytes(b"epoch,loss\n0,0.9\n1,0.5 \xe9\n2,0.4\n\0\0\0\n")
    assert mend(path) == f"{path} had 2 damaged line(s) (not text, or a row cut short); dropped, so the epoch log " \
                         "and metrics.json's history lack those epochs"
    assert read_history(path) == {"loss": [0.9, 0.4]} and mend(path) is None
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((4, 1)), np.zeros((4, 1)), verbose=0, callbacks=[keras.callbacks.CSVLogger(str(path), append=True)])
    assert path.read_text().splitlines()[-1].startswith("0,")


def test_a_history_already_one_row_per_epoch_is_not_rewritten(tmp_path):
    from tftrain.epoch_log import tidy_history

    path = tmp_path / "history.csv"
    path.write_text("epoch,loss\r\n0,0.9\r\n1,0.5\r\n")  # CSVLogger's own line ends
    before = path.stat().st_ino
    assert tidy_history(path) is None and path.stat().st_ino == before and path.read_bytes().count(b"\r\n") == 3


def test_an_unwritable_run_directory_holding_a_checkpoint_is_told_how_to_resume(tmp_path, monkeypatch):
    import errno
    import tempfile

    from tftrain import rundir
    from tftrain.errors import RunDirError

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    (tmp_path / "run" / "backup").mkdir(parents=True)
    with pytest.raises(RunDirError, match=r"cannot be written \(.*Read-only file system\)\. Make it writable \(or copy "
                                          r"it .*\), then rerun the same command: it resumes from the run's checkpoint"):
        rundir._check_writable(tmp_path / "run")
    with pytest.raises(RunDirError, match=r"Pass --run-dir with a folder you can write to\.$"):
        rundir._check_writable(tmp_path / "new-run")


@pytest.mark.parametrize("metrics, model, unwritten", [("{garbage", True, "its metrics.json cannot be read as a record"),
                                                       ("[]", True, "its metrics.json cannot be read as a record"),
                                                       ("{}", False, "its model.keras is missing")])
def test_a_damaged_end_beside_its_checkpoint_resumes_from_it_and_a_whole_one_is_finished(tmp_path, metrics, model,
                                                                                         unwritten):
    run = started(tmp_path / "run").path
    (run / "backup").mkdir()
    (run / "backup" / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": -1}))
    (run / "metrics.json").write_text(metrics)
    if model:
        (run / "model.keras").write_bytes(b"trained")
    again = rundir.check_run_dir(run, CFG.to_dict())
    assert again.end_unwritten == unwritten and again.resumed_epochs == 3 and not again.finished_before
    (run / "metrics.json").write_text("{}")
    (run / "model.keras").write_bytes(b"trained")
    assert rundir.check_run_dir(run, CFG.to_dict(), restart_of=None).end_unwritten is None


def test_a_directory_holding_only_the_failure_log_of_an_attempt_that_failed_as_it_started_is_a_new_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".tftrain.lock").write_text("")
    (run / "failure.log").write_text("OSError: [Errno 28] No space left on device\n")
    assert not rundir.check_run_dir(run, CFG.to_dict()).resumed  # the same command, once space is freed
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="already holds files tftrain did not write"):
        rundir.check_run_dir(run, CFG.to_dict())


def test_resume_names_the_process_training_the_run_it_would_take(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "runs"
    run = started(root / "mnist-20260101-000000").path
    (run / "backup").mkdir()
    (run / "backup" / "training_metadata.json").write_text(json.dumps({"epoch": 1, "batch": -1}))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from tftrain import rundir\n"
                               "with rundir.locked(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
                               str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=rf"Run directory '{run}' is in use by another tftrain process \(pid "
                                              rf"{holder.pid} "):
            rundir.newest_unfinished("mnist", CFG.to_dict(), str(root))
    finally:
        holder.kill()
        holder.wait()
    assert rundir.newest_unfinished("mnist", CFG.to_dict(), str(root)) == run


def test_a_last_row_cut_short_is_dropped_and_said(tmp_path):
    from tftrain.epoch_log import mend, read_history

    path = tmp_path / "history.csv"  # a kill inside CSVLogger's write of epoch 1's row
    path.write_bytes(b"epoch,loss,val_loss\r\n0,0.9,0.8\r\n1,0.5")
    assert mend(path).startswith(f"{path} had 1 damaged line(s) (not text, or a row cut short); dropped")
    assert read_history(path) == {"loss": [0.9], "val_loss": [0.8]} and mend(path) is None
