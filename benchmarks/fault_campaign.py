"""Fault campaign: kill tasks of real training jobs at random moments and check that nothing is lost.

Each trial starts one job on MNIST (16,384 training images, 2 epochs of 128 steps of 128,
`--backup-every-steps 8`, graph mode, seed 0): a single process, a two-worker
MultiWorkerMirrored job, or a parameter-server job (chief, two workers, one ps) under
`python -m tftrain.launch`. Once the job's first checkpoint is on disk it waits a random
0-2 s and sends SIGKILL or SIGTERM to one random task (the single process itself, or one of
the launcher's tasks), lets the job end, and reruns the same command until it finishes (at
most `MAX_RERUNS` times). A trial passes when:

* the job finished (`metrics.json` written) and no process it started is left;
* every optimizer step ran once across the reruns (the saved model's step counter equals
  2 x 128; a parameter-server job, whose workers keep running after one is lost, is exempt);
* SIGKILL lost at most the backup interval: the rerun resumed at or after the newest
  checkpoint on disk just before the kill (checkpoints are 8 steps apart,
  `--backup-every-steps 8`; a parameter-server job's coordinator joins its workers there to save); SIGTERM lost
  nothing: the rerun resumed at the step the job
  said it saved (a parameter-server worker or ps task ignores SIGTERM, and the job goes on; outside training,
  before the first step or after the last, there is nothing to save);
* the test accuracy is within 1 point of an unfaulted run of the same kind.

Then the moments a random delay rarely hits, on a single process (`MOMENT_TRIALS`): SIGKILL inside a
save (once a checkpoint's temporary weights file appears), after training (once `model.keras`
appears) and right after `metrics.json`; two SIGTERMs 0.1 s apart; SIGHUP (a closed terminal). These
also pass only when the faulted process exited with its documented code (128 + the signal after a
stop signal, or 0 when the run was complete) and the rerun left no checkpoint behind.

`python -m benchmarks.fault_campaign` runs 24 random trials (kind x signal x 4, seed 0) and each moment
trial twice; `--quick` runs one single-process SIGKILL trial (0-0.5 s after the first checkpoint) and
each moment trial once, which tests/integration/test_fault_campaign.py runs
(tests/integration/test_lose_nothing.py, test_signals.py and test_multi_worker.py test SIGTERM and the
multi-process jobs one by one).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import common

NAME = "fault_campaign"
KINDS = ("single", "multi_worker", "parameter_server")
SIGNALS = ("SIGKILL", "SIGTERM")
MOMENT_TRIALS = (("SIGKILL", "inside a save"), ("SIGKILL", "after model.keras"), ("SIGKILL", "after metrics.json"),
                 ("SIGTERM x2", "in training"), ("SIGHUP", "in training"))
"""(signal, moment) of the single-process trials at chosen moments; "SIGTERM x2": two, 0.1 s apart."""
STEPS_PER_EPOCH, EPOCHS, BACKUP_EVERY = 128, 2, 8
MAX_RERUNS = 2
JOB_TIMEOUT_S = 300
STARTED = re.compile(r"started (\S+) \(pid (\d+)\)")
"""`tftrain.launch`'s line naming a task it started and its pid."""
RECIPE = ["--train-examples", str(STEPS_PER_EPOCH * 128), "--epochs", str(EPOCHS), "--batch-size", "128", "--seed", "0",
          "--execution", "graph", "--verbose", "2"]


def _command(kind: str, run_dir: Path) -> list:
    """The job's command line: the recipe, alone or under `tftrain.launch`."""
    recipe = [sys.executable, "-m", "tftrain.recipes.mnist", *RECIPE, "--run-dir", str(run_dir),
              "--backup-every-steps", str(BACKUP_EVERY)]
    if kind == "single":
        return recipe
    cluster = ["--workers", "2"] if kind == "multi_worker" else ["--chief", "--workers", "2", "--ps", "1"]
    strategy = "multi_worker_mirrored" if kind == "multi_worker" else "parameter_server"
    return [sys.executable, "-m", "tftrain.launch", *cluster, "--timeout", str(JOB_TIMEOUT_S), "--grace", "30",
            "--", *recipe, "--strategy", strategy]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def _saved_step(run_dir: Path):
    """The optimizer step of the newest checkpoint on disk, or None."""
    from tftrain.checkpoint_files import read_position

    position = read_position(run_dir / "backup")
    return None if position is None else position.optimizer_iterations


def _pids(output: str, proc) -> list:
    return [proc.pid] + [int(pid) for _, pid in STARTED.findall(output)]


def _due(moment: str, run_dir: Path, rng: random.Random, max_delay_s: float) -> bool:
    """Whether `moment` has come (for "random" and "in training": a checkpoint exists; then waits a random
    0-`max_delay_s` s)."""
    if moment == "inside a save":  # a save with a committed checkpoint before it
        return _saved_step(run_dir) is not None and any((run_dir / "backup").glob(".tmp-*-ckpt-*.weights.h5"))
    if moment in ("after model.keras", "after metrics.json"):
        return (run_dir / moment.split()[-1]).exists()
    if _saved_step(run_dir) is None:
        return False
    time.sleep(rng.uniform(0, max_delay_s))
    return True


