"""One validated configuration tree for a training run.

The tree is four frozen dataclasses: `RuntimeConfig` (threads, devices, precision,
execution, strategy), `DataConfig` (input pipeline, batch size, validation split),
`TrainConfig` (epochs, learning rate, callbacks, search) and `RecipeConfig`, which
holds the other three plus the seed, the run directory and the task's own
hyperparameters (`task`: a frozen dataclass the task declares; its fields are
declared with `hparam`). Each dataclass validates itself when it is built, so a
config that exists is a valid one; bad values raise `tftrain.errors.ConfigError` with
a one-line message naming the value and the fix.

A recipe file (YAML) has one mapping per section, with the field names as keys:

```yaml
seed: 0
run_dir: null
runtime: {strategy: mirrored, precision: auto, execution: graph}
data: {batch_size: 128}
train: {epochs: 10}
task: {model: mlp}       # the task's own hyperparameters (here MNIST's)
```

Values are merged in this order, later ones winning: the recipe's defaults, the
recipe file, then command-line flags (see `tftrain.cli`). This module imports no
TensorFlow, so it is cheap to import and test.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Mapping, Optional

import yaml

from tftrain.errors import ConfigError

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server")
"""Strategy names accepted by `RuntimeConfig.strategy`."""

STRATEGY_ALIASES = {"multi_worker": "multi_worker_mirrored", "ps": "parameter_server"}
"""Alternative spellings, mapped to their canonical strategy name."""

MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
"""Strategies whose processes form a cluster (TF_CONFIG or SLURM)."""

DEVICES = ("auto", "cpu", "gpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
THREAD_MODES = ("auto", "default")
"""`RuntimeConfig.threads`: the doctor's measured counts when there are some, or TensorFlow's defaults."""

EXECUTIONS = ("auto", "eager", "graph", "xla")
COMMUNICATIONS = ("auto", "ring", "nccl")
TUNERS = ("random", "hyperband", "bayesian")
AUTO_BATCH = "auto"
"""`batch_size: auto` searches the global batch size (`tftrain.tuning.find_batch_size`)."""
LR_SCHEDULES = ("constant", "cosine")

AUTO_STEPS_PER_EXECUTION = 8
"""`steps_per_execution: auto` compiles with 8 steps per `tf.function` call on one replica, then
times 32 and 64 where the training loop allows (`Trainer.choose_execution`); loops that time
nothing (multi-worker, parameter server) keep 8."""


def hparam(default, help: str = "", choices=None, minimum=None, special=(), metavar=None):
    """A dataclass field with its command-line help, choices and lower bound.

    Use it to declare a task's own hyperparameters; each becomes a flag
    (`width` -> `--width`) and a key of the recipe file's `task:` section,
    validated like tftrain's own fields.

    Args:
        default: the default value (int, float, str, bool or None).
        help: one line shown by `--help`. Defaults to "".
        choices: the allowed values, or None for any. Defaults to None.
        minimum: the smallest allowed number, or None. Defaults to None.
        special: strings accepted besides the field's type (e.g. `"auto"`).
            Defaults to ().
        metavar: the value's name in `--help`. Defaults to None (`N` for
            ints, `F` for floats, else the last word of the name).

    Returns:
        A `dataclasses.field`.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class HParams:
        ...     width: int = hparam(64, "hidden units", minimum=1)
        ...     activation: str = hparam("relu", "hidden activation", choices=("relu", "gelu"))
    """
    metadata = {"help": help, "choices": choices, "minimum": minimum, "special": tuple(special), "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


_field = hparam


def _expect_choice(name, value, choices, fix=""):
    if value not in choices:
        raise ConfigError(
            f"Invalid {name} {value!r}. Expected one of: {', '.join(choices)}. "
            f"Received: {name}={value!r}.{(' ' + fix) if fix else ''}"
        )


def _validate_fields(obj) -> None:
    """Checks types, choices and lower bounds declared in each field's metadata."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kind, optional = _field_kind(hints[f.name])
        if not isinstance(kind, type):  # e.g. Tuple[int, ...]: the task checks it itself
            continue
        if value is None:
            if optional:
                continue
            raise ConfigError(f"{f.name} must be set. Received: {f.name}=None.")
        special = f.metadata.get("special") or ()
        if isinstance(value, str) and value in special:
            continue
        if kind is float and isinstance(value, str):  # YAML 1.1 reads `1e-3` as a string
            try:
                value = float(value)
                object.__setattr__(obj, f.name, value)
            except ValueError:
                pass
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            object.__setattr__(obj, f.name, value)
        if kind is bool and not isinstance(value, bool) or (
            kind is not bool and (isinstance(value, bool) or not isinstance(value, kind))
        ):
            also = "".join(f" or {v!r}" for v in special)
            raise ConfigError(
                f"{f.name} must be of type {kind.__name__}{also}. "
                f"Received: {f.name}={value!r} ({type(value).__name__})."
            )
        choices = f.metadata.get("choices")
        if choices:
            _expect_choice(f.name, value, choices)
        minimum = f.metadata.get("minimum")
        if minimum is not None and value < minimum:
            word = "positive" if minimum == 1 else f">= {minimum}"
            raise ConfigError(
                f"{f.name} must be {word}. Received: {f.name}={value!r}. "
                f"Pass a value >= {minimum}."
            )


