"""`python -m tftrain.doctor`: its report at --quick size, its bad-input exits, and each rule on made-up machines.

One `--quick --json` run in a subprocess (module fixture) with `CUDA_VISIBLE_DEVICES=-1`,
so the GPU section reads "none found" with the same reason on every machine, GPU or
not. Everything else is in-process: the pure facts (cpuinfo, cgroups, nvidia-smi),
the rules (advice, why no GPU) on made-up reports, and small measurements.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.conftest import REPO, run_module, run_python
from tftrain import host as machine
from tftrain.doctor import advice
from tftrain.doctor.__main__ import main
from tftrain.doctor.allreduce import fit_ring
from tftrain.doctor.gpus import why_no_gpu
from tftrain.doctor.measure import disk_read, memory_bandwidth
from tftrain.doctor.report import render


@pytest.fixture(scope="module")
def quick_report():
    """The JSON report of one `python -m tftrain.doctor --quick --json` run, with the GPUs hidden."""
    done = run_module("tftrain.doctor", ["--quick", "--json"], cwd=REPO, env={"CUDA_VISIBLE_DEVICES": "-1"},
                      timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# -- the command at --quick size -------------------------------------------------
@pytest.mark.slow
def test_json_has_every_section_and_positive_measured_figures(quick_report):
    r = quick_report
    assert {"system", "cpu", "gpu", "tasks", "advice", "warnings", "errors"} <= set(r)
    assert r["errors"] == [], r["errors"]
    measured = r["cpu"]["measured"]
    assert measured["matmul"]["float32"]["best_flops"] > 0
    assert measured["memory_bandwidth"]["bytes_per_s"] > 0
    assert measured["disk_read"]["bytes_per_s"] > 0 and measured["disk_read"]["bytes"] > 0
    ring = measured["loopback_allreduce"]
    assert ring["workers"] == 2 and ring["bytes_per_s"] > 0 and ring["rows"][0]["median_s"] > 0
    assert r["cpu"]["usable_cores"] >= 1 and r["cpu"]["memory_bytes"] > 0
    threads = measured["threads"]  # one child process per candidate, TensorFlow's defaults among them
    assert set(threads["rates"]) >= {"0,0"} and threads["failed"] == {}
    assert all(rate > 0 for figures in threads["rates"].values() for rate in figures.values())
    assert threads["remembered"] is False  # --quick figures are never remembered


@pytest.mark.slow
def test_tasks_carry_tftrain_flops_and_predictions_from_the_measured_peak(quick_report):
    from tftrain.flops import count_training_flops
    from tftrain.recipes.mnist import cnn, mlp

    tasks = {t["name"]: t for t in quick_report["tasks"]}
    assert set(tasks) == {"mnist mlp", "mnist cnn"}
    assert tasks["mnist mlp"]["training_flops_per_example"] == count_training_flops(mlp()).training
    assert tasks["mnist cnn"]["training_flops_per_example"] == count_training_flops(cnn()).training
    peak = quick_report["cpu"]["measured"]["matmul"]["float32"]["best_flops"]
    for task in tasks.values():
        predicted = task["predicted_examples_per_sec"]["CPU float32"]
        assert predicted == pytest.approx(peak / task["training_flops_per_example"])


@pytest.mark.slow
def test_gpu_section_says_none_found_and_why(quick_report):
    gpu = quick_report["gpu"]
    assert gpu["count"] == 0 and gpu["gpus"] == []
    assert "CUDA_VISIBLE_DEVICES='-1' hides every GPU" in gpu["why_none"][0]
    assert gpu["build"]["version"]
    text = render(quick_report)
    assert "none found" in text and "CUDA_VISIBLE_DEVICES='-1'" in text


@pytest.mark.slow
def test_advice_names_the_cpu_and_warns_about_mixed_float16_on_it(quick_report):
    topics = {item["topic"]: item for item in quick_report["advice"]}
    assert topics["device"]["device"] == "cpu"
    assert topics["strategy"]["strategy"] == "default"
    assert topics["precision"]["precision"] in ("float32", "mixed_bfloat16")
    assert all(item["source"] for item in quick_report["advice"] + quick_report["warnings"])
    float16 = [w for w in quick_report["warnings"] if "mixed_float16" in w["say"]]
    assert float16 and "CPU" in float16[0]["say"]
    text = render(quick_report)
    assert "Advice" in text and "Do not use --precision mixed_float16 on the CPU" in text


# -- bad input -------------------------------------------------------------------
def test_unknown_task_exits_2_with_one_line():
    done = run_module("tftrain.doctor", ["no_such_file.py:task"], cwd=REPO, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m tftrain.doctor: error: Task file")
    assert done.stdout == ""


def test_missing_data_dir_and_unknown_flag_exit_2_with_one_line(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path / "missing")]) == 2
    assert main(["--jsn"]) == 2  # no abbreviations, no typos
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert "does not exist" in lines[0] and "unrecognized arguments: --jsn" in lines[1]


def test_user_task_file_is_counted():
    from tftrain.doctor.tasks import build_models, load_tasks, task_figures
    from tftrain.flops import count_training_flops

    loaded, data_dir = load_tasks("examples/regression.py:task")
    (name, model, batch), = build_models(loaded)
    figures = task_figures(name, model, batch)
    assert figures["training_flops_per_example"] == count_training_flops(model).training > 0
    assert figures["gradient_bytes"] == 4 * figures["parameters"] and figures["input_bytes_per_example"] == 8 * 4
    assert data_dir is None


def test_a_model_that_fails_to_build_exits_2_and_one_without_fixed_shapes_gets_no_prediction(tmp_path, capsys):
    import keras

    from tftrain.doctor.tasks import task_figures

    task_file = tmp_path / "broken.py"
    task_file.write_text("import tftrain\n\nclass Broken(tftrain.Task):\n    def build_model(self):\n"
                         "        raise ValueError('boom')\n\ntask = Broken()\n")
    assert main([f"{task_file}:task"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Could not build the model of task 'task': ValueError: boom" in lines[0]
    inputs = keras.Input((None, 4))
    figures = task_figures("ragged", keras.Model(inputs, keras.layers.Dense(2)(inputs)), 32)
    assert figures["training_flops_per_example"] is None and "unknown dimensions" in figures["note"]
    assert figures["input_bytes_per_example"] is None
    assert advice.predict(figures["training_flops_per_example"], {"CPU float32": 1e9}) == {}


# -- facts of this machine -------------------------------------------------------
def test_cpu_flags_features_and_sockets_from_a_cpuinfo_file(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpu = "model name\t: Test CPU\nphysical id\t: {sock}\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_tile\n\n"
    cpuinfo.write_text(cpu.format(sock=0) + cpu.format(sock=1))
    flags, source = machine.cpu_flags(str(cpuinfo))
    assert source == str(cpuinfo) and "avx512_bf16" in flags
    found = machine.features(flags)
    assert found["AVX2"] and found["AVX512-BF16"] and not found["AMX-BF16"]  # amx_bf16 missing
    facts = machine.cpu_facts(str(cpuinfo), cgroup_root=str(tmp_path))
    assert facts["model"] == "Test CPU" and facts["sockets"] == 2 and facts["native_bf16"]


def test_native_bf16_agrees_with_the_runtime_rule():
    from tftrain.runtime.precision import cpu_has_native_bf16

    assert machine.cpu_facts()["native_bf16"] == cpu_has_native_bf16()


def test_cgroup_quota_v2_v1_and_unlimited(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert machine.cgroup_cpu_quota(str(tmp_path)) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert machine.cgroup_cpu_quota(str(tmp_path)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert machine.cgroup_cpu_quota(str(v1)) == 3.0
    (tmp_path / "memory.max").write_text("1073741824\n")
    assert machine.cgroup_memory_limit(str(tmp_path)) == 2**30


def test_nvidia_hardware_from_nvidia_smi_and_its_absence(tmp_path):
    def run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 0, stdout="NVIDIA H100 80GB HBM3, 81559, 550.54.15\n", stderr="")

    found = machine.nvidia_hardware(which=lambda name: "/usr/bin/nvidia-smi", proc_path=str(tmp_path / "none"),
                                    dev_glob_root=str(tmp_path), run=run)
    assert found["present"] and found["gpus"] == [
        {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 2**20, "driver": "550.54.15"}]
    absent = machine.nvidia_hardware(which=lambda name: None, proc_path=str(tmp_path / "none"),
                                     dev_glob_root=str(tmp_path))
    assert not absent["present"] and absent["gpus"] == []


# -- why TensorFlow sees no GPU ----------------------------------------------------
CUDA_BUILD = {"version": "2.21.0", "is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
GPU_PRESENT = {"present": True, "driver": None, "gpus": [{"name": "T4", "memory_bytes": 1, "driver": "535.1"}]}


@pytest.mark.parametrize("build, env, hardware, platform, expected", [
    (CUDA_BUILD, {}, {"present": False}, "linux", "No NVIDIA GPU or driver found"),
    ({**CUDA_BUILD, "is_cuda_build": False}, {}, GPU_PRESENT, "linux", "CPU-only build"),
    (CUDA_BUILD, {"CUDA_VISIBLE_DEVICES": ""}, GPU_PRESENT, "linux", "CUDA_VISIBLE_DEVICES='' hides every GPU"),
    (CUDA_BUILD, {}, GPU_PRESENT, "linux", "could not load CUDA"),
    (CUDA_BUILD, {}, {"present": False}, "darwin", "tensorflow-metal"),
], ids=["no-hardware", "cpu-wheel", "hidden", "libraries", "macos"])
def test_why_no_gpu_names_the_cause(build, env, hardware, platform, expected):
    reasons = why_no_gpu(build, env, hardware, platform)
    assert expected in reasons[0]


def test_why_no_gpu_with_visible_ids_blames_the_libraries_with_the_driver():
    reasons = why_no_gpu(CUDA_BUILD, {"CUDA_VISIBLE_DEVICES": "0"}, GPU_PRESENT, "linux")
    assert len(reasons) == 1 and "driver: 535.1" in reasons[0] and "CUDA 12.5.1" in reasons[0]


# -- the rules on made-up machines -------------------------------------------------
def _report(gpus=(), native_bf16=False, f32=100e9, bf16=None, logical=2, physical=2, usable=2, quota=None,
            sockets=1, allreduce=None, ring=None, disk_rate=1e9):
    matmul = {"float32": {"best_flops": f32, "by_size": {512: [f32]}}}
    if bf16:
        matmul["bfloat16"] = {"best_flops": bf16, "by_size": {512: [bf16]}}
    report = {
        "system": {"load_average_before": [0.0, 0.0, 0.0]},
        "cpu": {"usable_cores": usable, "logical_cores": logical, "physical_cores": physical, "cpu_quota": quota,
                "sockets": sockets, "native_bf16": native_bf16, "memory_bytes": 16e9,
                "features": {"AVX512-BF16": native_bf16, "AMX-BF16": False, "AVX512-FP16": False},
                "measured": {"matmul": matmul, "loopback_allreduce": ring,
                             "disk_read": {"bytes_per_s": disk_rate, "folder_bytes": 10e6}}},
        "gpu": {"gpus": list(gpus), "why_none": [] if gpus else ["No NVIDIA GPU or driver found."],
                "hardware": {"present": bool(gpus)}, "allreduce": allreduce},
        "errors": [],
        "tasks": [],
    }
    peaks = advice.peaks(report)
    report["tasks"] = [{"name": "mlp", "batch_size": 512, "training_flops_per_example": 3_209_216,
                        "gradient_bytes": 2_678_824, "input_bytes_per_example": 3136,
                        "predicted_examples_per_sec": advice.predict(3_209_216, peaks)}]
    return report


def _gpu(i, cap, f32=50e12, f16=400e12):
    return {"device": f"/GPU:{i}", "name": "GPU", "compute_capability": cap,
            "measured": {"matmul": {"float32": {"best_flops": f32}, "float16": {"best_flops": f16}}}}


def _topics(report):
    out = advice.advise(report)
    return {item["topic"]: item for item in out["advice"]}, out["warnings"]


def test_two_modern_gpus_get_gpu_mixed_float16_and_mirrored():
    report = _report(gpus=[_gpu(0, (8, 0)), _gpu(1, (8, 0))], allreduce={"bus_bytes_per_s": 150e9})
    topics, warnings = _topics(report)
    assert topics["device"]["device"] == "gpu" and "4000x the CPU's float32" in topics["device"]["why"]
    assert topics["precision"]["precision"] == "mixed_float16" and "8.0 >= 7.0" in topics["precision"]["why"]
    assert topics["strategy"]["strategy"] == "mirrored" and "150.0 GB/s" in topics["strategy"]["why"]
    assert not [w for w in warnings if "mixed_float16" in w["say"]]
    assert report["tasks"][0]["predicted_examples_per_sec"]["/GPU:0 float16"] == pytest.approx(400e12 / 3_209_216)


def test_an_old_gpu_gets_float32_and_a_mixed_float16_warning():
    topics, warnings = _topics(_report(gpus=[_gpu(0, (6, 1), f16=10e12, f32=10e12)]))
    assert topics["precision"]["precision"] == "float32" and topics["strategy"]["strategy"] == "default"
    assert any("mixed_float16" in w["say"] and "6.1 < 7.0" in w["why"] for w in warnings)


def test_cpu_bfloat16_follows_the_flags_and_the_measured_ratio():
    without, warnings = _topics(_report(native_bf16=False))
    assert without["precision"]["precision"] == "float32"
    assert any("mixed_bfloat16" in w["say"] for w in warnings)
    fast, _ = _topics(_report(native_bf16=True, bf16=250e9))
    assert fast["precision"]["precision"] == "mixed_bfloat16" and "2.50x" in fast["precision"]["why"]
    slow, _ = _topics(_report(native_bf16=True, bf16=90e9))
    assert slow["precision"]["precision"] == "float32" and "0.90x" in slow["precision"]["why"]


def test_threads_follow_physical_cores_quota_and_sockets():
    smt, _ = _topics(_report(logical=16, physical=8, usable=16, sockets=2))
    assert smt["threads"]["flags"] == "--intra-op-threads 8 --inter-op-threads 2"
    quota, _ = _topics(_report(logical=8, physical=8, usable=8, quota=2.5))
    assert quota["threads"]["flags"] == "--intra-op-threads 2"
    plain, _ = _topics(_report())
    assert plain["threads"]["flags"] == ""


def test_measured_threads_replace_the_rule():
    report = _report(logical=16, physical=8, usable=16)
    rates = {"0,0": {"mlp": 100.0, "cnn": 50.0}, "16,1": {"mlp": 130.0, "cnn": 60.0}}
    report["cpu"]["measured"]["threads"] = {"intra_op": 16, "inter_op": 1, "speedup": 1.25, "rates": rates,
                                            "remembered": True}
    measured, _ = _topics(report)
    assert "1.25x" in measured["threads"]["say"] and "Remembered" in measured["threads"]["say"]
    assert measured["threads"]["flags"] == ""  # applied by --threads auto: nothing to pass
    assert "16,1: mlp 130, cnn 60" in measured["threads"]["why"]
    report["cpu"]["measured"]["threads"].update(intra_op=0, inter_op=0, speedup=1.0)
    kept, _ = _topics(report)
    assert "Keep TensorFlow's thread defaults" in kept["threads"]["say"]


def test_multi_worker_cost_comes_from_the_measured_ring():
    ring = {"bytes_per_s": 100e6, "fixed_s": 0.002}
    topics, _ = _topics(_report(ring=ring))
    # 2 workers: 2 ms + 2,678,824 bytes / 100 MB/s = 28.8 ms; compute >= 512 x 3,209,216 / 100 GFLOP/s = 16.4 ms.
    assert "about 28.8 ms" in topics["strategy"]["why"] and "at least 16.4 ms" in topics["strategy"]["why"]
    # Timed at the model's own size, the measured median is the figure (the CPU section's row shows the same).
    ring["rows"] = [{"bytes": 2_678_824, "median_s": 0.007}]
    topics, _ = _topics(_report(ring=ring))
    assert "about 7.0 ms" in topics["strategy"]["why"]


def test_input_advice_compares_the_disk_with_the_upper_bound():
    # Upper bound 100e9 / 3,209,216 = 31,160 examples/sec x 3,136 bytes = 98 MB/s.
    slow, _ = _topics(_report(disk_rate=50e6))
    assert "cannot feed" in slow["input"]["say"] and "98 MB/s" in slow["input"]["why"]
    fast, _ = _topics(_report(disk_rate=1e9))
    assert "can feed" in fast["input"]["say"]


def test_a_busy_machine_and_a_failed_measurement_are_warned_about():
    report = _report()
    report["system"]["load_average_before"] = [3.0, 2.0, 1.0]
    report["errors"] = [{"what": "Disk read", "error": "OSError: boom"}]
    says = [w["say"] for w in advice.advise(report)["warnings"]]
    assert any("Other processes were using the CPU" in s for s in says)
    assert "Disk read could not be measured." in says


# -- measurements ------------------------------------------------------------------
def test_disk_read_reads_the_folder_largest_first_up_to_the_limit(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * 300_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "small.bin").write_bytes(b"y" * 50_000)
    result = disk_read(tmp_path, max_bytes=320_000, repeats=2, chunk_bytes=65_536)
    assert result["bytes"] == 320_000 and result["files"] == 2 and result["folder_bytes"] == 350_000
    assert result["bytes_per_s"] > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert disk_read(empty, 1000)["bytes_per_s"] is None


def test_memory_bandwidth_uses_the_threads_asked_for():
    result = memory_bandwidth(4 << 20, repeats=2, threads=2)
    assert result["threads"] == 2 and result["array_bytes"] == 4 << 20 and result["bytes_per_s"] > 0


def test_fit_ring_recovers_fixed_cost_and_bandwidth():
    rows = [{"bytes": b, "median_s": 0.001 + b / 1e8} for b in (1_000_000, 4_000_000, 16_000_000)]
    fit = fit_ring(rows, workers=2)  # 2 workers: bytes sent = bytes
    assert fit["fixed_s"] == pytest.approx(0.001) and fit["bytes_per_s"] == pytest.approx(1e8)
    one = fit_ring(rows[:1], workers=4)  # sent = 1.5 x bytes
    assert one["fixed_s"] is None and one["bytes_per_s"] == pytest.approx(1.5e6 / 0.011)


@pytest.mark.slow
def test_device_copy_and_all_reduce_code_runs_on_logical_cpus():
    """The GPU measurements' code paths, on two logical CPU devices (no GPU needed; figures not checked)."""
    code = (
        "import json, tensorflow as tf\n"
        "from tftrain.runtime.devices import split_cpu\n"
        "split_cpu(2)\n"
        "from tftrain.doctor.measure import gpu_allreduce, gpu_copies, matmul_peak\n"
        "print(json.dumps({'copies': gpu_copies('/CPU:1', 1 << 16, 2),\n"
        "                  'allreduce': gpu_allreduce(['/CPU:0', '/CPU:1'], 1 << 16, 2),\n"
        "                  'matmul': matmul_peak((64,), 2, 'float32', '/CPU:1')['best_flops']}))\n"
    )
    done = run_python(code, cwd=REPO, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["copies"]["bytes"] == 1 << 16 and result["copies"]["h2d_bytes_per_s"] > 0
    assert result["allreduce"]["gpus"] == 2 and result["allreduce"]["bus_bytes_per_s"] > 0
    assert result["matmul"] > 0


def test_the_figures_of_a_subclassed_model_without_weights_say_why_they_are_missing():
    import keras

    from tftrain.doctor.tasks import task_figures

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    figures = task_figures("sub", Sub(), 32)
    assert figures["input_bytes_per_example"] is None and figures["parameters"] == 0
    assert figures["note"].startswith("The model has no weights before it sees data (a subclassed model)")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_the_all_reduce_launcher_took_is_given_back_to_the_doctor(monkeypatch, signum):
    from tftrain import launch
    from tftrain.doctor import allreduce
    from tftrain.errors import Terminated

    monkeypatch.setattr(launch, "launch", lambda *args, **kwargs: 128 + signum)  # it stopped its workers

    def stop(*args):
        raise Terminated()

    previous = signal.signal(signum, stop)
    try:
        with pytest.raises(Terminated):
            allreduce.loopback_allreduce(sizes=(1024,))
    finally:
        signal.signal(signum, previous)
