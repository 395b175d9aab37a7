"""Config fields added for the callback layer: batch_size 'auto', profile, tune, tuner, width."""

import pytest

from tftrain import cli, config
from tftrain.config import DataConfig, RecipeConfig, TrainConfig, from_yaml
from tftrain.errors import ConfigError
from tftrain.recipes.mnist import DEFAULTS, MnistHParams
from tests.conftest import REPO


def parse(argv):
    return cli.parse_config(argv, DEFAULTS, "python -m tftrain.recipes.mnist")


def test_batch_size_accepts_auto_from_flags_and_yaml(tmp_path):
    assert parse(["--batch-size", "auto"]).data.batch_size == "auto"
    assert parse(["--batch-size", "256"]).data.batch_size == 256
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {batch_size: auto}\n")
    assert from_yaml(recipe).data.batch_size == "auto"
    with pytest.raises(ConfigError, match=r"batch_size must be of type int or 'auto'. Received: batch_size='fast'"):
        DataConfig(batch_size="fast")
    with pytest.raises(ConfigError, match="invalid int or auto value"):
        parse(["--batch-size", "fast"])


def test_per_replica_batch_size_does_not_accept_auto():
    with pytest.raises(ConfigError, match="per_replica_batch_size must be of type int"):
        DataConfig(per_replica_batch_size="auto")


@pytest.mark.parametrize("text, window", [("10,15", (10, 15)), (" 0, 1", (0, 1))])
def test_profile_window_parses(text, window):
    assert TrainConfig(profile=text).profile_window == window


@pytest.mark.parametrize("text", ["5", "5,5", "6,2", "-1,3", "a,b", "1,2,3"])
def test_bad_profile_windows_name_the_form(text):
    with pytest.raises(ConfigError, match=r"Expected START,STOP .* e.g. --profile 10,15"):
        TrainConfig(profile=text)


def test_tune_and_tuner_fields():
    from tftrain.tuning.keras_tuner import ALGORITHMS

    parsed = parse(["--tune", "3", "--tuner", "hyperband"]).train
    assert (parsed.tune, parsed.tuner) == (3, "hyperband")
    with pytest.raises(ConfigError, match="tune must be >= 0"):
        TrainConfig(tune=-1)
    with pytest.raises(ConfigError, match="Invalid tuner"):
        TrainConfig(tuner="grid")
    assert set(config.TUNERS) == set(ALGORITHMS)  # every name the flag takes builds a tuner


def test_recipe_file_holds_every_new_key_with_the_defaults():
    text = (REPO / "recipes" / "mnist.yaml").read_text()
    for key in ("width:", "profile:", "tune:", "tuner:"):
        assert f"\n  {key}" in text
    assert from_yaml(REPO / "recipes" / "mnist.yaml", base=RecipeConfig(task=MnistHParams())) == DEFAULTS


def test_profile_is_ignored_when_resuming(tmp_path):
    from tftrain import rundir

    cfg = RecipeConfig(run_dir=str(tmp_path / "run"))
    run = rundir.check_run_dir(cfg.run_dir, cfg.to_dict())
    rundir.create_run_dir(run, config.to_yaml(cfg))
    profiled = cfg.override({"profile": "2,4"})
    assert rundir.check_run_dir(cfg.run_dir, profiled.to_dict()).path == run.path
