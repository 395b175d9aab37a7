"""The configuration's sections: `RuntimeConfig`, `DataConfig`, `TrainConfig` (`tftrain.config`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tftrain.config.fields import (AUTO_BATCH, COMMUNICATIONS, DEVICES, EXECUTIONS, LR_SCHEDULES,
                                   MULTI_PROCESS_STRATEGIES, PRECISIONS, STRATEGIES, STRATEGY_ALIASES, THREAD_MODES,
                                   TUNERS, _field, _validate_fields)
from tftrain.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Threads, devices, precision, execution mode and distribution strategy.

    Attributes:
        strategy: one of `STRATEGIES` or `STRATEGY_ALIASES`. Defaults to `"default"` (one device).
        device: `"auto"` (GPUs if any, else the CPU), `"cpu"` or `"gpu"`. Defaults to `"auto"`.
        precision: one of `PRECISIONS`; `"auto"`: `mixed_float16` on GPUs of compute capability >= 7.0,
            `mixed_bfloat16` on CPUs with native bfloat16, else `float32`. Defaults to `"auto"`.
        execution: `"auto"` (time graph and XLA, keep the faster: `runtime.execution_trial`), `"eager"`, `"graph"`
            or `"xla"`. Defaults to `"auto"`.
        remember_execution: reuse `"auto"`'s choice for the same model, batch, devices, versions. Defaults to True.
        steps_per_execution: optimizer steps per `tf.function` call, or `"auto"` (`AUTO_STEPS_PER_EXECUTION` on one
            replica, or 32 / 64 if timed over 5% faster); batch callbacks fire once per execution. Defaults to 1.
        intra_op_threads: threads one op may use; 0 keeps TensorFlow's default. Defaults to 0.
        inter_op_threads: ops run concurrently; 0 keeps TensorFlow's default. Defaults to 0.
        threads: counts left at 0: `"auto"` the doctor's measured ones, if any; `"default"` TensorFlow's. Default auto.
        cpu_replicas: logical CPU devices, so `mirrored` can run N replicas without GPUs. Defaults to 1.
        communication: `multi_worker_mirrored`'s collectives (`COMMUNICATIONS`). Defaults to `"auto"`.
        ps_tasks: ps tasks of a `parameter_server` job under SLURM (rank 0 chief, then ps, then workers). Defaults to 1.
        nvtx: NVTX ranges for Nsight Systems (`TF_ENABLE_NVTX_RANGES=1`, named steps). Defaults to False.

    Raises:
        ConfigError: an unknown name, a count out of range, `communication` / `ps_tasks` for another strategy, or
            `cpu_replicas` > 1 without `mirrored` or with `execution="xla"`.
    """

    strategy: str = _field("default", "tf.distribute strategy", STRATEGIES + tuple(STRATEGY_ALIASES))
    device: str = _field("auto", "devices to train on", DEVICES)
    precision: str = _field("auto", "Keras dtype policy", PRECISIONS)
    execution: str = _field("auto", "execution mode (auto: time graph and XLA, keep the faster)", EXECUTIONS)
    remember_execution: bool = _field(True, "reuse --execution auto's choice for the same model, batch, devices and "
                                            "versions (tftrain.runtime.execution_memory)")
    steps_per_execution: int = _field(1, "optimizer steps per tf.function call (auto: timed, 1-64, on one replica)", minimum=1,
                                      special=("auto",))
    intra_op_threads: int = _field(0, "threads per op (0 = TensorFlow default)", minimum=0)
    inter_op_threads: int = _field(0, "concurrent ops (0 = TensorFlow default)", minimum=0)
    threads: str = _field("auto", "thread counts left at 0: auto = the doctor's measurement for this machine, "
                                  "if any; default = TensorFlow's", THREAD_MODES)
    cpu_replicas: int = _field(1, "split the CPU into N logical devices (replicas)", minimum=1)
    communication: str = _field("auto", "multi-worker all-reduce implementation", COMMUNICATIONS)
    ps_tasks: int = _field(1, "ps tasks of a parameter_server job under SLURM", minimum=1)
    nvtx: bool = _field(False, "NVTX ranges for Nsight Systems (GPU): TF_ENABLE_NVTX_RANGES=1 and named steps")

    def __post_init__(self):
        if self.strategy in STRATEGY_ALIASES:
            object.__setattr__(self, "strategy", STRATEGY_ALIASES[self.strategy])
        _validate_fields(self)
        if self.communication != "auto" and self.strategy != "multi_worker_mirrored":
            raise ConfigError(
                f"communication={self.communication!r} applies to multi_worker_mirrored only; strategy "
                f"{self.strategy!r} picks its own all-reduce. Drop --communication, or use --strategy multi_worker_mirrored."
            )
        if self.ps_tasks != 1 and self.strategy != "parameter_server":
            raise ConfigError(
                f"ps_tasks={self.ps_tasks} applies to parameter_server only; strategy {self.strategy!r} has no ps "
                "tasks. Drop --ps-tasks, or use --strategy parameter_server."
            )
        self._check_cpu_replicas()

    def _check_cpu_replicas(self) -> None:
        """`cpu_replicas` > 1 serves the mirrored strategy only, never XLA (checked before TensorFlow starts)."""
        if self.cpu_replicas == 1:
            return
        if self.strategy in MULTI_PROCESS_STRATEGIES:
            raise ConfigError(
                f"cpu_replicas={self.cpu_replicas} splits one CPU for the mirrored strategy; "
                f"{self.strategy} runs one replica per CPU task. Drop --cpu-replicas, or start more "
                "workers (python -m tftrain.launch --workers N)."
            )
        if self.strategy != "mirrored":
            raise ConfigError(
                f"cpu_replicas={self.cpu_replicas} splits the CPU into replicas for the mirrored strategy; "
                f"strategy {self.strategy!r} would train on one of them. Add --strategy mirrored, or drop "
                "--cpu-replicas."
            )
        if self.execution == "xla":
            raise ConfigError(xla_replicas_error(self.cpu_replicas))


