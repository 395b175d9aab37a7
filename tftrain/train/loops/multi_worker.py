"""`MultiWorkerLoop`: `Model.fit` in every task of a `multi_worker_mirrored` job."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tftrain.runtime.input_release import released_off_thread
from tftrain.train.loops.fit import FitLoop


@dataclasses.dataclass(frozen=True)
class MultiWorkerLoop(FitLoop):
    """`Model.fit` in every task of a `multi_worker_mirrored` job. Each worker repeats its shard and runs exactly
    `steps_per_epoch` steps an epoch, so none waits for a step another never takes."""

    name: str = "Model.fit (multi-worker)"
    times_execution: bool = False
    in_process_search: bool = False
    checks_input: bool = False  # each worker reads only its shard
    needs_steps_per_epoch: bool = True
    weighs_classes: bool = True  # on each worker's dataset (`class_weighted`)
    executions: tuple = ("auto", "graph", "eager")
    no_search_reason: str = ("every worker runs the same steps in lockstep (collective all-reduce), so one task "
                             "cannot try settings alone")

    def steps_per_execution_for(self, requested: int, batches_per_epoch: Optional[int]) -> int:
        """The largest count <= `requested` dividing `batches_per_epoch` (else Keras runs past the epoch's end)."""
        if not batches_per_epoch or batches_per_epoch % requested == 0:
            return requested
        return max(d for d in range(1, requested + 1) if batches_per_epoch % d == 0)

    def fit(self, model, train_data, *, epochs, steps_per_epoch, callbacks, verbose, validation_data=None,
            runtime=None, say=print, class_weight=None):
        """`Model.fit` on `distribute_datasets_from_function` (see `FitLoop.fit`); `steps_per_epoch` must be known,
        and `steps_per_execution` is lowered to divide it."""
        spe = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        if steps_per_epoch % spe:
            model.steps_per_execution = self.steps_per_execution_for(spe, steps_per_epoch)
            say(f"steps per execution: {model.steps_per_execution} ({spe} does not divide the epoch's "
                f"{steps_per_epoch} steps, and Keras would run whole executions past the epoch's end)")
        weigh = class_weighted(class_weight)
        dataset = runtime.strategy.distribute_datasets_from_function(lambda ctx: weigh(train_data(ctx)).repeat())
        with released_off_thread() as release:  # tf.data's iterator destructor can block
            return model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch,
                             callbacks=[*callbacks, release], verbose=verbose, validation_data=validation_data,
                             shuffle=False)


def class_weighted(class_weight):
    """`dataset -> dataset` adding `class_weight[y]` sample weights (identity for None): `fit` refuses `class_weight`
    with a distributed dataset. Keras's map: `make_class_weight_map_fn` in `data_adapters/tf_dataset_adapter.py`."""
    if class_weight is None:
        return lambda dataset: dataset
    from tftrain import _compat

    weigh = _compat.class_weight_map_fn(class_weight)
    return lambda dataset: dataset.map(weigh)
