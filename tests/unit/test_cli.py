import dataclasses
import re
from pathlib import Path

import pytest

from tftrain import cli
from tftrain import config as config_lib
from tftrain.config import DataConfig, RecipeConfig
from tftrain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class HParams:
    model: str = config_lib.hparam("mlp", "model architecture", choices=("mlp", "cnn"))
    width: int = config_lib.hparam(64, "hidden units", minimum=1)


DEFAULTS = RecipeConfig(data=DataConfig(batch_size=128), task=HParams())


def parse(*argv, **kw):
    return cli.parse_config(list(argv), DEFAULTS, "prog", **kw)


def test_no_flags_gives_defaults():
    assert parse() == DEFAULTS


def test_flags_map_to_fields():
    cfg = parse("--strategy", "mirrored", "--per-replica-batch-size", "32", "--epochs", "3",
                "--no-cache", "--model", "cnn", "--seed", "1", "--cpu-replicas", "2")
    assert cfg.runtime.strategy == "mirrored" and cfg.runtime.cpu_replicas == 2
    assert cfg.data.per_replica_batch_size == 32 and cfg.data.batch_size is None
    assert cfg.data.cache is False and cfg.task.model == "cnn" and cfg.seed == 1


def test_command_line_overrides_recipe_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("runtime: {strategy: mirrored, execution: xla}\ntrain: {epochs: 7}\n")
    cfg = parse("--config", str(path), "--epochs", "2")
    assert cfg.runtime.strategy == "mirrored" and cfg.runtime.execution == "xla"
    assert cfg.train.epochs == 2


def test_recipe_file_and_flags_are_checked_together(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("runtime: {cpu_replicas: 2}\ndata: {batch_size: 64}\ntrain:\n")
    # The file alone (strategy default, 2 CPU replicas) is refused; with the flag, the run is valid.
    with pytest.raises(ConfigError, match="strategy 'default' would train on one of them"):
        parse("--config", str(path))
    cfg = parse("--config", str(path), "--strategy", "mirrored", "--per-replica-batch-size", "16", "--epochs", "2")
    assert cfg.runtime.strategy == "mirrored" and cfg.runtime.cpu_replicas == 2 and cfg.train.epochs == 2
    assert cfg.data.per_replica_batch_size == 16 and cfg.data.batch_size is None  # the flag replaced the file's
    with pytest.raises(ConfigError, match="either batch_size"):  # both as flags still clash
        parse("--config", str(path), "--strategy", "mirrored", "--batch-size", "8", "--per-replica-batch-size", "4")
    # An unknown key is still named with the file it is in.
    path.write_text("runtime: {cpu_replicas: 2, strategie: mirrored}\n")
    with pytest.raises(ConfigError, match=r"Unknown key 'runtime.strategie' in .*r\.yaml"):
        parse("--config", str(path), "--strategy", "mirrored")


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
        (["--width", "0"], "width must be positive"),
        (["--epoch", "2"], "unrecognized arguments: --epoch 2"),  # no abbreviations
    ],
)
def test_bad_flags_raise_one_line_config_error(argv, pattern):
    with pytest.raises(ConfigError) as e:
        parse(*argv)
    assert re.search(pattern, str(e.value)) and "\n" not in str(e.value)


def test_help_lists_every_field_and_the_task_hyperparameters_once():
    text = cli.build_parser("prog", DEFAULTS).format_help()
    for name in config_lib.flat_field_index(DEFAULTS):
        assert cli.flag_name(name) in text
    assert "task hyperparameters" in text and "--width N" in text
    assert "(default: 64)" in text and "(default: None) (default" not in text


def test_task_hyperparameters_come_from_flags_and_the_task_section(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("task: {model: cnn, width: 16}\ntrain: {learning_rate: 1e-3}\n")
    cfg = parse("--config", str(path), "--width", "32")
    assert cfg.task == HParams(model="cnn", width=32) and cfg.train.learning_rate == 0.001


def test_user_guide_flag_table_lists_every_flag():
    """docs/user-guide.md holds the flags table: every flag of tftrain's own and MNIST's task flags."""
    from tftrain.recipes import mnist

    guide = (REPO / "docs" / "user-guide.md").read_text()
    names = list(config_lib.flat_field_index(mnist.DEFAULTS)) + ["config"]
    assert {"model", "width"} <= set(names)
    for name in names:
        assert f"| `{cli.flag_name(name)}" in guide, name


@pytest.mark.parametrize("typed, suggested", [("--learning-rat", "--learning-rate"), ("--lr", "--learning-rate"),
                                              ("--stratgy", "--strategy"), ("--epoch=3", "--epochs")])
def test_a_misspelled_flag_gets_the_closest_one_in_one_line(typed, suggested):
    with pytest.raises(ConfigError) as refused:
        cli.parse_config([typed, *([] if "=" in typed else ["1"])], RecipeConfig(), "prog")
    line = str(refused.value)
    assert "\n" not in line and f"{typed.split('=')[0]}: did you mean {suggested}" in line, line


def test_a_flag_near_none_gets_no_suggestion():
    with pytest.raises(ConfigError) as refused:
        cli.parse_config(["--zzzzzz", "1"], RecipeConfig(), "prog")
    assert "did you mean" not in str(refused.value)


@pytest.mark.slow
def test_the_command_line_prints_a_python_warning_as_one_line_without_its_source(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, SUBPROCESS_ENV

    done = subprocess.run([sys.executable, "-m", "tftrain.run", "examples/regression.py:task", "--sanity-check",
                           "--precision", "mixed_float16", "--train-examples", "256"], cwd=REPO,
                          env={**os.environ, **SUBPROCESS_ENV, "TFTRAIN_CACHE_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "mixed_float16 on a CPU-only run" in line]
    assert lines and all(line.startswith("warning: ") for line in lines), done.stderr[-3000:]
    assert "UserWarning" not in done.stderr and "set_precision(" not in done.stderr, done.stderr[-3000:]
