import dataclasses
from pathlib import Path

import pytest
import yaml

from tftrain import config as config_lib
from tftrain.config import DataConfig, RecipeConfig, RuntimeConfig, TrainConfig
from tftrain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_valid_and_round_trip_through_yaml(tmp_path):
    cfg = RecipeConfig(seed=3, data=DataConfig(batch_size=64))
    path = tmp_path / "c.yaml"
    path.write_text(config_lib.to_yaml(cfg))
    assert config_lib.from_yaml(path) == cfg


def test_unknown_strategy_names_value_and_choices():
    with pytest.raises(ConfigError) as e:
        RuntimeConfig(strategy="mirorred")
    msg = str(e.value)
    assert "Invalid strategy 'mirorred'" in msg and "mirrored" in msg and "\n" not in msg


def test_multi_worker_alias_is_normalised():
    assert RuntimeConfig(strategy="multi_worker").strategy == "multi_worker_mirrored"


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (RuntimeConfig, "precision", "fp16"),
        (RuntimeConfig, "execution", "jit"),
        (RuntimeConfig, "device", "tpu"),
        (RuntimeConfig, "steps_per_execution", 0),
        (RuntimeConfig, "cpu_replicas", 0),
        (RuntimeConfig, "intra_op_threads", -1),
        (DataConfig, "batch_size", 0),
        (DataConfig, "per_replica_batch_size", -8),
        (DataConfig, "train_examples", 0),
        (TrainConfig, "epochs", 0),
        (TrainConfig, "learning_rate", 0.0),
        (TrainConfig, "lr_schedule", "linear"),
        (TrainConfig, "epochs", "3"),
        (TrainConfig, "epochs", True),
    ],
)
def test_bad_values_raise_config_error_naming_the_field(cls, field, value):
    with pytest.raises(ConfigError, match=field):
        cls(**{field: value})


def test_int_accepted_for_float_field():
    assert TrainConfig(learning_rate=1).learning_rate == 1.0


def test_both_batch_sizes_rejected():
    with pytest.raises(ConfigError, match="either batch_size"):
        DataConfig(batch_size=64, per_replica_batch_size=32)


def test_override_by_flat_field_names():
    cfg = RecipeConfig().override({"strategy": "mirrored", "epochs": 2, "seed": 5})
    assert (cfg.runtime.strategy, cfg.train.epochs, cfg.seed) == ("mirrored", 2, 5)


def test_override_of_one_batch_size_clears_the_other():
    cfg = RecipeConfig(data=DataConfig(batch_size=256))
    cfg = cfg.override({"per_replica_batch_size": 32})
    assert cfg.data.batch_size is None and cfg.data.per_replica_batch_size == 32


def test_override_unknown_field():
    with pytest.raises(ConfigError, match="Unknown config field 'stratgy'"):
        RecipeConfig().override({"stratgy": "mirrored"})


def test_yaml_unknown_key_names_section_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  stratgy: mirrored\n")
    with pytest.raises(ConfigError, match=r"runtime\.stratgy"):
        config_lib.from_yaml(path)


