"""`FitLoop`: `Model.fit` in one process, the base every loop refines by saying what it supports."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from typing import Callable, Optional, Sequence

from tftrain import config as config_lib
from tftrain.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class FitLoop:
    """`Model.fit` in one process (default, one_device and mirrored strategies).

    Attributes:
        per_step_hooks: batch-level callbacks fire (elsewhere the NaN guard checks once per epoch).
        times_execution: `--execution auto` may time graph against XLA.
        in_process_search: `--tune` and `--batch-size auto` can run.
        checks_input: this process's input pipeline can be timed alone (the input-bound verdict).
        needs_steps_per_epoch: the task must know `num_train_examples`.
        no_search_reason: why `--tune` and `--batch-size auto` cannot run; "" where they can.
    """

    name: str = "Model.fit"
    per_step_hooks: bool = True
    times_execution: bool = True
    in_process_search: bool = True
    checks_input: bool = True
    needs_steps_per_epoch: bool = False
    executions: tuple = config_lib.EXECUTIONS
    accumulates: bool = True
    no_search_reason: str = ""
    weighs_classes: bool = True

    def serves(self, cluster) -> bool:
        """Whether this process only serves the job."""
        return False

    def job(self, cluster):
        """A context manager around the run after set-up."""
        return contextlib.nullcontext()

    def steps_per_execution_for(self, requested: int, batches_per_epoch: Optional[int]) -> int:
        """The steps per execution this loop runs."""
        return requested

    def check(self, cfg: config_lib.RecipeConfig) -> None:
        """Raises `ConfigError` for flags this loop cannot honour, before any work."""
        auto_batch = cfg.data.batch_size == config_lib.AUTO_BATCH
        if cfg.train.tune and auto_batch:
            raise ConfigError("--tune searches the batch size itself; drop --batch-size auto "
                              "(or drop --tune to only search the batch size).")
        if cfg.train.tune and os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1"):  # TensorFlow's test
            raise ConfigError("--tune runs keras-tuner, which needs Keras 3, but TF_USE_LEGACY_KERAS makes tf.keras "
                              "the legacy tf_keras (keras-team/keras-tuner#1027). Unset TF_USE_LEGACY_KERAS, "
                              "or drop --tune.")
        why = f"{cfg.runtime.strategy}: {self.no_search_reason}"
        if cfg.train.tune and not self.in_process_search:
            raise ConfigError(f"keras-tuner runs each trial in one process; {why}. Tune with a single-process strategy "
                              "(--strategy mirrored, one_device or default), then train the best configuration here.")
        if auto_batch and not self.in_process_search:
            raise ConfigError(f"--batch-size auto searches in one process; {why}. Search on one machine "
                              "(--batch-size auto --strategy mirrored), then pass the result with --batch-size N.")
        if cfg.train.profile is not None and not self.per_step_hooks:
            raise ConfigError(f"--profile needs per-step hooks, which {self.name} lacks. "
                              "Profile a single-process run instead.")
        if cfg.runtime.execution not in self.executions:
            raise ConfigError(f"execution={cfg.runtime.execution!r} is not available with {self.name}. "
                              f"Pass --execution {' or '.join(self.executions)}.")
        self._check_accumulation(cfg)

    def _check_accumulation(self, cfg: config_lib.RecipeConfig) -> None:
        steps = cfg.train.gradient_accumulation_steps
        if steps == 1:
            return
        if not self.accumulates:
            raise ConfigError(f"--gradient-accumulation-steps {steps} is not supported by {self.name} (each "
                              "worker applies its own steps asynchronously). Drop it, or use --strategy "
                              "multi_worker_mirrored.")
        if cfg.train.tune:
            raise ConfigError(f"--tune trains its trials without gradient accumulation, so it would pick a batch size "
                              f"for updates of one batch, not {steps}. Tune without --gradient-accumulation-steps "
                              "first, then train the best configuration with it.")

    def compile(self, model, compile_args: dict, runtime) -> None:
        """`model.compile` with the runtime's execution options, in the strategy's scope."""
        with runtime.strategy.scope():
            model.compile(**compile_args, **runtime.compile_options())

    def fit(self, model, train_data: Callable, *, epochs: int, steps_per_epoch: Optional[int],
            callbacks: Sequence, verbose: int, validation_data=None, runtime=None, say=print,
            class_weight=None):
        """Trains with `Model.fit` on `train_data()`; returns the `History`.

        Args:
            train_data: `(input_context=None) -> tf.data.Dataset`.
            epochs: last epoch (a backup resumes where it stopped).
            steps_per_epoch: used when the dataset repeats forever.
            say: prints a line about a setting the loop changed. Defaults to `print`.
        """
        from tftrain.runtime.epoch_ends import EpochEnds
        from tftrain.runtime.input_release import released_off_thread

        dataset = train_data()
        ender = _epoch_ender(model, dataset)
        dataset, steps = one_iterator(dataset, steps_per_epoch, _steps_per_execution(model),
                                      epoch_ends_at=ender.steps_per_epoch if ender else None)
        marker = [ender.epoch_callback()] if ender is not None else []
        validation_data, validation_steps = _validation_iterator(validation_data, _steps_per_execution(model))
        try:
            with released_off_thread() as release, warnings.catch_warnings():
                if steps is None:  # an epoch is one pass of data of unknown size: its end is no shortage
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                return model.fit(dataset, epochs=epochs, steps_per_epoch=steps,
                                 callbacks=[*marker, *callbacks, release], verbose=verbose,
                                 validation_data=validation_data, validation_steps=validation_steps,
                                 shuffle=False, class_weight=class_weight)
        finally:
            if isinstance(model.train_function, EpochEnds):  # not for a later fit
                model.train_function = None

    def evaluate(self, model, dataset) -> dict:
        """`Model.evaluate` as a `{name: float}` dict."""
        from tftrain.callbacks.scalar_logs import scalar_logs

        with warnings.catch_warnings():  # the end of data of unknown size ends the evaluation, as it should
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            results = scalar_logs(model.evaluate(dataset, verbose=0, return_dict=True))
        return {name: float(value) for name, value in results.items()}


def _steps_per_execution(model) -> int:
    return max(1, int(getattr(model, "steps_per_execution", 1) or 1))


def _epoch_ender(model, dataset):
    """The train function if it ends epochs itself, else an `EpochEnds` installed for finite data whose epoch
    ends inside an execution, else None."""
    import tensorflow as tf

    from tftrain.runtime.epoch_ends import EpochEnds

    function, batches = model.train_function, int(dataset.cardinality())
    if getattr(function, "ends_epochs", False):
        if batches != tf.data.INFINITE_CARDINALITY:  # endless: the epoch is steps_per_epoch
            _at_the_data_s_length(function, batches)
        return function if function.ends_epochs else None
    return EpochEnds(model, batches).install() if EpochEnds.applies(model, batches) else None


def _at_the_data_s_length(function, batches: int) -> None:
    """Sets `function`'s epoch length to the data's pass (None if unknown)."""
    function.steps_per_epoch = batches if batches > 0 else None


def _validation_iterator(validation_data, steps_per_execution: int) -> tuple:
    """`(validation_data, validation_steps)` for `fit`, repeated as `one_iterator` does."""
    if validation_data is None or not hasattr(validation_data, "cardinality"):
        return validation_data, None
    return one_iterator(validation_data, None, steps_per_execution)


def one_iterator(dataset, steps_per_epoch: Optional[int], steps_per_execution: int,
                 epoch_ends_at: Optional[int] = None):
    """`(dataset, steps_per_epoch)` for `Model.fit` so that Keras keeps one iterator for the run (on finite data
    it rebuilds it every epoch). Data whose pass is a whole number of executions, or `epoch_ends_at`, is repeated,
    one pass an epoch; other finite data is left (on endless data Keras would run past the epoch's end). After a
    resume inside an epoch, later epochs start mid-pass. `steps_per_epoch` is None for data left finite."""
    import tensorflow as tf

    batches = int(dataset.cardinality())
    if batches == tf.data.INFINITE_CARDINALITY:
        return dataset, steps_per_epoch
    if batches > 0 and (batches % steps_per_execution == 0 or batches == epoch_ends_at):
        return dataset.repeat(), batches
    return dataset, None
