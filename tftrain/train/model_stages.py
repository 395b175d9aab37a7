"""The `Trainer`'s build stage and sanity pass: the task's model built in the strategy's scope,
checked, given float32 outputs under a mixed policy and compiled; a mixin of `Trainer`."""

from __future__ import annotations

import contextlib
from typing import Optional

from tftrain.errors import ConfigError, Preempted, cause_line
from tftrain.files import replaced
from tftrain.train.tasks.base import check_compile_args


class ModelStages:
    evaluation_error = None  # the test evaluation's error, once `evaluated` has caught one

    """`Trainer`'s stages that build and compile the model."""

    def build_model(self, compile_model: bool = True, fall_back: bool = True):
        """`task.build_model()` in the strategy's scope, built, compiled by the loop with the task's
        arguments (accumulating gradients under `--gradient-accumulation-steps`), float32 outputs under a
        mixed policy. Under `--seed` every build has the same initial weights. A model that does not
        build under the policy `--precision auto` chose is built in float32, unless `fall_back` is False."""
        with self.runtime.strategy.scope():  # the optimizer too: its variables belong to the strategy
            model = self._check_step_scaling(self._built_or_float32(fall_back))
            self._say_own_compile_is_replaced(model)
            if self.precision.info.compute_dtype != "float32":
                model = self._float32_outputs(model)
            if compile_model:
                self.compile_args = self._with_accumulation(check_compile_args(self.task.compile_args(self.steps_per_epoch)))
        if compile_model:
            self.loop.compile(model, self.compile_args, self.runtime)
            model._tftrain_compiled = True  # a build_model that returns this instance again did not compile it
        return model

    def save(self, model) -> None:
        """Saves `model.keras`: the task's model as built (not the float32-output cast a mixed policy adds, whose
        layers rename a list's outputs), compiled as `model` is (the run's optimizer, losses, metrics, execution
        mode and steps per execution), with the optimizer accumulation wraps."""
        from tftrain import _compat
        from tftrain import rundir as rundir_lib
        from tftrain.runtime.precision import user_model
        from tftrain.train.accumulation import saved_with_inner_optimizer

        with saved_with_inner_optimizer(model):
            saved = user_model(model)
            # The model with its output casts where the optimizer's slots would load in another order.
            if saved is not model and [id(v) for v in saved.trainable_variables] != [
                    id(v) for v in model.trainable_variables]:
                saved = model
            if saved is not model:  # shares the weights; compiled with the same optimizer, so its state is saved
                config = _compat.compile_config(model)
                try:
                    with self.runtime.strategy.scope():
                        saved.compile(optimizer=model.optimizer, **{key: config.get(key) for key in (
                            "loss", "loss_weights", "metrics", "weighted_metrics")},
                                  steps_per_execution=model.steps_per_execution, jit_compile=model.jit_compile,
                                  run_eagerly=model.run_eagerly)
                except Exception as error:  # noqa: BLE001 (the trained run is saved all the same)
                    self.console.warn(f"model.keras holds the model with its float32 output casts: the model as "
                                      f"built did not compile again ({type(error).__name__}: {error})")
                    saved = model
            with float32_output_layers(saved):
                write_model(saved, self.out_dir / rundir_lib.MODEL_FILE, self.console.warn)

    def evaluate(self, model) -> Optional[dict]:
        """The loop's evaluation on the task's test data (None when the task has none), with the output layers
        computing as `save` writes them (`float32_output_layers`) and the replicas' copies agreed
        (`agree_replicas`): the figures are `model.keras`'s."""
        from tftrain.runtime.precision import user_model

        from tftrain.runtime.strategy import agree_replicas

        if self.runtime.num_replicas > 1:  # before the save too: one copy is saved
            agree_replicas(model, self.runtime.strategy)
        dataset = self._evenly_first(self.task.test_data(self.batch.global_batch_size))
        if dataset is None:
            return None
        as_saved = self.precision.info.compute_dtype != "float32"
        with float32_output_layers(user_model(model)) if as_saved else contextlib.nullcontext():
            model.test_function = None  # traced by validation with the layers as trained
            try:
                return self.loop.evaluate(model, dataset)
            finally:
                model.test_function = None

    def evaluated(self, model) -> Optional[dict]:
        """`evaluate`'s figures; None when it fails other than by a stop signal: the trained run is saved all the
        same, `metrics.json` `evaluation` saying why, and `evaluation_failure()` is the run's last line."""
        try:
            return self.evaluate(model)
        except Exception as e:  # noqa: BLE001 (a run that has trained is never lost to a later step)
            if isinstance(e, Preempted) or self.preemption.requested() is not None:
                raise
            from tftrain.train.after_steps import failure_status

            self.extras["evaluation"], self.evaluation_error = failure_status(e), e
            return None

    def evaluation_failure(self) -> Optional[str]:
        """The line of a failed test evaluation (`evaluated`), else None."""
        status = self.extras.get("evaluation")
        return None if status is None else (
            f"the test evaluation failed after training ({status.removeprefix('failed: ')}); the trained model and "
            f"metrics.json (without test figures) are kept in {self.run_dir.path}: evaluate model.keras on the test "
            "data once it is fixed")

    def _built_or_float32(self, fall_back: bool = True):
        """The task's model, seeded and built; after a dtype clash under the mixed policy that
        `--precision auto` chose, built again in float32 (one line); any other error is raised."""
        if not fall_back:
            return self._built(self._seeded_build())
        return self.precision.or_float32(lambda: self._built(self._seeded_build()), "build")

    def _built(self, model):
        """`model`, built from the training data when it has no weights yet, as `Model.fit` would on its
        first batch: the float32-output cast and the backup need its weights before `fit` (keras-team/keras#20712)."""
        if model.built:
            return model
        import keras

        from tftrain.runtime.precision import built_by_own_step
        from tftrain.train.sanity import FeaturesRefused

        dataset = self.task.probe_data(self.batch.global_batch_size if self.batch else 32, 1)
        spec = dataset.element_spec
        if isinstance(model, keras.Sequential):  # symbolic: its outputs exist afterwards
            model.build(tuple((spec[0] if isinstance(spec, tuple) else spec).shape))
            return model
        for batch in dataset:  # a subclassed model builds its layers in call(): call it once
            try:
                model(batch[0] if isinstance(batch, tuple) else batch, training=False)
            except Exception as error:  # noqa: BLE001 (a GAN's or VAE's call() need not take the features)
                if not built_by_own_step(model):
                    raise FeaturesRefused(error) from error
        return model

    def _check_step_scaling(self, model):
        """`model`, or under `--precision auto` the model built again under another policy when its own
        `train_step` does not scale its loss under mixed_float16 (`PrecisionPlanner.for_unscaled_step`)."""
        sanity = getattr(self, "sanity", None)
        if not self.precision.info.loss_scaling or sanity is None or sanity.step_scales_loss is not False:
            return model
        if self.precision.for_unscaled_step(type(model).__name__, self.runtime.devices, self.console.warn):
            return self._built(self._seeded_build())
        return model

    def _say_own_compile_is_replaced(self, model) -> None:
        """Warns once when `build_model` returned a compiled model: tftrain compiles it again."""
        if getattr(model, "optimizer", None) is None or getattr(self, "_said_own_compile", False) \
                or getattr(model, "_tftrain_compiled", False):  # the same instance again, compiled by tftrain
            return
        self._said_own_compile = True
        task = self.task
        optimizer = task.optimizer if isinstance(task.optimizer, str) else type(task.optimizer).__name__
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        own = ["jit_compile=True (--execution xla)"] if getattr(model, "jit_compile", None) is True else []
        own += [f"steps_per_execution={spe} (--steps-per-execution {spe})"] if spe > 1 else []
        self.console.warn(
            f"build_model returned a model compiled with {type(model.optimizer).__name__}; tftrain compiles it again "
            f"with the task's optimizer ({optimizer}), loss ({task.loss!r}) and metrics ({task.metrics!r}), so "
            f"{type(model.optimizer).__name__} is not used" + (f", nor its {' and '.join(own)}" if own else "")
            + ". Give your optimizer and metrics to the task (e.g. ArrayTask(..., optimizer=keras.optimizers.SGD("
            "0.001), metrics=[...])) and return the model uncompiled.")

    def _seeded_build(self):
        """`task.build_model()`, after seeding Keras again under `--seed`."""
        if self.config.seed is not None:
            import keras

            keras.utils.set_random_seed(self.config.seed)
        return self.task.build_model()

    def _with_accumulation(self, compile_args: dict) -> dict:
        """`compile_args` whose optimizer updates once every `accumulation_steps` micro-batches."""
        if self.accumulation_steps == 1:
            return compile_args
        from tftrain.train.accumulation import accumulate_gradients

        optimizer = compile_args.get("optimizer") or "rmsprop"  # Model.compile's default
        return {**compile_args, "optimizer": accumulate_gradients(optimizer, self.accumulation_steps)}

    def _float32_outputs(self, model):
        """Under a mixed policy: float32 outputs for a functional / Sequential model; a subclass is kept,
        with a warning when an output is not float32."""
        import keras

        from tftrain import runtime

        if type(model) is keras.Sequential or type(model).__name__ == "Functional":
            return runtime.ensure_float32_outputs(model)
        outputs = getattr(model, "outputs", None) or []
        if any(str(o.dtype) != "float32" for o in outputs):
            self.console.warn(f"{type(model).__name__} has outputs in {self.precision.info.compute_dtype}; give "
                              "its last layer dtype='float32' so the loss is computed in float32.")
        return model

    def note_custom_steps(self, model) -> None:
        """Says (output and `custom_step` in `metrics.json`) that a model's own `train_step` / `test_step`
        reports its own loss: across replicas, one that tracks `compute_loss` reports it / replicas."""
        from tftrain.runtime.precision import overridden_steps

        steps = overridden_steps(model)
        if not steps:
            return
        replicas = self.runtime.num_replicas
        note = f"the logged loss and metrics are {type(model).__name__}.{' and .'.join(steps)}'s own figures"
        if replicas > 1:
            note += (f"; across {replicas} replicas a step that tracks self.compute_loss(...) reports the loss / "
                     f"{replicas} (Keras scales it for the gradients' all-reduce)")
        self.extras["custom_step"] = {"overridden": list(steps), "replicas": replicas, "note": note}
        self.console.line(f"loss:      {note}")

    def init_weights(self, model) -> None:
        """`--init-from PATH`: the model starts from those weights (its optimizer from step 0, as after
        `load_weights`); a resumed run's checkpoint replaces them."""
        path = self.config.train.init_from
        if path is None:
            return
        if self.run_dir.resumed:  # its checkpoint replaces them: PATH may have moved since
            self.console.line(f"init:      --init-from {path} not read: the run resumes from its own checkpoint")
            self.extras["init_from"] = {"path": str(path), "kind": None, "read": "when the run started"}
            return
        from tftrain.train import init_weights

        kind, source = init_weights.resolve(path)
        if kind == "checkpoint":  # a kept checkpoint holds its run's optimizer too: read it into an uncompiled
            twin = self.build_model(compile_model=False)  # twin, so that this run's optimizer starts afresh
            init_weights.load(twin, kind, source)
            model.set_weights(twin.get_weights())
        else:
            init_weights.load(model, kind, source)
        self.extras["init_from"] = {"path": source, "kind": kind}
        self.console.line(f"init:      weights from {source}")

    def _float32_twin(self, model):
        """`model` itself under float32; under a mixed policy the task's model built in float32 with its weights."""
        if self.precision.info.compute_dtype == "float32":
            return model
        twin = self._build_in_float32()
        twin.set_weights(model.get_weights())
        return twin

    def _build_in_float32(self):
        """The task's model built under float32, outside the strategy; the global policy is put back."""
        from tftrain.runtime.precision import precision_policy

        with precision_policy("float32"):
            return self._built(self.task.build_model())

    # -- the precision stage: PrecisionPlanner decides ---------------------------
    def build_chosen_model(self):
        """The build stage (`build_model`) under `--precision auto`'s choice: timed where the run can time it
        (`PrecisionPlanner.choose`), else under the policy settled before. Returns the model to train."""
        from tftrain.train.execution_plan import probe_batches

        if not self.precision.timeable(self._precision_untimed_because()):
            return self.build_model()
        trained_in = self._checkpoint_policy()
        if trained_in is not None:  # a resumed run goes on in the policy its checkpoint trained in
            self.precision.set(trained_in)
            self.console.line(f"precision: auto -> {trained_in}, as this run's checkpoint trained in it")
            return self.build_model()
        compile_args = {}

        def build(fall_back: bool):
            model = self.build_model(fall_back=fall_back)
            compile_args[self.precision.info.policy] = self.compile_args
            return model

        gb = self.batch.global_batch_size
        model = self.precision.choose(build, probe_batches(self.task, gb), gb, self.run_facts().planned_steps,
                                      self.config.runtime.remember_execution)
        self.compile_args = compile_args[self.precision.info.policy]  # the arguments of the model trained
        return model

    def _checkpoint_policy(self) -> Optional[str]:
        """The dtype policy a resumed run's checkpoint recorded, when `--precision auto` could have chosen it."""
        from tftrain.checkpoint_files import read_position

        position = read_position(self.run_dir.backup_dir) if self.run_dir.resumed else None
        policy = position.precision if position is not None else None
        return policy if policy in ("float32", "mixed_bfloat16") else None

    def settle_untimed_precision(self) -> None:
        """Before anything builds a model (the sanity pass, the batch-size search, `--tune`): float32 where
        `--precision auto` cannot time the CPU's bfloat16, so every model of the run has the policy it records."""
        why = self._precision_untimed_because()
        if why is not None:
            self.precision.settle_untimed(why)

    def _precision_untimed_because(self) -> Optional[str]:
        """Why this run cannot time a policy against another, in words; None where it can."""
        if self.config.deterministic:
            return "--deterministic does not time it"
        if self.config.runtime.execution not in ("auto", "graph"):
            return f"--execution {self.config.runtime.execution} is not timed (graph steps are)"
        if not self.loop.times_execution:
            return f"{self.loop.name} cannot time it in one process"
        if self.runtime.num_replicas > 1:
            return f"timing needs one replica (this run has {self.runtime.num_replicas})"
        return None

    # -- the sanity pass ---------------------------------------------------------
    def sanity_pass(self):
        """Tries every asked feature on the real model and data before training (`tftrain.train.sanity`).

        Returns the `SanityResult`, also kept as `self.sanity`; a model that does not build raises its own error,
        before the run directory is written. Under `--precision auto`, a mixed policy the model cannot step
        in, or whose outputs would round the labels, gives way to float32 here.

        Raises:
            ConfigError: (`SanityError`) what cannot work, in one line with the fix.
        """
        from tftrain.train import sanity

        if self.config.train.tune:
            from tftrain.train.search import check_tune_space

            check_tune_space(self.task, self.config)
        plan = self._sanity_plan()
        try:
            result = sanity.run(plan, say=self.console.warn)
        except (sanity.BuildFailed, sanity.SanityError) as e:
            self.precision.refuse_clash(e.error)  # under a mixed policy asked by name: refused here, in one line
            if not self.precision.clash(e.error):
                if isinstance(e.error, sanity.FeaturesRefused):  # the model and the data do not fit: refused
                    raise ConfigError(f"The model fails on a batch of the training features "
                                      f"({cause_line(e.error.error)}). Check the features' shapes, names "
                                      "and dtypes against the model's inputs.") from None
                if isinstance(e, sanity.BuildFailed):  # the model's own error, before the run directory
                    raise e.error
                raise
            what = "build" if isinstance(e, sanity.BuildFailed) else "build or step"
            self.precision.fall_back(f"the model does not {what} under {self.precision.info.policy}", e.error)
            plan = self._sanity_plan()
            result = sanity.run(plan, say=self.console.warn)
        self._forget_sanity_models()
        self.task.class_weight = result.class_weight  # the bound task's: every class of the model weighed
        if self.config.train.tune and result.validation_keys:  # the trials' objective, as the logs name it
            from tftrain.train.search import check_objective

            check_objective(self.config, plan.compile_args, result.validation_keys)
        if result.float32_needed:  # --precision auto chose the mixed policy: float32 keeps the labels whole
            self.precision.float32_for_labels(result.float32_needed)
        self.sanity = result
        self.extras["sanity"] = {"checked": list(result.checked), "seconds": round(result.seconds, 3)}
        self.console.line(result.line())
        return result

    def _forget_sanity_models(self) -> None:
        """Clears Keras's session after the pass (and sets the policy again), so the run's layers get the
        names they would have without it (a `--monitor` names an output by its layer)."""
        import keras

        keras.backend.clear_session()
        self.precision.set(self.precision.info.policy)

    def _sanity_plan(self):
        """The `SanityPlan` of this run: the model built as `build_model` builds it, outside the strategy."""
        from tftrain.train import sanity

        cfg, rt, info = self.config, self.runtime, self.precision.info
        gb = self.batch.global_batch_size if self.batch else (self.task.default_batch_size or 32 * rt.num_replicas)
        n = self.task.num_train_examples
        if not self.batch and n:  # no plan yet (--tune, --batch-size auto): a batch the training data fills
            gb = min(gb, max(rt.num_replicas, n // rt.num_replicas * rt.num_replicas))
        validation = self.task.validation_data(gb)
        init = None
        if cfg.train.init_from is not None and not self.run_dir.resumed:
            from tftrain.train import init_weights

            init = init_weights.resolve(cfg.train.init_from)
        export = ()
        if cfg.train.export and self.is_chief:
            from tftrain.train import export as export_lib

            export = export_lib.parse(cfg.train.export)
        build = lambda: self._plain_outputs(self._built(self._seeded_build()))  # noqa: E731
        timed = self.precision.timeable(self._precision_untimed_because())  # then float32 is built first
        return sanity.SanityPlan(
            build=self._build_in_float32 if timed else build, build_float32=self._build_in_float32,
            compile_args=check_compile_args(self.task.compile_args(self.steps_per_epoch)),
            train_data=self.task.train_data(gb),
            validation_data=validation, test_data=self.task.test_data(gb), batch_size=max(1, gb // rt.num_replicas),
            replicas=rt.num_replicas,
            compute_dtype="float32" if timed else info.compute_dtype, auto_precision=cfg.runtime.precision == "auto",
            loss_scaling=info.loss_scaling, class_weight=self.task.class_weight,
            monitor=(self.keep_best_monitor(), cfg.train.monitor_mode)
            if cfg.train.keep_best or cfg.train.monitor else None,  # a --monitor given is checked, used or not
            monitor_by_default=not cfg.train.monitor,
            early_stopping=cfg.train.early_stopping is not None and not cfg.train.monitor,
            init_from=init, export_formats=export, candidate_build=build if timed else None,
            candidate_dtype=info.compute_dtype, graph=cfg.runtime.execution != "eager",
            label_arrays=self.task.label_arrays())

    def _plain_outputs(self, model):
        """`model` with float32 outputs under a mixed policy, for a functional or Sequential model; silent."""
        import keras

        from tftrain import runtime

        if self.precision.info.compute_dtype != "float32" and (
                type(model) is keras.Sequential or type(model).__name__ == "Functional"):
            return runtime.ensure_float32_outputs(model)
        return model

    def keep_best_monitor(self) -> str:
        """The metric `--keep-best` ranks by: `--monitor`, else `val_loss` where the run validates, else `loss`."""
        if self.config.train.monitor:
            return self.config.train.monitor
        gb = self.batch.global_batch_size if self.batch else 32
        validates = self.task.validation_data(gb) is not None
        return "val_loss" if validates else "loss"

    def early_stopping_monitor(self) -> str:
        """The metric `--early-stopping` watches: `--monitor`, else `val_loss`."""
        return self.config.train.monitor or "val_loss"


@contextlib.contextmanager
def float32_output_layers(model):
    """While open, the layers that make `model`'s outputs compute in float32 (under a mixed policy the saved
    `model.keras` then returns float32, as the run's output cast did, and its metrics take them: the last layer
    in float32, https://www.tensorflow.org/guide/mixed_precision#building_the_model). An output an operation
    makes keeps the compute dtype: a cast layer after it would rename the saved model's output."""
    import keras

    changed = []
    for layer in output_layers(model):
        if layer.compute_dtype != "float32":
            changed.append((layer, layer.dtype_policy))
            layer.dtype_policy = keras.DTypePolicy("float32")
    try:
        yield
    finally:
        for layer, policy in changed:
            layer.dtype_policy = policy


def output_layers(model) -> list:
    """The layers that make `model`'s outputs; an output an operation (`keras.ops`) makes has none."""
    import keras

    names = getattr(model, "output_names", None) or ([model.layers[-1].name] if isinstance(
        model, keras.Sequential) and model.layers else [])
    layers = {layer.name: layer for layer in model.layers}
    return [layers[name] for name in dict.fromkeys(names) if name in layers]


def write_model(model, path, warn) -> None:
    """Saves `model` to `path` (`model.keras`) through a temporary file (a kill mid-save leaves no part file in its
    place), flushed to disk (a machine crash leaves no empty file); a model Keras cannot serialize has its weights
    saved as `model.weights.h5` beside it, with one line."""
    from tftrain import rundir as rundir_lib
    from tftrain.train.sanity import unserializable

    why = unserializable(model)
    target = path if why is None else path.with_name(rundir_lib.WEIGHTS_FILE)
    # Keras reads the format from the temporary name's ending, as `target`'s; flushed to disk, as the backup it
    # replaces: the run's end deletes the backup once model.keras and metrics.json are written
    with replaced(target, durable=True) as tmp:
        model.save(tmp) if why is None else model.save_weights(tmp)
    if why is not None:
        warn(f"{path.name} not written: {why[0]}; the trained weights are in {target} (build the model, call it on a "
             "batch, then model.load_weights)")
