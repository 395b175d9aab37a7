"""The benchmark suite's machinery, at `--quick` sizes: files, tables and sane values.

One run of `python -m benchmarks --quick --jobs 2` (every CPU benchmark, each in its own
process, two at a time) is shared by the tests below; they check what it wrote, never speeds.
A second, shorter run checks that the GPU suite says clearly when there is no GPU.
"""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, SUBPROCESS_ENV, with_dev_extras

pytestmark = pytest.mark.integration

CPU_SUITE = ("recipe_defaults", "flagship", "time_to_accuracy", "roofline", "execution", "zoo", "input_pipeline", "threads", "precision")


def _run(args, timeout):
    import os

    # matplotlib draws the plots; the benchmarks' own processes still start without pandas, scikit-learn
    # and SciPy, which Keras would import in each (about 1.5 s a process).
    env = with_dev_extras({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, "matplotlib")
    env.update(SUBPROCESS_ENV)
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quick_suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = _run(["--quick", "--jobs", "2", "--out", str(out)], timeout=900)
    return proc, out


def _load(out, name):
    return json.loads((out / f"{name}.json").read_text())


def test_quick_suite_runs_every_benchmark(quick_suite):
    proc, out = quick_suite
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in CPU_SUITE:
        for ext in ("json", "md", "png"):
            path = out / f"{name}.{ext}"
            assert path.is_file() and path.stat().st_size > 0, path
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        result = _load(out, name)
        assert result["quick"] is True and result["benchmark"] == name
        assert result["table"]["rows"], name
        assert len(result["table"]["rows"][0]) == len(result["table"]["headers"])
        md = (out / f"{name}.md").read_text()
        assert md.startswith("## ") and "| --- |" not in md and "|---|" in md
        assert f"## {result['title']}" in proc.stdout  # each table is printed too
    summary = (out / "summary.md").read_text()
    assert "## Targets" in summary and all(f"=== {n}: ok" in proc.stdout for n in CPU_SUITE)
    # Quick figures never claim a target: every verdict reads n/a.
    verdicts = [line.rsplit("|", 2)[1].strip() for line in summary.split("## Runs")[0].splitlines()
                if line.startswith("| ") and "figure" not in line]
    assert verdicts and all(v in ("", "n/a (quick)") for v in verdicts), verdicts
    assert json.loads((out / "summary.json").read_text())["runs"]["roofline"]["status"] == "ok"


def test_time_to_accuracy_records_every_contender(quick_suite):
    _, out = quick_suite
    result = _load(out, "time_to_accuracy")
    records = result["data"]["records"]
    assert sorted(r["contender"] for r in records) == ["keras", "keras_recipe", "tftrain"]
    assert {r["seed"] for r in records} == {2}  # a seed never used to choose the recipe's defaults
    for r in records:
        assert "error" not in r, r
        assert 1 <= len(r["epochs"]) <= r["max_epochs"]
        assert all(e["train_time_s"] > 0 for e in r["epochs"])
        times = [e["train_time_s"] for e in r["epochs"]]
        assert times == sorted(times)
        # Both contenders learn to the quick target, and training stops at the first epoch that reaches it.
        accuracies = [e["test_accuracy"] for e in r["epochs"]]
        assert r["reached_at"] == r["epochs"][-1] and accuracies[-1] >= r["target"], (r["contender"], accuracies)
        assert all(a < r["target"] for a in accuracies[:-1]), (r["contender"], accuracies)
    tftrain = next(r for r in records if r["contender"] == "tftrain")
    assert tftrain["settings"]["execution"] in ("graph", "xla")  # resolved by --execution auto
    keras = next(r for r in records if r["contender"] == "keras")
    assert keras["settings"]["batch_size"] == 64
    recipe = next(r for r in records if r["contender"] == "keras_recipe")  # plain Keras, the recipe's hparams
    from benchmarks.common import default_batch_size

    assert recipe["settings"]["batch_size"] == tftrain["settings"]["batch_size"] == default_batch_size("mlp")


def test_recipe_defaults_are_chosen_on_validation_accuracy(quick_suite):
    _, out = quick_suite
    result = _load(out, "recipe_defaults")
    records = result["data"]["records"]
    assert {r["batch_size"] for r in records} == {256, 512} and {r["seed"] for r in records} == {0}
    assert all(0.5 < r["val_accuracy"] <= 1 for r in records), records  # one epoch on 2,048 images learns
    best = max(records, key=lambda r: r["val_accuracy"])
    chosen = result["summary"]["chosen"]
    assert abs(chosen["mean_val_accuracy"] - best["val_accuracy"]) <= 0.0005  # the best, or a faster tie


def test_roofline_figures_are_consistent(quick_suite):
    _, out = quick_suite
    result = _load(out, "roofline")
    assert result["summary"]["peak_gflops"] > 0
    assert result["summary"]["training_flops_per_example"] == {"mlp": 3_209_216, "cnn": 14_256_384}
    points = result["data"]["points"]
    from tftrain.runtime.execution import KEEP_FIRST_WITHIN

    for p in points:
        rates = p["examples_per_sec"]
        assert min(rates.values()) > 0 and p["fraction_of_peak"] > 0
        fastest = max(rates, key=rates.get)  # the faster mode, or graph kept within the timing noise
        kept = p["best_mode"] == "graph" and rates["graph"] * (1 + KEEP_FIRST_WITHIN) >= rates[fastest]
        assert p["best_mode"] == fastest or kept, p
    for model, best in result["summary"]["best"].items():
        mine = [p for p in points if p["model"] == model]
        top = max(mine, key=lambda p: p["fraction_of_peak"])
        assert (best["batch_size"], best["mode"]) == (top["batch_size"], top["best_mode"])  # the best row is named
        # Against one peak, a larger fraction means more examples/sec (same FLOPs per example).
        same_peak = [p for p in mine if p.get("policy", "float32") == "float32"]
        by_fraction = sorted(same_peak, key=lambda p: p["fraction_of_peak"])
        assert by_fraction == sorted(same_peak, key=lambda p: max(p["examples_per_sec"].values()))


def test_execution_input_threads_and_precision_values(quick_suite):
    _, out = quick_suite
    execution = _load(out, "execution")["data"]["points"]
    assert {(p["model"], p["execution"]) for p in execution} >= {("mlp", "eager"), ("mlp", "xla"), ("cnn", "graph")}
    assert all(p["examples_per_sec"] > 0 and p["step_time_s"] > 0 for p in execution)
    summary = _load(out, "execution")["summary"]
    for model in {p["model"] for p in execution}:
        mine = [p for p in execution if p["model"] == model]
        fastest = max(mine, key=lambda p: p["examples_per_sec"])
        best = summary["best"][model]
        assert (best["execution"], best["steps_per_execution"]) == (fastest["execution"], fastest["steps_per_execution"])
        # The speed-ups rank the configurations as their step times do, fastest highest.
        assert sorted(mine, key=lambda p: p["speedup_vs_graph_1"]) == sorted(mine, key=lambda p: -p["step_time_s"])

    pipeline = _load(out, "input_pipeline")
    for p in pipeline["data"]["points"]:
        assert 0.0 <= p["input_wait_fraction"] < 1.0
        assert p["pipeline_examples_per_sec"] > 0 and p["training_examples_per_sec"] > 0
    assert set(pipeline["summary"]["input_wait_fraction_recipe_defaults"]) == {"mlp", "cnn"}

    threads = _load(out, "threads")
    assert threads["summary"]["failed_points"] == 0
    points = {(p["intra_op"], p["inter_op"]) for p in threads["data"]["points"]}
    assert points == {(0, 0), (1, 1)}
    assert all(v > 0 for p in threads["data"]["points"] for v in p["examples_per_sec"].values())

    precision = _load(out, "precision")
    policies = {p["policy"] for p in precision["data"]["points"]}
    assert policies == {"float32", "mixed_bfloat16", "mixed_float16"}
    assert all(p["examples_per_sec"] > 0 for p in precision["data"]["points"])


def test_flagship_runs_both_whole_processes(quick_suite):
    _, out = quick_suite
    result = _load(out, "flagship")
    records = result["data"]["records"]
    assert sorted(r["contender"] for r in records) == ["keras", "tftrain"]
    for r in records:  # one epoch on 2,048 images already learns
        assert r["seconds"] > 0 and r["test_accuracy"] > 0.6, r
    tftrain = next(r for r in records if r["contender"] == "tftrain")
    assert tftrain["execution"] in ("graph", "xla") and not tftrain["execution_remembered"]  # an empty memory
    summary = result["summary"]
    assert summary["speedup_median"] == pytest.approx(
        next(r for r in records if r["contender"] == "keras")["seconds"] / tftrain["seconds"])


def test_zoo_records_every_contender(quick_suite):
    _, out = quick_suite
    result = _load(out, "zoo")
    data, models = result["data"], result["summary"]["models"]
    assert len(models) >= 1 and set(models) == set(data["keras"]) == set(data["tftrain"])
    for name, summary in models.items():
        [keras], [tftrain] = data["keras"][name], data["tftrain"][name]  # --quick: one round
        assert "error" not in keras and "error" not in tftrain, (name, keras, tftrain)
        assert keras["examples_per_sec"] > 0 and keras["trained_steps_per_execution"] == 1  # Keras's default
        assert keras["wall_s"] > sum(keras["epochs_s"]) > 0
        points = [p for p in data["points"] if p["model"] == name]
        assert len(points) >= 2 and all(p["examples_per_sec"] > 0 for p in points), points
        for p in points:  # each oracle point trained with the settings it is filed under
            trained = (p["trained_jit_compile"], p["trained_steps_per_execution"])
            assert trained == (p["execution"] == "xla", p["steps_per_execution"]), p
        # One round: the oracle's best median is the best point; tftrain's median is its one figure.
        assert summary["oracle_best"]["examples_per_sec"] == max(p["examples_per_sec"] for p in points)
        assert summary["tftrain"]["examples_per_sec"] == tftrain["examples_per_sec"] > 0
        assert summary["tftrain_vs_keras"] == pytest.approx(tftrain["examples_per_sec"] / keras["examples_per_sec"])
        assert summary["keras"]["ten_epochs_s"] > 0 and summary["tftrain"]["ten_epochs_s"] > 0
        assert summary["keras"]["wall_s"] > 0 and summary["tftrain"]["wall_s"] > 0  # 10 epochs, end to end
        assert tftrain["trial"]["complete"] and tftrain["trial"]["steps"] > 0  # timed on its own training steps
        assert tftrain["probe_s"] > 0
        # The Trainer's choice is what metrics.json records and what the model trained in.
        assert tftrain["execution"] in ("graph", "xla")
        assert tftrain["execution"] == tftrain["metrics_execution"] == tftrain["metrics_choice"]
        assert tftrain["trained_jit_compile"] == (tftrain["execution"] == "xla")
        assert tftrain["steps_per_execution"] in (1, 8, 32, 64)  # steps_per_execution="auto": timed
        assert not tftrain.get("remembered")  # a fresh memory: the first run timed its probe
        second = tftrain["second_run"]
        if not tftrain["trial"]["modes_decided"]:  # 128 steps too few to repay compiling XLA: not timed, nor remembered
            assert tftrain["execution"] == "graph" and second["remembered"] is None
        else:  # the next run reuses the choice (graph when its one epoch cannot repay compiling XLA again)
            assert second["remembered"] and second["execution"] in (tftrain["execution"], "graph")


def test_gpu_suite_says_when_there_is_no_gpu(tmp_path):
    proc = _run(["--gpu", "--only", "mirrored", "--out", str(tmp_path)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu-mirrored.json").read_text())
    assert all(p["examples_per_sec"] > 0 for p in result["data"]["points"])
    if "GPU suite on" in proc.stdout:  # a machine with GPUs: the real thing
        assert result["device"]["gpu_found"] is True
        return
    assert "NO GPU FOUND" in proc.stdout
    assert result["device"]["gpu_found"] is False and result["quick"] is True
    assert any("NO GPU FOUND" in n for n in result["notes"])
    assert "NO GPU FOUND" in (tmp_path / "gpu-summary.md").read_text()


def test_unknown_benchmark_name_is_refused():
    proc = _run(["--only", "rooflin"], timeout=120)
    assert proc.returncode == 2 and "unknown benchmark(s) rooflin" in proc.stderr


def test_the_summary_rebuilds_from_the_results_files(quick_suite, tmp_path):
    import shutil

    _, out = quick_suite
    copy = tmp_path / "results"
    shutil.copytree(out, copy)
    zoo = json.loads((copy / "zoo.json").read_text())
    zoo["summary"]["model_count"] = 99  # as if the zoo had been rerun on its own
    (copy / "zoo.json").write_text(json.dumps(zoo))
    proc = _run(["--summary-only", "--quick", "--out", str(copy)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["summaries"]["zoo"]["model_count"] == 99 and set(summary["runs"]) >= set(CPU_SUITE)
    assert "of 99" in (copy / "summary.md").read_text()  # the zoo's rows count its models
