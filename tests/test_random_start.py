"""RandomStartPolicy: uniform random actions while the train step counter is 0,
the wrapped policy's afterwards (also inside a graph, as the actor threads call it)."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import fixed_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.learning.random_start import RandomStartPolicy

ACTION_SPEC = tensor_spec.BoundedTensorSpec([3], tf.float32, minimum=-1.0, maximum=1.0)
TIME_STEP_SPEC = ts.time_step_spec(tf.TensorSpec([5], tf.float32))
FIXED_ACTION = np.full([3], 0.25, np.float32)  # what the wrapped policy always does


def _policy_and_counter():
    counter = tf.Variable(0, dtype=tf.int64)
    wrapped = fixed_policy.FixedPolicy(FIXED_ACTION, TIME_STEP_SPEC, ACTION_SPEC)
    return RandomStartPolicy(wrapped, counter), counter


def _time_steps(batch_size):
    return ts.restart(tf.zeros([batch_size, 5]), batch_size=batch_size)


@pytest.mark.timeout(60)
def test_random_while_the_counter_is_zero_then_the_wrapped_policy():
    policy, counter = _policy_and_counter()
    action = tf.function(lambda t: policy.action(t).action)  # a graph, like the actors'
    random = action(_time_steps(64)).numpy()
    assert random.shape == (64, 3)
    assert np.all(random >= -1.0) and np.all(random <= 1.0)
    assert len(np.unique(random)) == 64 * 3  # drawn, not the fixed action
    counter.assign(1)
    np.testing.assert_array_equal(action(_time_steps(64)).numpy(),
                                  np.tile(FIXED_ACTION, [64, 1]))


@pytest.mark.timeout(60)
def test_keeps_the_wrapped_policys_specs():
    policy, _ = _policy_and_counter()
    assert policy.time_step_spec == policy.wrapped_policy.time_step_spec
    assert policy.action_spec == policy.wrapped_policy.action_spec
    assert policy.policy_step_spec == policy.wrapped_policy.policy_step_spec
