"""`--nvtx`: the environment variable, the no-GPU line, and the named NVTX step ranges."""

import types

import keras
import numpy as np
import pytest

from tftrain.callbacks.nvtx import NvtxSteps
from tftrain.config import RecipeConfig
from tftrain.errors import ConfigError
from tftrain.runtime import nvtx as nvtx_lib
from tftrain.runtime.nvtx import NVTX_ENV, NvtxSettings, enable_nvtx_ranges, settle_nvtx


def test_nvtx_is_a_runtime_flag_off_by_default():
    from tftrain import cli

    assert RecipeConfig().runtime.nvtx is False
    assert cli.parse_config(["--nvtx"], RecipeConfig(), "prog").runtime.nvtx is True
    assert cli.parse_config(["--no-nvtx"], RecipeConfig(), "prog").runtime.nvtx is False


def test_without_a_gpu_it_has_nothing_to_do_and_undoes_the_variable():
    env = {}
    assert enable_nvtx_ranges(env) is True and env == {NVTX_ENV: "1"}
    settings = settle_nvtx(True, "cpu", env)
    assert not settings.active and env == {}
    assert settings.describe() == ("nvtx:      no GPU in use (NVTX ranges are for Nsight Systems on a GPU); "
                                   "--nvtx has nothing to do")


def test_a_value_set_by_the_user_is_kept():
    env = {NVTX_ENV: "0"}
    assert enable_nvtx_ranges(env) is False and env == {NVTX_ENV: "0"}
    assert not settle_nvtx(False, "cpu", env).active and env == {NVTX_ENV: "0"}
    on_gpu = settle_nvtx(False, "gpu", env)
    assert on_gpu.active and "(already set)" in on_gpu.describe() and env == {NVTX_ENV: "0"}


def test_on_a_gpu_the_variable_stays_and_steps_are_named():
    env = {}
    settings = settle_nvtx(enable_nvtx_ranges(env), "gpu", env)
    assert settings.active and env == {NVTX_ENV: "1"}
    assert "TF_ENABLE_NVTX_RANGES=1 (set by --nvtx)" in settings.describe()
    assert "domain 'tftrain'" in settings.describe()


def test_on_a_gpu_without_the_nvtx_package_it_names_the_install(monkeypatch):
    monkeypatch.setattr(nvtx_lib, "NVTX_PACKAGE", "tftrain_test_no_such_package")
    with pytest.raises(ConfigError, match="pip install nvtx"):
        settle_nvtx(True, "gpu", {})


def test_trainer_adds_nvtx_steps_only_when_active():
    from tftrain.train.trainer import Trainer

    def callbacks(nvtx):
        return Trainer._nvtx_callbacks(types.SimpleNamespace(runtime=types.SimpleNamespace(nvtx=nvtx)))

    assert callbacks(None) == [] and callbacks(NvtxSettings(False, reason="no GPU")) == []
    (steps,) = callbacks(NvtxSettings(True))
    assert isinstance(steps, NvtxSteps)


class RecordingNvtx:
    """Forwards to NVIDIA's nvtx package and records the calls."""

    def __init__(self):
        import nvtx

        self.nvtx, self.calls = nvtx, []

    def push_range(self, message, domain=None):
        self.calls.append(("push", message, domain))
        self.nvtx.push_range(message, domain=domain)

    def pop_range(self, domain=None):
        self.calls.append(("pop", domain))
        self.nvtx.pop_range(domain=domain)


@pytest.mark.parametrize("spe, names", [(1, ["train 0", "train 1", "train 2", "train 3"]),
                                        (2, ["train(2 steps) 0", "train(2 steps) 2", "train(2 steps) 4",
                                             "train(2 steps) 6"])])
def test_nvtx_steps_names_each_execution(spe, names):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", steps_per_execution=spe)
    steps = NvtxSteps()
    steps._nvtx = recorder = RecordingNvtx()
    x, y = np.ones((8 * spe, 4), "float32"), np.ones((8 * spe, 2), "float32")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[steps])  # 2 executions/epoch
    pushes = [call[1] for call in recorder.calls if call[0] == "push"]
    assert pushes == names  # counted across epochs
    assert recorder.calls[::2] == [("push", name, "tftrain") for name in names]
    assert recorder.calls[1::2] == [("pop", "tftrain")] * len(names)  # each range closed before the next opens


def test_nvtx_steps_without_the_package_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx raises ImportError
    with pytest.raises(ConfigError, match="pip install nvtx"):
        NvtxSteps()


def test_nvtx_may_differ_when_resuming(tmp_path):
    from tftrain import config, rundir

    cfg = RecipeConfig(run_dir=str(tmp_path / "run"))
    run = rundir.check_run_dir(cfg.run_dir, cfg.to_dict())
    rundir.create_run_dir(run, config.to_yaml(cfg))
    assert rundir.check_run_dir(cfg.run_dir, cfg.override({"nvtx": True}).to_dict()).path == run.path
    with pytest.raises(ConfigError):  # a field that must not differ still refuses: the check is live
        rundir.check_run_dir(cfg.run_dir, cfg.override({"epochs": 3}).to_dict())