def _field_kind(hint):
    """Returns (base type, is_optional) for `int`, `Optional[int]`, ... hints."""
    args = typing.get_args(hint)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), True
    return hint, False


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Threads, devices, precision, execution mode and distribution strategy.

    Attributes:
        strategy: `tf.distribute` strategy name: one of `STRATEGIES`
            (`multi_worker` is an alias of `multi_worker_mirrored`, `ps` of
            `parameter_server`). Defaults to `"default"` (TensorFlow's default
            strategy, one device).
        device: `"auto"` (GPUs if any, else the CPU), `"cpu"` or `"gpu"`.
            Defaults to `"auto"`.
        precision: Keras dtype policy: one of `PRECISIONS`. `"auto"` picks
            `mixed_float16` on GPUs of compute capability >= 7.0, `mixed_bfloat16`
            on CPUs with native bfloat16, else `float32`. Defaults to `"auto"`.
        execution: `"auto"` (time a few training steps of graph and XLA on the
            run's own model and batch, keep the faster: see
            `tftrain.runtime.execution_trial`), `"eager"`
            (`run_eagerly=True`), `"graph"` (`tf.function`) or `"xla"`
            (`jit_compile=True`). Defaults to `"auto"`.
        remember_execution: `--execution auto` reuses the choice an earlier run
            timed for the same model, batch shapes, `steps_per_execution`,
            devices, threads and TensorFlow / Keras versions, so it times
            nothing (`tftrain.runtime.execution_memory`); False times every run
            (`--no-remember-execution`). Defaults to True.
        steps_per_execution: optimizer steps run per `tf.function` call
            (Keras `compile(steps_per_execution=...)`), or `"auto"`: on one
            replica 8, or 32 or 64 where timing finds them more than 5% faster
            (at most an epoch, dividing `--backup-every-steps`; 1 when 8 does
            not fit; remembered with `--execution auto`'s choice), 8 where
            nothing is timed. With several replicas
            1 runs whatever is asked (Keras 3, keras-team/keras#19246). Keras's
            batch callbacks fire once per execution. Defaults to 1 (Keras's
            default, so a user's batch callbacks fire every step).
        intra_op_threads: threads one op may use; 0 keeps TensorFlow's default
            (one per core). Defaults to 0.
        inter_op_threads: ops run concurrently; 0 keeps TensorFlow's default.
            Defaults to 0.
        threads: what thread counts left at 0 mean: `"auto"` applies the
            counts `python -m tftrain.doctor` measured on this machine (child
            processes timing reference models; remembered with the execution
            choices, `tftrain.runtime.thread_choice`), TensorFlow's defaults
            when it never measured or with `remember_execution=False`;
            `"default"` always keeps TensorFlow's defaults. Defaults to `"auto"`.
        cpu_replicas: number of logical devices to split the CPU into, so
            `mirrored` can run N replicas without GPUs. Defaults to 1.
        communication: collective implementation for `multi_worker_mirrored`:
            `"auto"`, `"ring"` (gRPC ring all-reduce) or `"nccl"`. Defaults to
            `"auto"`.
        ps_tasks: ps tasks of a `parameter_server` job laid out from a SLURM
            job step (rank 0 is the chief, the next `ps_tasks` ranks are ps
            tasks, the rest workers); TF_CONFIG names its own tasks. Defaults to 1.
        nvtx: NVTX ranges for Nsight Systems on a GPU: sets
            `TF_ENABLE_NVTX_RANGES=1` before the runtime starts (TensorFlow's op
            ranges in NVIDIA's builds) and names each training execution
            (`tftrain.callbacks.NvtxSteps`); without a GPU it says it has
            nothing to do (`tftrain.runtime.nvtx`). Defaults to False.

    Raises:
        ConfigError: when a name is unknown or a count is out of range,
            `communication` / `ps_tasks` is set for a strategy that has no use for
            it, or `cpu_replicas` > 1 comes with a strategy other than `mirrored`
            or with `execution="xla"`.
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
        """`cpu_replicas` > 1 serves the mirrored strategy only, and never XLA (known before TensorFlow starts)."""
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
    """Raises `ConfigError` (naming the nearest sizes that work) when the global `batch_size`
    does not divide evenly across `num_replicas` replicas."""
    if batch_size % num_replicas:
        lower = batch_size - batch_size % num_replicas
        options = f"--batch-size {lower} or {lower + num_replicas}" if lower else f"--batch-size {num_replicas}"
        raise ConfigError(
            f"Global batch size {batch_size} does not divide evenly across {num_replicas} replicas. "
            f"Pass {options}, or --per-replica-batch-size {max(1, batch_size // num_replicas)}."
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Input pipeline settings.

    Give at most one of `batch_size` (global: all replicas together) and
    `per_replica_batch_size`; global = per-replica x number of replicas.

    Attributes:
        data_dir: where the task reads its data (a folder or file; the task
            says what it expects, e.g. MNIST: an IDX folder or `.npz`; the image
            folder recipe: one sub-folder per class); None uses the task's
            default. Defaults to None.
        train_examples: train on the first N training examples only (smoke runs);
            None uses all. Defaults to None.
        validation_split: fraction of the training examples held out as
            validation data (the last fraction, as Keras's
            `fit(validation_split=...)` takes it), for `fit`'s `val_*` metrics
            and for model selection (`--tune`); 0 holds out none (a task may
            bring its own validation set). In [0, 1). Defaults to 0.
        batch_size: global batch size (examples per optimizer step, all replicas
            together), or `"auto"` to search it before training
            (`tftrain.tuning.find_batch_size`, best examples/sec). Defaults to
            None (the recipe picks).
        per_replica_batch_size: examples per replica per step. Defaults to None.
        shuffle_buffer: shuffle buffer size in examples; 0 shuffles the whole
            training set. Defaults to 0.
        cache: cache the decoded examples in memory after the first epoch
            (file sources; in-memory arrays need no cache). Defaults to True.
        parallel_map: run the preprocessing map with `num_parallel_calls=AUTOTUNE`.
            Defaults to True.
        prefetch: prefetch batches with `buffer_size=AUTOTUNE`. Defaults to True.
        private_threads: size of the pipeline's private tf.data thread pool; 0
            uses the shared pool. Defaults to 0.

    Raises:
        ConfigError: when a size is out of range or both batch sizes are given.
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
        learning_rate: the optimizer's learning rate (the peak, under a
            schedule); None keeps the task's or the optimizer's default.
            Defaults to None.
        lr_schedule: `"constant"`, or `"cosine"`: decay from `learning_rate` to 0
            over the run's optimizer steps along a half cosine
            (`keras.optimizers.schedules.CosineDecay`; Loshchilov & Hutter,
            "SGDR", 2017). Defaults to `"constant"`.
        verbose: Keras `fit` verbosity: 0 silent, 1 progress bar, 2 one line
            per epoch. Defaults to 1.
        profile: `"START,STOP"`: capture a TensorBoard profile of optimizer
            steps [START, STOP) (`tftrain.callbacks.ProfilerWindow`); None
            captures none. Defaults to None.
        tune: run this many keras-tuner trials over learning rate, batch size
            and the task's tunable hyperparameters (`Task.tune_space`) first,
            scored on validation data, then train the best; 0 is off. Defaults
            to 0.
        tuner: keras-tuner algorithm: one of `TUNERS`. Defaults to "random".
        gradient_accumulation_steps: micro-batches per optimizer step: each
            step reads N batches of the global batch size and updates once with
            the mean of their gradients, so the effective global batch is
            global batch x N (`tftrain.train.accumulation`). Defaults to 1 (no
            accumulation).
        backup_every_steps: back up the training state every N optimizer
            steps as well as at each epoch end (`tftrain.callbacks.StepBackup`),
            so a killed run loses at most N steps and its rerun resumes at the
            step it was saved at; None backs up at epoch ends only. Defaults to
            None.
        early_stopping: stop when `val_loss` has not improved for this many
            epochs (the patience) and keep the best epoch's weights
            (`keras.callbacks.EarlyStopping`, `restore_best_weights=True`);
            needs validation data; None is off. Defaults to None.
        callbacks: the user's own Keras callbacks, `"WHERE:NAME[,WHERE:NAME...]"`
            (WHERE a `.py` file or a module, as for a task; NAME a callback, a
            callback class, or a function returning a callback or a list of
            them), added after tftrain's own (`tftrain.train.user_callbacks`);
            None adds none. Defaults to None.

    Raises:
        ConfigError: when a value is out of range.
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
        None, "stop when val_loss has not improved for PATIENCE epochs; keep the best weights (None: off)", minimum=0,
        metavar="PATIENCE")
    callbacks: Optional[str] = _field(
        None, "your own Keras callbacks: FILE.py:NAME or MODULE:NAME, comma-separated", metavar="WHERE:NAME[,...]")

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


def deterministic_config(config: "RecipeConfig") -> "RecipeConfig":
    """`config` as `--deterministic` runs it: a seed (0 when none), `execution` `auto` -> `graph` and
    `steps_per_execution` `auto` -> `AUTO_STEPS_PER_EXECUTION` (timed choices differ between runs); the
    config unchanged without `deterministic`. The Trainer also enables TensorFlow's op determinism and
    keeps `--precision auto`'s rule untimed.

    Source: https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_op_determinism
    """
    if not config.deterministic:
        return config
    runtime = config.runtime
    runtime = dataclasses.replace(
        runtime, execution="graph" if runtime.execution == "auto" else runtime.execution,
        steps_per_execution=AUTO_STEPS_PER_EXECUTION if runtime.steps_per_execution == "auto"
        else runtime.steps_per_execution)
    return dataclasses.replace(config, runtime=runtime, seed=0 if config.seed is None else config.seed)


def parse_profile_window(text: str) -> tuple:
    """Parses `"START,STOP"` into `(start, stop)` with 0 <= start < stop.

    Raises:
        ConfigError: naming the value and the expected form.
    """
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


SECTIONS = {"runtime": RuntimeConfig, "data": DataConfig, "train": TrainConfig}

TASK_SECTION = "task"
"""The recipe-file section (and `RecipeConfig` field) holding the task's own hyperparameters."""


def check_hparams(hparams) -> None:
    """Validates a task's hyperparameters: a frozen dataclass instance, or None.

    Fields declared with `hparam` are checked for type, choices and lower bound;
    their names must differ from tftrain's own field names (each becomes a flag).

    Raises:
        ConfigError: on a value out of range, or on a dataclass that is not
            frozen or whose field name clashes with one of tftrain's.
    """
    if hparams is None:
        return
    if not dataclasses.is_dataclass(hparams) or isinstance(hparams, type):
        raise ConfigError(
            f"A task's hparams must be a dataclass instance (e.g. HParams()), or None. "
            f"Received: {type(hparams).__name__}."
        )
    if not type(hparams).__dataclass_params__.frozen:
        raise ConfigError(f"{type(hparams).__name__} must be a frozen dataclass: @dataclasses.dataclass(frozen=True).")
    clash = sorted({f.name for f in dataclasses.fields(hparams)} & set(_builtin_field_index()))
    if clash:
        raise ConfigError(
            f"Task hyperparameter {clash[0]!r} has the name of a tftrain field (flag --{clash[0].replace('_', '-')}). "
            "Rename it in the task's hparams dataclass."
        )
    _validate_fields(hparams)


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """The whole configuration of one run.

    Attributes:
        runtime: `RuntimeConfig`. Defaults to `RuntimeConfig()`.
        data: `DataConfig`. Defaults to `DataConfig()`.
        train: `TrainConfig`. Defaults to `TrainConfig()`.
        seed: seeds Python, NumPy, TensorFlow and the shuffle order, making runs
            repeatable; None leaves them random. Defaults to None.
        run_dir: where the run's config, logs, checkpoint, model and metrics go;
            None makes `runs/<task name>-<timestamp>` under the working
            directory. Defaults to None.
        resume: without `run_dir`, resume the newest unfinished run of the same
            task and configuration under `runs/` (`--resume`; none found is an
            error). Defaults to False.
        deterministic: repeatable figures (`--deterministic`): TensorFlow's op
            determinism (`tf.config.experimental.enable_op_determinism`), a seed
            (0 when `seed` is None), and no setting chosen by timing (`execution`
            `auto` runs graph, `steps_per_execution` `auto` runs
            `AUTO_STEPS_PER_EXECUTION`, `precision` `auto` keeps its rule); see
            `deterministic_config`. Defaults to False.
        task: the task's own hyperparameters, a frozen dataclass instance whose
            fields are declared with `hparam` (recipe-file section `task:`,
            one flag per field); None when the task declares none. Defaults to
            None.

    Raises:
        ConfigError: when a section has the wrong type, a value is invalid, or
            a fixed global `batch_size` does not divide across `cpu_replicas`.
    """

    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    seed: Optional[int] = _field(None, "random seed (repeatable runs)", minimum=0)
    run_dir: Optional[str] = _field(None, "run directory (None: runs/<task>-<time>)")
    resume: bool = _field(False, "resume the newest unfinished run of this task and settings under runs/")
    deterministic: bool = _field(False, "repeatable figures: op determinism, a seed, no setting chosen by timing")
    task: Any = None

    def __post_init__(self):
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}.")
        check_hparams(self.task)
        for f in _top_level_fields():
            value = getattr(self, f.name)
            if value is None:
                continue
            kind, _ = _field_kind(typing.get_type_hints(RecipeConfig)[f.name])
            if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
                raise ConfigError(
                    f"{f.name} must be of type {kind.__name__}. Received: {f.name}={value!r}."
                )
            minimum = f.metadata.get("minimum")
            if minimum is not None and value < minimum:
                raise ConfigError(f"{f.name} must be >= {minimum}. Received: {f.name}={value!r}.")
        runtime, batch_size = self.runtime, self.data.batch_size
        if runtime.cpu_replicas > 1 and isinstance(batch_size, int) and not self.train.tune:
            check_batch_divides(batch_size, runtime.cpu_replicas)  # before TensorFlow starts

    def to_dict(self) -> dict:
        """Returns the config as nested plain dicts (the recipe-file layout; `task` only when set)."""
        out = dataclasses.asdict(self)
        if self.task is None:
            out.pop(TASK_SECTION)
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config", task=None) -> "RecipeConfig":
        """Builds a config from nested dicts in the recipe-file layout.

        Args:
            values: mapping with optional keys `runtime`, `data`, `train` (each a
                mapping of field names), `task` (the task's hyperparameters) and
                `seed`, `run_dir`.
            source: where the values came from, named in error messages.
                Defaults to `"config"`.
            task: the task's default hyperparameters (a frozen dataclass
                instance), which a `task` section overrides. Defaults to None.

        Returns:
            A validated `RecipeConfig`; fields not given keep their defaults.

        Raises:
            ConfigError: on an unknown key, a wrong type or an invalid value.
        """
        return merge(cls(task=task), values, source)

    def override(self, flat: Mapping[str, Any]) -> "RecipeConfig":
        """Returns a copy with fields replaced by flat `{field_name: value}` pairs.

        Field names are unique across sections (the task's hyperparameters
        included), so `{"strategy": "mirrored"}` sets `runtime.strategy`.
        Setting one of `batch_size` and `per_replica_batch_size` clears the
        other.

        Raises:
            ConfigError: on an unknown field name or an invalid value.
        """
        return merge(self, _flat_over_nested({}, flat, self), "overrides")


def _top_level_fields():
    return [f for f in dataclasses.fields(RecipeConfig) if f.name not in SECTIONS and f.name != TASK_SECTION]


def _builtin_field_index() -> dict:
    index = {f.name: None for f in _top_level_fields()}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            index[f.name] = section
    return index


def flat_field_index(config: Optional[RecipeConfig] = None) -> dict:
    """Maps every field name to its section name (None for top-level fields).

    Args:
        config: a config whose task hyperparameters are included (section
            `"task"`). Defaults to None (tftrain's own fields only).
    """
    index = _builtin_field_index()
    if config is not None and config.task is not None:
        index.update({f.name: TASK_SECTION for f in dataclasses.fields(config.task)})
    return index


_BATCH_FIELDS = ("batch_size", "per_replica_batch_size")


def _merge_section(name: str, cls, current: dict, given, source: str):
    """`cls(**current)` with the mapping `given` laid over it; names the bad key."""
    given = given or {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"Section {name!r} in {source} must be a mapping. Received: {given!r}.")
    names = [f.name for f in dataclasses.fields(cls)]
    bad = [k for k in given if k not in names]
    if bad:
        raise ConfigError(
            f"Unknown key '{name}.{bad[0]}' in {source}. Expected one of: {', '.join(names)}."
        )
    if name == "data" and any(k in given for k in _BATCH_FIELDS):
        for k in _BATCH_FIELDS:
            current[k] = None
    current.update(given)
    try:
        return cls(**current)
    except TypeError as e:  # a task's own dataclass rejecting a value in its __init__
        raise ConfigError(f"Section {name!r} in {source}: {e}.") from None


def _merge_task(base: RecipeConfig, given, source: str):
    if given is None:
        return base.task
    if base.task is None:
        raise ConfigError(
            f"{source} has a '{TASK_SECTION}' section, but this task declares no hyperparameters. Remove the section."
        )
    return _merge_section(TASK_SECTION, type(base.task), dataclasses.asdict(base.task), given, source)


def merge(base: RecipeConfig, values: Mapping[str, Any], source: str) -> RecipeConfig:
    """Returns `base` with the nested `values` laid over it.

    A layer that sets one of `batch_size` / `per_replica_batch_size` clears the
    other one from `base`, so a command-line `--per-replica-batch-size` replaces a
    recipe file's `batch_size` instead of clashing with it.

    Raises:
        ConfigError: on an unknown section or key, naming `source`.
    """
    if values is None:
        return base
    if not isinstance(values, Mapping):
        raise ConfigError(
            f"{source} must hold a mapping of sections (runtime, data, train, task). "
            f"Received: {type(values).__name__}."
        )
    top_names = [f.name for f in _top_level_fields()]
    allowed = list(SECTIONS) + [TASK_SECTION] + top_names
    unknown = [k for k in values if k not in allowed]
    if unknown:
        raise ConfigError(
            f"Unknown key {unknown[0]!r} in {source}. Expected one of: {', '.join(allowed)}."
        )
    sections = {
        name: _merge_section(name, cls, dataclasses.asdict(getattr(base, name)), values.get(name), source)
        for name, cls in SECTIONS.items()
    }
    task = _merge_task(base, values.get(TASK_SECTION), source)
    top = {k: values[k] if k in values else getattr(base, k) for k in top_names}
    return RecipeConfig(**sections, **top, task=task)


def load_yaml(path: str | os.PathLike) -> dict:
    """Reads a recipe file into nested dicts (not yet validated).

    Raises:
        ConfigError: when the file is missing, a directory, unreadable, not
            UTF-8, or not valid YAML.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"Recipe file {path!r} is a directory. Pass --config with a YAML file.")
    if not os.path.isfile(path):
        raise ConfigError(f"Recipe file {path!r} does not exist. Pass --config with an existing YAML file.")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"Recipe file {path!r} is not UTF-8 text (byte {e.start} cannot be decoded). Save it as UTF-8."
        ) from None
    except OSError as e:
        raise ConfigError(f"Recipe file {path!r} cannot be read: {e.strerror}. Check its permissions.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"Recipe file {path!r} is not valid YAML{where}: {getattr(e, 'problem', e)}.") from None


def from_yaml(path: str | os.PathLike, base: Optional[RecipeConfig] = None,
              overrides: Optional[Mapping[str, Any]] = None) -> RecipeConfig:
    """Loads a recipe file and lays it over `base` (default: `RecipeConfig()`).

    `base` carries the task's hyperparameter dataclass, which the file's `task:`
    section overrides. `overrides` (flat `{field_name: value}`, as
    `RecipeConfig.override` takes them: command-line flags, a `Trainer`'s keyword
    arguments) win over the file; file and overrides are validated as one layer,
    so a combination is judged on what the run uses (a file's `cpu_replicas: 2`
    with `strategy="mirrored"` given as an override is valid).

    Raises:
        ConfigError: when the file is missing, not YAML, or holds bad values, or
            an override names an unknown field.
    """
    base = base or RecipeConfig()
    values = _flat_over_nested(load_yaml(path), overrides or {}, base)
    return merge(base, values, os.fspath(path))


def _flat_over_nested(values, flat: Mapping[str, Any], base: RecipeConfig):
    """Recipe-file `values` (nested) with the flat `{field_name: value}` pairs laid over them.

    Setting one of `batch_size` / `per_replica_batch_size` drops both from the
    file. Values that are not mappings are returned as they are, for `merge` to refuse.
    """
    if not isinstance(values, dict):
        return values
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in values.items()}
    if any(key in flat for key in _BATCH_FIELDS) and isinstance(out.get("data"), dict):
        for name in _BATCH_FIELDS:  # the file's only: both given in `flat` still clash
            out["data"].pop(name, None)
    index = flat_field_index(base)
    for key, value in flat.items():
        if key not in index:
            raise ConfigError(f"Unknown config field {key!r}. Expected one of: {', '.join(sorted(index))}.")
        section = index[key]
        if section is None:
            out[key] = value
            continue
        if out.get(section) is None:  # absent, or an empty `data:` line
            out[section] = {}
        if not isinstance(out[section], dict):
            return out  # merge names the section that is not a mapping
        out[section][key] = value
    return out


def to_yaml(config: RecipeConfig) -> str:
    """Serialises a config to YAML in the recipe-file layout (readable by `from_yaml`)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
