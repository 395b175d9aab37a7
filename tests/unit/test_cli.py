import re
from pathlib import Path

import pytest

from tftrain import cli
from tftrain import config as config_lib
from tftrain.config import DataConfig, RecipeConfig
from tftrain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = RecipeConfig(data=DataConfig(batch_size=128))


def parse(*argv, **kw):
    return cli.parse_config(list(argv), DEFAULTS, "prog", model_choices=("mlp", "cnn"), **kw)


def test_no_flags_gives_defaults():
    assert parse() == DEFAULTS


def test_flags_map_to_fields():
    cfg = parse("--strategy", "mirrored", "--per-replica-batch-size", "32", "--epochs", "3",
                "--no-cache", "--model", "cnn", "--seed", "1", "--cpu-replicas", "2")
    assert cfg.runtime.strategy == "mirrored" and cfg.runtime.cpu_replicas == 2
    assert cfg.data.per_replica_batch_size == 32 and cfg.data.batch_size is None
    assert cfg.data.cache is False and cfg.train.model == "cnn" and cfg.seed == 1


def test_command_line_overrides_recipe_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("runtime: {strategy: mirrored, execution: xla}\ntrain: {epochs: 7}\n")
    cfg = parse("--config", str(path), "--epochs", "2")
    assert cfg.runtime.strategy == "mirrored" and cfg.runtime.execution == "xla"
    assert cfg.train.epochs == 2


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--strategy", "mirorred"], "invalid choice: 'mirorred'"),
        (["--epochs", "x"], "invalid int value"),
        (["--epochs", "0"], "epochs must be positive"),
        (["--batch-size", "-4"], "batch_size must be positive"),
        (["--precision", "fp8"], "invalid choice"),
        (["--bogus"], "unrecognized arguments"),
        (["--batch-size", "8", "--per-replica-batch-size", "4"], "either batch_size"),
        (["--model", "resnet"], "invalid choice: 'resnet'"),
    ],
)
def test_bad_flags_raise_one_line_config_error(argv, pattern):
    with pytest.raises(ConfigError) as e:
        parse(*argv)
    assert re.search(pattern, str(e.value)) and "\n" not in str(e.value)


def test_help_lists_every_field():
    text = cli.build_parser("prog", DEFAULTS).format_help()
    for name in config_lib.flat_field_index():
        assert cli.flag_name(name) in text


def test_readme_flag_table_lists_every_flag():
    readme = (REPO / "README.md").read_text()
    for name in list(config_lib.flat_field_index()) + ["config"]:
        assert f"`{cli.flag_name(name)}" in readme, name
