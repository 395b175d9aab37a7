"""The zoo's report: medians over rounds, the oracle's best, the goals, one table and one plot."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Optional

from benchmarks import common
from benchmarks.zoo.harness import (DOMINATED, EPOCHS, GRID, QUICK_EPOCHS, QUICK_GRID, QUICK_REFERENCE_EPOCHS,
                                    REFERENCE_EPOCHS, THREADS_GRID)
from benchmarks.zoo.models import ZooModel, examples_per_epoch

NAME = "zoo"

TARGETS = {"fraction_of_oracle": 0.95, "fraction_of_plain_keras": 1.0, "probe_fraction_of_10_epochs": 0.03}
"""The goals: tftrain / oracle best and tftrain / plain Keras (examples/sec and a projected 10-epoch
run's seconds, at least), the first run's probe / a 10-epoch run (at most)."""


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _median(values) -> Optional[float]:
    values = [v for v in values if _finite(v)]
    return statistics.median(values) if values else None


def _spread(values) -> Optional[list]:
    values = [v for v in values if _finite(v)]
    return [min(values), max(values)] if values else None


def _threads(intra: int, inter: int) -> str:
    return "default threads" if (intra, inter) == (0, 0) else f"threads {intra or 'dflt'}/{inter or 'dflt'}"


def _runs(name: str, workers: list, label: str) -> list:
    """Model `name`'s `label` ("keras" or "tftrain") figures of every round that has them."""
    return [w["models"][name][label] for w in workers
            if name in w.get("models", {}) and label in w["models"][name]]


def grid_points(name: str, workers: list) -> list:
    """Every oracle point of model `name` in every round (a failed one carries `error`)."""
    return [{"model": name, "round": w["round"], "intra_op": w["intra_op"], "inter_op": w["inter_op"], **p}
            for w in workers if name in w.get("models", {}) for p in w["models"][name]["grid"]]


def oracle(name: str, workers: list) -> list:
    """The oracle's settings of model `name`, each with its median examples/sec over rounds and their
    spread, best first."""
    by_setting = {}
    for p in grid_points(name, workers):
        key = (p["execution"], p["steps_per_execution"], p["intra_op"], p["inter_op"])
        by_setting.setdefault(key, []).append(p.get("examples_per_sec"))
    settings = [{"execution": k[0], "steps_per_execution": k[1], "intra_op": k[2], "inter_op": k[3],
                 "examples_per_sec": _median(v), "spread": _spread(v), "rounds": len(v)}
                for k, v in by_setting.items()]
    return sorted([s for s in settings if s["examples_per_sec"]], key=lambda s: -s["examples_per_sec"])


def projected_10_epochs_s(run: dict, examples: int, dataset_size: int) -> Optional[float]:
    """Seconds of a 10-epoch run on `dataset_size` examples, from one timed run: its fixed cost (wall seconds
    less its epochs at the steady rate: building, probing, tracing, compiling, the run's writes) plus 10
    epochs at the steady rate. None when a figure is missing."""
    rate, wall, epochs = run.get("examples_per_sec"), run.get("wall_s"), len(run.get("epochs_s", []))
    if not (_finite(rate) and _finite(wall) and epochs):
        return None
    fixed = max(0.0, wall - epochs * examples / rate)
    return fixed + 10 * dataset_size / rate


def _choice(runs: list) -> Optional[tuple]:
    """tftrain's most frequent (execution, steps_per_execution) over rounds."""
    choices = Counter((r["execution"], r["steps_per_execution"]) for r in runs if r.get("execution"))
    return choices.most_common(1)[0][0] if choices else None


def _at(settings: list, choice: Optional[tuple]) -> Optional[dict]:
    """The oracle's figure at tftrain's choice with TensorFlow's default threads (those tftrain ran with)."""
    return next((s for s in settings if choice and (s["execution"], s["steps_per_execution"]) == choice
                 and (s["intra_op"], s["inter_op"]) == (0, 0)), None)


def _contender(runs: list, examples: int, dataset_size: int) -> dict:
    """Median examples/sec (and spread) and median projected 10-epoch seconds of one contender's rounds."""
    rates = [r.get("examples_per_sec") for r in runs]
    return {"examples_per_sec": _median(rates), "spread": _spread(rates),
            "ten_epochs_s": _median(projected_10_epochs_s(r, examples, dataset_size) for r in runs),
            "wall_s": _median(r.get("wall_s") for r in runs)}


def model_summary(spec: ZooModel, workers: list) -> dict:
    """One model's medians against the goals (None where a contender failed in every round)."""
    examples = next((w["models"][spec.name]["examples_per_epoch"] for w in workers
                     if spec.name in w.get("models", {})), None) or 0
    keras_runs, tft_runs = _runs(spec.name, workers, "keras"), _runs(spec.name, workers, "tftrain")
    keras, tft = (_contender(r, examples, spec.dataset_size) for r in (keras_runs, tft_runs))
    settings = oracle(spec.name, workers)
    best, choice = (settings[0] if settings else None), _choice(tft_runs)
    same = _at(settings, choice)
    probe = _median(r.get("probe_s") for r in tft_runs)
    second = [r["second_run"] for r in tft_runs if r.get("second_run")]
    out = {
        "batch_size": spec.batch_size, "examples_per_epoch": examples, "dataset_size": spec.dataset_size,
        "rounds": len(tft_runs), "keras": keras, "tftrain": tft, "oracle_best": best,
        "tftrain_choice": choice, "tftrain_choices": [[r.get("execution"), r.get("steps_per_execution")]
                                                      for r in tft_runs],
        "tftrain_vs_oracle": common.ratio(tft["examples_per_sec"] or math.nan,
                                          best["examples_per_sec"] if best else math.nan),
        "tftrain_vs_keras": common.ratio(tft["examples_per_sec"] or math.nan, keras["examples_per_sec"] or math.nan),
        "keras_vs_tftrain_10_epochs": common.ratio(keras["ten_epochs_s"] or math.nan, tft["ten_epochs_s"] or math.nan),
        "keras_vs_tftrain_measured": common.ratio(keras["wall_s"] or math.nan, tft["wall_s"] or math.nan),
        # The oracle's own median at tftrain's choice: how good the choice is, apart from tftrain's machinery.
        "oracle_at_choice": same and same["examples_per_sec"],
        "choice_vs_oracle": common.ratio(same["examples_per_sec"], best["examples_per_sec"]) if same and best else None,
        "probe_s": probe, "probe_fraction_of_10_epochs": probe / tft["ten_epochs_s"]
        if probe is not None and tft["ten_epochs_s"] else None,
        "probe_remembered": any(r.get("remembered") for r in tft_runs),
        "next_run_probe_s": _median(s["probe_s"] for s in second) if second else None,
        "next_run_remembered": all(bool(s["remembered"]) for s in second) if second else None,
        "tftrain_epoch_callbacks_s": _median(s for r in tft_runs for s in r.get("callbacks_s", [])[1:]),
    }
    return {**out, **_verdicts(out)}


def _verdicts(m: dict) -> dict:
    """The goals for one model's medians (False when a figure is missing). Choosing's: the first run's
    choosing <= 3% of a projected 10-epoch run, timed (not remembered), and a next run, where measured,
    reuses it."""
    probe = m["probe_fraction_of_10_epochs"]
    timed = probe is not None and not m["probe_remembered"]
    return {"meets_oracle": bool(m["tftrain_vs_oracle"] >= TARGETS["fraction_of_oracle"]),
            "meets_plain_keras": bool(m["tftrain_vs_keras"] >= TARGETS["fraction_of_plain_keras"]),
            "meets_plain_keras_10_epochs": bool(m["keras_vs_tftrain_10_epochs"] >= TARGETS["fraction_of_plain_keras"]),
            "meets_plain_keras_measured": bool(m["keras_vs_tftrain_measured"] >= TARGETS["fraction_of_plain_keras"]),
            "meets_probe": timed and probe <= TARGETS["probe_fraction_of_10_epochs"]
            and m["next_run_remembered"] is not False}


# --- The table, the plot, the notes ------------------------------------------------------

def _percent(fraction, spec: str = ".0f") -> str:
    """`95%`, `-` for None, `failed` for NaN."""
    return "-" if fraction is None else common.fmt(100 * fraction, spec) + ("%" if math.isfinite(fraction) else "")


def _times(ratio: float) -> str:
    """`1.05x`, `failed` for NaN."""
    return common.fmt(ratio, ".2f") + ("x" if math.isfinite(ratio) else "")


def _rate(contender: dict) -> str:
    """`5,982 (5,801-6,120)`: the median and the rounds' spread."""
    spread = contender["spread"]
    cell = common.fmt(contender["examples_per_sec"])
    return cell if not spread or spread[0] == spread[1] else f"{cell} ({spread[0]:,.0f}-{spread[1]:,.0f})"


def _probe_cell(m: dict) -> str:
    """`2.5 (next run 0.01)`: the first run's probe seconds, then the next run's."""
    cell = common.fmt(m["probe_s"], ".1f") + (" remembered" if m["probe_remembered"] else "")
    if m["next_run_probe_s"] is None:
        return cell
    return cell + f" (next run {m['next_run_probe_s']:.2f}{'' if m['next_run_remembered'] else ', timed again'})"


def _setting(s: Optional[dict]) -> str:
    return "-" if not s else f"{s['execution']}, spe {s['steps_per_execution']}, {_threads(s['intra_op'], s['inter_op'])}"


def _row(name: str, m: dict) -> list:
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    choice = m["tftrain_choice"]
    return [name, m["batch_size"], _rate(m["keras"]), f"{_rate(m['oracle_best'] or {'examples_per_sec': None, 'spread': None})}: "
            f"{_setting(m['oracle_best'])}", _rate(m["tftrain"]), "-" if not choice else f"{choice[0]}, spe {choice[1]}",
            _percent(m["tftrain_vs_oracle"]), _percent(m["choice_vs_oracle"]), _times(m["tftrain_vs_keras"]),
            f"{common.fmt(m['keras']['wall_s'], '.1f')} / {common.fmt(m['tftrain']['wall_s'], '.1f')}",
            _times(m["keras_vs_tftrain_measured"]),
            f"{common.fmt(m['keras']['ten_epochs_s'], '.0f')} / {common.fmt(m['tftrain']['ten_epochs_s'], '.0f')}",
            _times(m["keras_vs_tftrain_10_epochs"]), _probe_cell(m), _percent(m["probe_fraction_of_10_epochs"], ".1f"),
            " ".join(yes(m[k]) for k in ("meets_oracle", "meets_plain_keras", "meets_plain_keras_measured",
                                         "meets_plain_keras_10_epochs", "meets_probe"))]


HEADERS = ["model", "batch", "plain Keras ex/s", "oracle best ex/s: setting", "tftrain ex/s", "tftrain choice",
           "tftrain / oracle", "oracle at tftrain's choice / oracle", "tftrain / plain Keras (ex/s)",
           "10 timed epochs, measured s: Keras / tftrain", "Keras / tftrain (measured)",
           "10 epochs of the dataset, projected s: Keras / tftrain", "Keras / tftrain (projected)",
           "choosing s", "choosing / projected 10 epochs",
           "goals: ≥ 95% of oracle, ≥ Keras ex/s, ≥ Keras measured, ≥ Keras projected, choosing ≤ 3%"]


def _plot(models: dict):
    """Grouped bars per model: plain Keras, the oracle's best and tftrain, as % of the oracle's best
    (medians), with the rounds' spread as error bars."""

    def plot(fig):
        ax = fig.subplots()
        names, top = list(models), 100.0
        bars = (("plain Keras", "keras", "tab:grey"), ("oracle best", "oracle_best", "tab:blue"),
                ("tftrain", "tftrain", "tab:orange"))
        for i, (label, key, color) in enumerate(bars):
            ys, errs = [], [[], []]
            for m in models.values():
                best = m["oracle_best"]["examples_per_sec"] if m["oracle_best"] else math.nan
                c = m[key] or {}
                y = 100 * common.ratio(c.get("examples_per_sec") or math.nan, best)
                lo, hi = (c.get("spread") or [math.nan, math.nan])
                ys.append(y)
                errs[0].append(max(0.0, y - 100 * lo / best) if math.isfinite(y) and math.isfinite(lo) else 0)
                errs[1].append(max(0.0, 100 * hi / best - y) if math.isfinite(y) and math.isfinite(hi) else 0)
            top = max([top] + [y + e for y, e in zip(ys, errs[1]) if math.isfinite(y)])
            ax.bar([x + (i - 1) * 0.27 for x in range(len(names))], ys, width=0.27, label=label, color=color,
                   yerr=errs, capsize=2, error_kw={"linewidth": 0.7})
        ax.axhline(100 * TARGETS["fraction_of_oracle"], color="black", linestyle="--", linewidth=0.8, label="95% goal")
        ax.set_xticks(range(len(names)), [f"{n}\nbatch {m['batch_size']}" for n, m in models.items()], fontsize=7)
        ax.set_ylabel("examples/sec, % of the oracle's best (median over rounds)")
        ax.set_ylim(0, top * 1.18)
        ax.legend(fontsize=7, loc="upper center", ncol=4)
        ax.grid(axis="y", alpha=0.3)

    return plot


def _notes(specs: list, workers: list, quick: bool) -> list:
    epochs = QUICK_EPOCHS if quick else EPOCHS
    grid = QUICK_GRID if quick else GRID
    others = "" if quick else (f" at TensorFlow's default threads and {len(THREADS_GRID)} ("
                               + ", ".join(f"{m} {s}" for m, s in THREADS_GRID) + ") at the others")
    settings = list(dict.fromkeys(_threads(w["intra_op"], w["inter_op"]) for w in workers))
    rounds = len({w["round"] for w in workers})
    sizes = ", ".join(f"{s.name} {s.batch_size} ({examples_per_epoch(s, quick):,}/epoch; "
                      f"10-epoch run on {s.dataset_size:,}: {s.dataset})" for s in specs)
    return [
        f"Batch size and examples per timed epoch (and the dataset size of the projected 10-epoch run): {sizes}. "
        "MNIST is the bundled real data; the others are random (synthetic) inputs and labels: speed only.",
        f"{rounds} interleaved round(s): each round runs one worker process per thread setting ({', '.join(settings)}), "
        "each timing every model; the worker with TensorFlow's default threads also times plain Keras and tftrain "
        "(alternating which goes first). Every figure is the median over rounds, with the rounds' spread (min-max).",
        f"Every contender: a fresh model (seed 0), Adam (learning rate 1e-3), the model's loss and metric; plain "
        f"Keras and tftrain's first run {QUICK_REFERENCE_EPOCHS if quick else REFERENCE_EPOCHS} epochs, timed end to "
        f"end (building, choosing, tracing, training, the run's writes: 'measured'), each oracle point {epochs} epochs; examples/sec = examples per "
        "epoch / fastest epoch after the first, timed by one callback around whole epochs.",
        "Plain Keras: compile + fit on NumPy arrays with every Keras default (on a CPU: graph, no XLA, "
        "steps_per_execution 1, TensorFlow's threads).",
        "Oracle: tftrain's own Trainer(ArrayTask(...), precision='float32') with one setting fixed, at "
        f"{len(grid)} (execution, steps_per_execution) points{others}, {len(settings)} thread setting(s): the same harness "
        "as tftrain's automatic run (its pipeline, checkpoint at each epoch end, TensorBoard, throughput "
        "monitor), so the choice is judged apart from the machinery. "
        f"A point whose first timed epoch takes over {DOMINATED:g}x the fastest epoch of its model so far in its "
        "process stops there (it cannot be the best).",
        "tftrain: Trainer(ArrayTask(...), execution='auto', steps_per_execution='auto', precision='float32'), "
        "a fresh memory of choices each round, so its first run times the candidates on its own first training "
        "steps (tftrain.runtime.execution_trial: graph against XLA, then larger steps per execution, then "
        "the other mode at the winner's count, in interleaved duels; those steps train the model), then a second one-epoch run of the same model (\"next "
        "run\") that should reuse the choice; threads: TensorFlow's defaults on a first run (thread pools are "
        "fixed when TensorFlow starts). float32 isolates the execution settings from precision.",
        "Choosing s = what the automatic run paid beyond a run at its chosen setting: the Trainer's "
        "choose_execution stage before fit plus the trial's cost inside fit (its wall seconds less the same steps "
        "at the chosen candidate's step time, less what the chosen candidate's compiling call took beyond the "
        "first one's, which a run at the chosen setting pays too: compiling the candidates that lost, running the "
        "slower ones; an upper bound); on the next run, the stage less the first call of a remembered XLA "
        "choice's check, which compiled the train function fit then reuses. Projected 10-epoch seconds = the "
        "timed run's fixed cost (its wall seconds less "
        "its epochs at the steady rate: building, choosing, tracing, the run's writes) + 10 epochs of the "
        "dataset size at the steady rate; choosing / projected 10 epochs divides by tftrain's projection.",
    ]


def _errors(workers: list) -> list:
    """`FAILED: ...` for every worker and contender that failed."""
    out = [f"FAILED worker (round {w['round']}, {_threads(w['intra_op'], w['inter_op'])}): {w['error']}"
           for w in workers if "error" in w]
    for w in workers:
        for name, figures in w.get("models", {}).items():
            out += [f"FAILED: {name} {label} round {w['round']}: {figures[label]['error']}"
                    for label in ("keras", "tftrain") if "error" in figures.get(label, {})]
            out += [f"FAILED: {name} {p['execution']} spe {p['steps_per_execution']} "
                    f"{_threads(w['intra_op'], w['inter_op'])} round {w['round']}: {p['error']}"
                    for p in figures["grid"] if "error" in p]
    return out


def result(specs: list, workers: list, quick: bool) -> common.Result:
    """The zoo's `common.Result`: one row per model, the goals counted in `summary`."""
    models = {s.name: model_summary(s, workers) for s in specs}
    keys = ("meets_oracle", "meets_plain_keras", "meets_plain_keras_measured", "meets_plain_keras_10_epochs",
            "meets_probe")
    summary = {"models": models, "targets": TARGETS, "model_count": len(models),
               **{f"models_{key}": sum(m[key] for m in models.values()) for key in keys}}
    data = {"points": [p for s in specs for p in grid_points(s.name, workers)],
            "keras": {s.name: _runs(s.name, workers, "keras") for s in specs},
            "tftrain": {s.name: _runs(s.name, workers, "tftrain") for s in specs},
            "workers": [{k: v for k, v in w.items() if k != "models"} for w in workers]}
    return common.Result(
        name=NAME, title="Zoo: tftrain's automatic settings vs plain Keras and an oracle of fixed settings",
        headers=HEADERS, rows=[_row(n, m) for n, m in models.items()], data=data, summary=summary,
        notes=_notes(specs, workers, quick) + _errors(workers), plot=_plot(models))