def xla_replicas_error(num_replicas: int) -> str:
    """The message for `execution="xla"` with `num_replicas` > 1 replicas."""
    return (f"execution='xla' does not work with {num_replicas} replicas: Keras 3 compiles the whole "
            "cross-replica step with XLA, which cannot span devices. Use --execution graph, or train on one replica.")


def check_batch_divides(batch_size: int, num_replicas: int) -> None:
    """Raises `ConfigError`, naming the nearest sizes that work, when `batch_size` % `num_replicas` != 0."""
    if batch_size % num_replicas:
        lower = batch_size - batch_size % num_replicas
        options = f"--batch-size {lower} or {lower + num_replicas}" if lower else f"--batch-size {num_replicas}"
        raise ConfigError(
            f"Global batch size {batch_size} does not divide evenly across {num_replicas} replicas. "
            f"Pass {options}, or --per-replica-batch-size {max(1, batch_size // num_replicas)}."
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Input pipeline settings; give at most one of `batch_size` (global) and `per_replica_batch_size`.

    Attributes:
        data_dir: the task's data folder or file. Defaults to None (the task's default).
        train_examples: use only the first N training examples. Defaults to None (all).
        validation_split: fraction in [0, 1) held out from the end, as Keras's `fit`. Defaults to 0.
        batch_size: global batch size, or `"auto"` to search it (`find_batch_size`). Defaults to None (the task's).
        per_replica_batch_size: examples per replica per step. Defaults to None.
        shuffle_buffer: shuffle buffer in examples; 0 shuffles the whole set. Defaults to 0.
        cache: cache decoded examples in memory (file sources). Defaults to True.
        parallel_map: map with `num_parallel_calls=AUTOTUNE`. Defaults to True.
        prefetch: prefetch with `buffer_size=AUTOTUNE`. Defaults to True.
        private_threads: private tf.data thread pool size; 0 uses the shared pool. Defaults to 0.

    Raises:
        ConfigError: a size out of range, or both batch sizes given.
    """

    data_dir: Optional[str] = _field(None, "the task's data folder or file (None: the task's own)")
    train_examples: Optional[int] = _field(None, "use only N training examples (the first N; a random N of an image folder)", minimum=1)
    validation_split: float = _field(0.0, "hold out this fraction of the training examples for validation")
    batch_size: Optional[int] = _field(
        None, "global batch size (all replicas), or 'auto' to search for the fastest", minimum=1, special=(AUTO_BATCH,)
    )
    per_replica_batch_size: Optional[int] = _field(None, "batch size per replica", minimum=1)
    shuffle_buffer: int = _field(0, "shuffle buffer in examples (0 = whole set)", minimum=0)
    cache: bool = _field(True, "cache decoded examples in memory")
    parallel_map: bool = _field(True, "parallel preprocessing map (AUTOTUNE)")
    prefetch: bool = _field(True, "prefetch batches (AUTOTUNE)")
    private_threads: int = _field(0, "private tf.data thread pool size (0 = shared)", minimum=0)

    def __post_init__(self):
        _validate_fields(self)
        if not 0.0 <= self.validation_split < 1.0:
            raise ConfigError(
                f"validation_split must be in [0, 1). Received: validation_split={self.validation_split!r}. "
                "Pass e.g. --validation-split 0.1."
            )
        if self.batch_size is not None and self.per_replica_batch_size is not None:
            raise ConfigError(
                "Give either batch_size (global) or per_replica_batch_size, not both. "
                f"Received: batch_size={self.batch_size}, "
                f"per_replica_batch_size={self.per_replica_batch_size}."
            )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimization, callback and search settings, for any task.

    Attributes:
        epochs: passes over the training set. Defaults to 10.
        learning_rate: the (peak) learning rate. Defaults to None (the task's or the optimizer's).
        lr_schedule: `"constant"` or `"cosine"` (`CosineDecay` to 0; Loshchilov & Hutter 2017). Defaults to "constant".
        verbose: `fit` verbosity: 0 silent, 1 progress bar, 2 one line per epoch. Defaults to 1.
        profile: `"START,STOP"` optimizer steps to profile (`ProfilerWindow`). Defaults to None.
        tune: keras-tuner trials run first (`Task.tune_space`); 0 is off. Defaults to 0.
        tuner: one of `TUNERS`. Defaults to "random".
        gradient_accumulation_steps: micro-batches per optimizer step (`tftrain.train.accumulation`). Defaults to 1.
        backup_every_steps: also back up every N optimizer steps (`StepBackup`). Defaults to None (epoch ends only).
        early_stopping: patience in epochs on `monitor` (else `val_loss`), restoring the best weights. Defaults to None.
        callbacks: `"WHERE:NAME[,...]"`, added after tftrain's own (`tftrain.train.user_callbacks`). Defaults to None.
        keep_best: keep the N best epochs by `monitor`, and the last, in `checkpoints/` (`KeepBest`). Defaults to 0.
        monitor: the metric `keep_best`, `early_stopping` and `--tune` rank by. Defaults to None (each one's own).
        monitor_mode: `"min"`, `"max"` or `"auto"` (from the metric's name). Defaults to `"auto"`.
        init_from: a `.keras` file, checkpoint or run directory to start from (`init_weights`). Defaults to None.
        mlflow: MLflow tracking URI (`default`: `$MLFLOW_TRACKING_URI`; `tftrain.train.mlflow_log`). Defaults to None.
        export: comma-separated `saved_model`, `onnx`, `litert`, each checked (`train.export`). Defaults to None.

    Raises:
        ConfigError: a value out of range.
    """

    epochs: int = _field(10, "passes over the training set", minimum=1)
    learning_rate: Optional[float] = _field(None, "learning rate (peak, under a schedule; None: the task's or the optimizer's)")
    lr_schedule: str = _field("constant", "learning-rate schedule (cosine: decay to 0 over the run)", LR_SCHEDULES)
    verbose: int = _field(1, "0 silent, 1 progress bar, 2 one line per epoch", choices=(0, 1, 2))
    profile: Optional[str] = _field(None, "profile optimizer steps START,STOP into TensorBoard, e.g. 10,15", metavar="START,STOP")
    tune: int = _field(0, "keras-tuner trials over learning rate, batch size, task knobs (0 = off)", minimum=0)
    tuner: str = _field("random", "keras-tuner algorithm", TUNERS)
    gradient_accumulation_steps: int = _field(
        1, "micro-batches per optimizer step (effective global batch = global batch x N)", minimum=1)
    backup_every_steps: Optional[int] = _field(
        None, "also back up every N optimizer steps: a killed run loses at most N (None: at epoch ends only)", minimum=1)
    early_stopping: Optional[int] = _field(
        None, "stop when --monitor (default val_loss) has not improved for PATIENCE epochs; keep the best weights "
              "(None: off)", minimum=0,
        metavar="PATIENCE")
    callbacks: Optional[str] = _field(
        None, "your own Keras callbacks: FILE.py:NAME or MODULE:NAME, comma-separated", metavar="WHERE:NAME[,...]")
    keep_best: int = _field(0, "keep the N best epochs' weights by --monitor, and the last, in checkpoints/ (0: off)",
                            minimum=0, metavar="N")
    monitor: Optional[str] = _field(None, "metric --keep-best ranks by (None: val_loss with validation data, else "
                                          "loss), --early-stopping watches (None: val_loss) and --tune's trials "
                                          "(None: val_accuracy, else val_loss)",
                                    metavar="METRIC")
    monitor_mode: str = _field("auto", "whether --monitor improves as it falls (min) or rises (max); auto: from its "
                                       "name", ("auto", "min", "max"))
    init_from: Optional[str] = _field(None, "start from these weights: a .keras file, a checkpoint, or a run directory "
                                            "(its best checkpoint)", metavar="PATH")
    export: Optional[str] = _field(None, "after training, write the model for serving and check each artifact: "
                                         "saved_model, onnx, litert (comma-separated)", metavar="FORMATS")
    mlflow: Optional[str] = _field(None, "log settings, epoch metrics, final figures and files to MLflow at this "
                                         "tracking URI ('default': $MLFLOW_TRACKING_URI)", metavar="TRACKING_URI")

    def __post_init__(self):
        _validate_fields(self)
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ConfigError(
                f"learning_rate must be positive. Received: learning_rate={self.learning_rate!r}."
            )
        if self.profile is not None:
            parse_profile_window(self.profile)

    @property
    def profile_window(self) -> Optional[tuple]:
        """`profile` as `(start, stop)` ints, or None."""
        return None if self.profile is None else parse_profile_window(self.profile)


def parse_profile_window(text: str) -> tuple:
    """Parses `"START,STOP"` into `(start, stop)` with 0 <= start < stop; else raises `ConfigError`."""
    parts = str(text).replace(" ", "").split(",")
    try:
        start, stop = (int(p) for p in parts)
    except ValueError:
        start = stop = None
    if start is None or start < 0 or stop <= start:
        raise ConfigError(
            f"Invalid profile {text!r}. Expected START,STOP optimizer steps with 0 <= START < STOP, "
            f"e.g. --profile 10,15. Received: profile={text!r}."
        )
    return start, stop
