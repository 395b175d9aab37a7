"""plan_batch: the batch plan from explicit inputs, as a frozen BatchPlan."""

import dataclasses

import pytest

from tftrain.errors import ConfigError
from tftrain.train.batch_plan import plan_batch


def test_a_global_batch_divides_across_replicas_and_steps_drop_the_last_partial_batch():
    plan = plan_batch(64, None, 2, 1000, accumulation_steps=2)
    assert (plan.batch.global_batch_size, plan.batch.per_replica_batch_size) == (64, 32)
    assert plan.effective_global_batch_size == 128 and plan.steps_per_epoch == 7 and plan.note is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps_per_epoch = 8


def test_per_replica_size_or_the_default_and_unknown_length():
    assert plan_batch(None, 16, 4, None).batch.global_batch_size == 64
    assert plan_batch(None, None, 1, None).steps_per_epoch is None  # 128 a replica; the length is unknown


def test_fewer_examples_than_one_batch_shrink_it_to_one_step_of_them_and_say_so():
    plan = plan_batch(128, None, 2, 51)
    assert (plan.batch.global_batch_size, plan.steps_per_epoch) == (50, 1)
    assert plan.note == ("Batch: 51 training examples are fewer than a global batch of 128; each epoch is one "
                         "step of 50 examples.")


@pytest.mark.parametrize("args,match", [
    ((8, None, 4, 3), "Only 3 training examples for a global batch of 8: not one full step"),
    ((8, None, 2, 3, 2), r"an effective global batch of 16 \(2 micro-batches of 8\).*fewer --gradient"),
    ((10, None, 4, 100), "divide"),
    ((8, 4, 1, 100), "not both"),
])
def test_bad_plans_are_refused_with_the_fix(args, match):
    with pytest.raises(ConfigError, match=match):
        plan_batch(*args)
