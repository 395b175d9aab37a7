"""The SLURM and Kubernetes examples under recipes/ run commands the recipe accepts."""

from __future__ import annotations

import shlex

import pytest
import yaml

from tftrain import cli
from tftrain.recipes import mnist
from tests.conftest import REPO

PREFIX = ["python", "-m", "tftrain.recipes.mnist"]


def _parse(argv):
    return cli.parse_config(argv, mnist.DEFAULTS, "python -m tftrain.recipes.mnist")


@pytest.mark.parametrize(
    "name, strategy, replicas",
    [
        ("tfjob-mnist-multi-worker.yaml", "multi_worker_mirrored", {"Worker": 2}),
        ("tfjob-mnist-parameter-server.yaml", "parameter_server", {"Chief": 1, "Worker": 2, "PS": 1}),
    ],
)
def test_tfjob_examples(name, strategy, replicas):
    job = yaml.safe_load((REPO / "recipes" / "k8s" / name).read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == replicas
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"
        assert container["command"][:3] == PREFIX
        cfg = _parse(container["command"][3:])
        assert cfg.runtime.strategy == strategy and cfg.run_dir.startswith("/runs/")


@pytest.mark.parametrize(
    "name, strategy", [("mnist_multi_worker.sbatch", "multi_worker_mirrored"), ("mnist_parameter_server.sbatch", "parameter_server")]
)
def test_sbatch_examples(name, strategy):
    text = (REPO / "recipes" / "slurm" / name).read_text()
    command = shlex.split(text[text.index("\nsrun ") + 1:].replace("\\\n", " ").split("\n")[0])  # srun's line
    # A synchronous job stops with any task; a parameter-server job outlives a worker.
    assert command[0] == "srun" and f"--kill-on-bad-exit={int(strategy != 'parameter_server')}" in command
    assert not any(arg.startswith("--wait") for arg in command)  # it would stop the job after a lost worker
    start = command.index("python")
    assert command[start:start + 3] == PREFIX
    assert command[-1] == "$TFTRAIN_ARGS"  # extra recipe flags, e.g. a smoke size
    cfg = _parse([*command[start + 3:-1], "--epochs", "1", "--train-examples", "512"])
    assert cfg.runtime.strategy == strategy and cfg.train.epochs == 1 and cfg.data.train_examples == 512