def test_yaml_invalid_syntax_names_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  strategy: [mirrored\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        config_lib.from_yaml(path)


def test_yaml_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        config_lib.from_yaml("no/such/file.yaml")


def test_yaml_top_level_must_be_mapping(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        config_lib.from_yaml(path)


def test_every_field_has_a_unique_flat_name():
    index = config_lib.flat_field_index()
    total = sum(len(dataclasses.fields(c)) for c in config_lib.SECTIONS.values()) + 5  # seed, run_dir, resume, sanity_check, deterministic
    assert len(index) == total


def test_recipe_file_lists_every_field_with_the_recipe_defaults():
    from tftrain.recipes.mnist import DEFAULTS, TASK, MnistHParams

    raw = yaml.safe_load((REPO / "recipes" / "mnist.yaml").read_text())
    for section, cls in {**config_lib.SECTIONS, "task": MnistHParams}.items():
        used = {f.name for f in dataclasses.fields(cls) if f"{section}.{f.name}" not in TASK.unused_fields}
        assert set(raw[section]) == used, section
    assert config_lib.from_yaml(REPO / "recipes" / "mnist.yaml", base=RecipeConfig(task=MnistHParams())) == DEFAULTS


@dataclasses.dataclass(frozen=True)
class _HParams:
    width: int = config_lib.hparam(8, "units", minimum=1)
    act: str = config_lib.hparam("relu", "activation", choices=("relu", "gelu"))


def test_task_hyperparameters_are_validated_and_round_trip_through_yaml(tmp_path):
    cfg = RecipeConfig(task=_HParams()).override({"width": 16, "epochs": 2})
    assert cfg.task == _HParams(width=16) and cfg.train.epochs == 2
    path = tmp_path / "c.yaml"
    path.write_text(config_lib.to_yaml(cfg))
    assert config_lib.from_yaml(path, base=RecipeConfig(task=_HParams())) == cfg
    with pytest.raises(ConfigError, match="width must be positive"):
        cfg.override({"width": 0})
    with pytest.raises(ConfigError, match=r"Invalid act 'tanh'"):
        cfg.override({"act": "tanh"})
    with pytest.raises(ConfigError, match=r"Unknown key 'task.depth'"):
        config_lib.merge(cfg, {"task": {"depth": 3}}, "r.yaml")


def test_task_section_without_task_hyperparameters_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: {width: 3}\n")
    with pytest.raises(ConfigError, match="declares no hyperparameters"):
        config_lib.from_yaml(path)


def test_task_hyperparameter_named_like_a_tftrain_field_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Clash:
        epochs: int = 3

    with pytest.raises(ConfigError, match="Task hyperparameter 'epochs' has the name of a tftrain field"):
        RecipeConfig(task=Clash())


def test_task_hyperparameter_of_a_type_no_flag_sets_is_refused_when_declared():
    from typing import Optional, Tuple

    @dataclasses.dataclass(frozen=True)
    class Widths:
        dropout: Optional[float] = None
        widths: Tuple[int, ...] = (32, 16)

    with pytest.raises(ConfigError, match=r"Task hyperparameter 'widths' is typed typing.Tuple\[int, \.\.\.\]; a "
                                          "flag sets an int, float, str or bool"):
        RecipeConfig(task=Widths())


def test_task_hyperparameters_of_a_module_run_by_runpy_are_read():
    # runpy.run_module(..., run_name="__main__") runs the module in globals that are not sys.modules["__main__"]'s,
    # where typing.get_type_hints looks for the names of string annotations.
    source = ("from __future__ import annotations\nimport dataclasses\nfrom typing import Optional\n"
              "@dataclasses.dataclass(frozen=True)\nclass HParams:\n    width: Optional[int] = 8\n")
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<task module>", "exec"), namespace)
    cfg = RecipeConfig(task=namespace["HParams"]()).override({"width": 4})
    assert cfg.task.width == 4
    with pytest.raises(ConfigError, match="width"):
        cfg.override({"width": "wide"})
    aliased = {"__name__": "__main__"}
    exec(compile(source.replace("Optional[int]", "Opt[int]").replace("import Optional", "import Optional as Opt"),
                 "<task module>", "exec"), aliased)
    with pytest.raises(ConfigError, match=r"^The annotations of HParams cannot be read \(name 'Opt' is not defined\)"):
        RecipeConfig(task=aliased["HParams"]())


def test_yaml_float_written_in_exponent_form_is_a_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train: {learning_rate: 1e-3}\n")
    assert config_lib.from_yaml(path).train.learning_rate == 0.001


def test_validation_split_must_be_a_fraction():
    assert DataConfig(validation_split=0.1).validation_split == 0.1
    with pytest.raises(ConfigError, match=r"validation_split must be in \[0, 1\)"):
        DataConfig(validation_split=1.0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cpu_replicas": 2}, "strategy 'default' would train on one of them"),
        ({"strategy": "one_device", "cpu_replicas": 2}, "strategy 'one_device' would train on one of them"),
        ({"strategy": "multi_worker", "cpu_replicas": 2}, "multi_worker_mirrored runs one replica per CPU task"),
        ({"strategy": "mirrored", "cpu_replicas": 2, "execution": "xla"}, "execution='xla' does not work with 2"),
        ({"strategy": "mirrored", "cpu_replicas": 3, "batch_size": 100},
         "Global batch size 100 does not divide evenly across 3 replicas. Pass --batch-size 99 or 102"),
    ],
)
def test_cpu_replica_mistakes_are_refused_by_the_config_before_tensorflow_starts(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        RecipeConfig().override(overrides)


def test_cpu_replicas_that_fit_are_accepted():
    config = RecipeConfig().override({"strategy": "mirrored", "cpu_replicas": 3, "batch_size": 99})
    assert config.runtime.cpu_replicas == 3 and config.data.batch_size == 99
    # --tune searches the batch size itself, so a fixed one is not checked against the replicas.
    tuned = RecipeConfig().override({"strategy": "mirrored", "cpu_replicas": 3, "batch_size": 100, "tune": 2})
    assert tuned.data.batch_size == 100