def _send(pid: int, signame: str) -> None:
    if signame == "SIGTERM x2":
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.1)
        os.kill(pid, signal.SIGTERM)
    else:
        os.kill(pid, getattr(signal, signame))


def _faulted_run(kind: str, run_dir: Path, signame: str, rng: random.Random, max_delay_s: float,
                 moment: str = "random") -> dict:
    """Starts the job, sends `signame` to a random task at `moment`; what happened."""
    proc = subprocess.Popen(_command(kind, run_dir), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines, tasks = [], {}
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline, fault = time.monotonic() + JOB_TIMEOUT_S, None
    while proc.poll() is None and time.monotonic() < deadline:
        if fault is None and _due(moment, run_dir, rng, max_delay_s):
            tasks = {name: int(pid) for name, pid in STARTED.findall("".join(lines))}
            victim = rng.choice(sorted(tasks)) if tasks else "process"
            seen = _saved_step(run_dir)  # the newest checkpoint just before the signal
            try:
                _send(tasks.get(victim, proc.pid), signame)
                fault = {"victim": victim, "checkpoint_seen": seen, "at_s": round(time.monotonic(), 1)}
            except ProcessLookupError:  # it finished meanwhile
                fault = {"victim": victim, "checkpoint_seen": seen, "missed": True}
        time.sleep(0.05 if moment in ("random", "in training") else 0.002)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(timeout=10)
    output = "".join(lines)
    saved = re.search(r"checkpoint saved at .*\(optimizer step (\d+)\)", output)
    return {"fault": fault or {"missed": True}, "exit_code": proc.returncode, "output": output,
            "said_saved": int(saved.group(1)) if saved else None, "pids": _pids(output, proc)}


def _rerun(kind: str, run_dir: Path) -> dict:
    done = subprocess.run(_command(kind, run_dir), env=_env(), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S + 60)
    output = done.stdout + done.stderr
    resumed = re.search(r"resuming: (\d+)/\d+ epochs done(?: and (\d+) optimizer steps of the next)?", output)
    step = int(resumed.group(1)) * STEPS_PER_EPOCH + int(resumed.group(2) or 0) if resumed else None
    return {"exit_code": done.returncode, "resumed_at": step, "output": output}


def _alive(pids) -> list:
    import psutil

    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _accuracy(run_dir: Path):
    try:
        return json.loads((run_dir / "metrics.json").read_text())["test_accuracy"]
    except (OSError, ValueError, KeyError):
        return None


def _optimizer_steps(run_dir: Path):
    """The finished model's optimizer step counter (`model.keras`), in a child process (TensorFlow)."""
    code = ("import sys, keras; m = keras.saving.load_model(sys.argv[1], compile=True); "
            "print(int(m.optimizer.iterations.numpy()))")
    done = subprocess.run([sys.executable, "-c", code, str(run_dir / "model.keras")], env=_env(),
                          capture_output=True, text=True, timeout=120)
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None


def _lost_at_most_the_interval(kind, signame, reruns, resumed, seen, said, finished: bool = False) -> bool:
    """No rerun needed (the job outlived the fault), or the rerun resumed at the step a SIGTERM saved
    (by the chief of a parameter-server job: its worker and ps tasks ignore it), or, after SIGKILL, at or after the
    newest checkpoint on disk just before the kill (checkpoints are `BACKUP_EVERY` steps apart). A run that
    was `finished` (`metrics.json` written) when the fault came has nothing left to lose."""
    if not reruns or finished:
        return True
    if resumed is None:
        return seen is None  # no checkpoint yet: the rerun starts from step 0, as it must
    if signame != "SIGKILL" and said is not None:
        return resumed == said
    return seen is None or resumed >= seen  # SIGKILL, or SIGTERM outside training (nothing left to save)


def _exit_code_told(signame: str, code: int, finished: bool) -> bool:
    """A single process's exit: killed by SIGKILL; after a stop signal 128 + the signal, or 0 when the run
    was complete when it came."""
    if signame == "SIGKILL":
        return code == -signal.SIGKILL
    signum = signal.SIGTERM if signame == "SIGTERM x2" else getattr(signal, signame)
    return code == 128 + signum or (code == 0 and finished)


def trial(kind: str, signame: str, rng: random.Random, reference: float, root: Path,
          max_delay_s: float = 2.0, moment: str = "random") -> dict:
    """One faulted job and its reruns, judged as the module docstring says."""
    run_dir = Path(tempfile.mkdtemp(dir=root)) / "run"
    started = time.monotonic()
    faulted = _faulted_run(kind, run_dir, signame, rng, max_delay_s, moment)
    finished_when_faulted = _accuracy(run_dir) is not None
    reruns = []
    while (_accuracy(run_dir) is None or (run_dir / "backup").exists()) and len(reruns) < MAX_RERUNS:
        reruns.append(_rerun(kind, run_dir))
    resumed = next((r["resumed_at"] for r in reruns if r["resumed_at"] is not None), None)
    seen, said = faulted["fault"].get("checkpoint_seen"), faulted["said_saved"]
    steps = _optimizer_steps(run_dir) if _accuracy(run_dir) is not None else None
    accuracy = _accuracy(run_dir)
    checks = {
        "finished": accuracy is not None,
        "no_process_left": not _alive(faulted["pids"]),
        "every_step_once": kind == "parameter_server" or steps == EPOCHS * STEPS_PER_EPOCH,
        "lost_at_most_the_interval": _lost_at_most_the_interval(kind, signame, reruns, resumed, seen, said,
                                                                finished_when_faulted),
        "accuracy_within_1_point": accuracy is not None and abs(accuracy - reference) <= 0.01,
    }
    if moment != "random":
        checks["exit_code_told"] = _exit_code_told(signame, faulted["exit_code"], finished_when_faulted)
        checks["no_checkpoint_left"] = not (run_dir / "backup").exists()
    return {"kind": kind, "signal": signame, "moment": moment, "victim": faulted["fault"].get("victim"),
            "missed": bool(faulted["fault"].get("missed")), "exit_code": faulted["exit_code"],
            "checkpoint_seen": seen, "said_saved": said, "resumed_at": resumed, "reruns": len(reruns),
            "optimizer_steps": steps, "test_accuracy": accuracy, "reference_accuracy": reference,
            "seconds": round(time.monotonic() - started, 1), "checks": checks, "passed": all(checks.values()),
            "tail": "" if all(checks.values()) else (faulted["output"] + "".join(r["output"] for r in reruns))[-3000:]}


def _reference(kind: str, root: Path) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=root)) / "run"
    subprocess.run(_command(kind, run_dir), env=_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S + 60)
    return _accuracy(run_dir)


def run(args, device) -> common.Result:
    rng = random.Random(args.seed)
    plan = [("single", "SIGKILL", "random")] if args.quick else \
        [(k, s, "random") for k in KINDS for s in SIGNALS for _ in range(args.trials // (len(KINDS) * len(SIGNALS)))]
    plan += [("single", s, m) for s, m in MOMENT_TRIALS for _ in range(1 if args.quick else 2)]
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as tmp:
        root = Path(tmp)
        references = {kind: _reference(kind, root) for kind in sorted({k for k, _, _ in plan})}
        delay = 0.5 if args.quick else 2.0  # --quick: surely before the end of training
        records = []
        for kind, signame, moment in plan:
            records.append(trial(kind, signame, rng, references[kind], root, delay, moment))
            print(json.dumps({k: v for k, v in records[-1].items() if k != "tail"}), flush=True)
    headers = ["kind", "signal", "moment", "task", "exit code", "checkpoint seen", "saved (said)", "resumed at", "reruns",
               "optimizer steps", "test accuracy (unfaulted)", "passed"]
    rows = [[r["kind"], r["signal"], r["moment"], (r["victim"] or "none") + (" (missed: the job ended first)" if r["missed"] else ""),
             r["exit_code"],
             common.fmt(r["checkpoint_seen"], "d"), common.fmt(r["said_saved"], "d"), common.fmt(r["resumed_at"], "d"),
             r["reruns"], common.fmt(r["optimizer_steps"], "d"),
             f"{common.fmt(r['test_accuracy'], '.4f')} ({common.fmt(r['reference_accuracy'], '.4f')})",
             "yes" if r["passed"] else "NO: " + ", ".join(k for k, v in r["checks"].items() if not v)]
            for r in records]
    passed = sum(r["passed"] for r in records)
    return common.Result(
        name=NAME, title=f"Fault campaign: {passed} of {len(records)} trials lost nothing beyond the backup interval",
        headers=headers, rows=rows, data={"records": records, "references": references},
        summary={"trials": len(records), "passed": passed},
        notes=[f"MNIST MLP, {EPOCHS} epochs of {STEPS_PER_EPOCH} steps of 128, --backup-every-steps {BACKUP_EVERY}; "
               "random moments: one signal per trial to a random task 0-2 s after the first checkpoint; chosen "
               "moments (single process): as the module says; "
               f"reruns of the same command (at most {MAX_RERUNS}) until the job finished and left no checkpoint.",
               f"Optimizer steps: the finished model's step counter (every step once: {EPOCHS * STEPS_PER_EPOCH}); the parameter-server "
               "job is exempt (its other worker trains on while one is lost)."],
        plot=None)


def main(argv=None) -> int:
    """`python -m benchmarks.fault_campaign [--quick] [--trials N] [--seed S]`."""
    def extra(parser):
        parser.add_argument("--trials", type=int, default=24, help="trials (a multiple of 6: kind x signal)")
        parser.add_argument("--seed", type=int, default=0, help="seed of the victims and moments")
        parser.set_defaults(no_device_setup=True)

    return common.main_for(NAME, __doc__.splitlines()[0], run, argv, extra)


if __name__ == "__main__":
    sys.exit(main())
