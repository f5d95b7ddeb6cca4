"""The AppliedStep capability on an ordinary in-process environment: the
applied (clipped) action is what the learner and the metrics see, vetoed
transitions reach the learner only as inert boundaries, exactly."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import (batched_py_environment, py_environment,
                                    tf_py_environment)
from tf_agents.policies import fixed_policy
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from alf_async import AsyncOffPolicyDriver
from alf_async.environments.capabilities import AppliedStep

pytestmark = pytest.mark.timeout(60)

POLICY_ACTION = 7
CLIP = 5


class ClippingEnv(py_environment.PyEnvironment, AppliedStep):
    """Episodes of 3 actions; observation [10 * episode + t]; reward 1 per step.

    Applies min(action, CLIP) and reports it; vetoes (untrainable) the
    transition from t == 2.
    """

    def __init__(self):
        super().__init__()
        self._episode = -1
        self._t = 0
        self._applied = None

    def observation_spec(self):
        return array_spec.ArraySpec((1,), np.int32)

    def action_spec(self):
        return array_spec.BoundedArraySpec((), np.int32, 0, 9)

    def _obs(self):
        return np.array([10 * self._episode + self._t], np.int32)

    def _reset(self):
        self._episode += 1
        self._t = 0
        return ts.restart(self._obs())

    def _step(self, action):
        if self._t == 3:   # the step after LAST starts the next episode
            self._applied = (None, True)
            return self._reset()
        applied = min(int(action), CLIP)
        self._applied = (np.int32(applied), self._t != 2)
        self._t += 1
        if self._t == 3:
            return ts.termination(self._obs(), np.float32(1))
        return ts.transition(self._obs(), np.float32(1))

    def applied_step(self):
        return self._applied


def run(tf_env, batches=2):
    policy = fixed_policy.FixedPolicy(np.int32(POLICY_ACTION), tf_env.time_step_spec(),
                                      tf_env.action_spec())
    seen = []
    driver = AsyncOffPolicyDriver(lambda: tf_env, policy, num_envs=1, unroll_length=4,
                                  observers=[lambda t: seen.append(t)],
                                  stop_grace_period_secs=1.0)
    driver.start()
    try:
        got = [tf.nest.map_structure(np.asarray, driver.get_training_exps()[0])
               for _ in range(batches)]
    finally:
        driver.stop()
    return got, [tf.nest.map_structure(np.asarray, t) for t in seen]


@pytest.mark.parametrize("rows", [1, 2])
def test_applied_actions_and_vetoed_transitions_reach_the_learner_exactly(rows):
    if rows == 1:
        tf_env = tf_py_environment.TFPyEnvironment(ClippingEnv())
    else:
        tf_env = tf_py_environment.TFPyEnvironment(batched_py_environment.BatchedPyEnvironment(
            [ClippingEnv() for _ in range(rows)], multithreading=False))
    batches, seen = run(tf_env)
    for e, exp in enumerate(batches):   # batch e is episode e, on every row
        assert exp.step_type.shape == (rows, 4)
        for r in range(rows):
            # t 0, 1: as played, with the clipped action; t 2 vetoed: an inert
            # boundary keeping only its observation (t 1's next one); t 3: the
            # episode's LAST -> FIRST boundary.
            np.testing.assert_array_equal(exp.observation[r, :, 0],
                                          [10 * e, 10 * e + 1, 10 * e + 2, 10 * e + 3])
            np.testing.assert_array_equal(exp.step_type[r], [0, 1, 2, 2])
            np.testing.assert_array_equal(exp.next_step_type[r], [1, 1, 0, 0])
            # t 3 applied the policy's action (the env reports None).
            np.testing.assert_array_equal(exp.action[r], [CLIP, CLIP, 0, POLICY_ACTION])
            np.testing.assert_array_equal(exp.reward[r], [1, 1, 0, 0])
            np.testing.assert_array_equal(exp.discount[r], [1, 1, 1, 1])
    # The log thread got the episodes as they happened (applied actions, no
    # veto), so the metrics count every step.
    for e, traj in enumerate(seen[:2]):
        np.testing.assert_array_equal(traj.step_type[0], [0, 1, 1, 2])
        np.testing.assert_array_equal(traj.action[0], [CLIP, CLIP, CLIP, POLICY_ACTION])
        np.testing.assert_array_equal(traj.reward[0], [1, 1, 1, 0])


def test_an_isolated_applied_step_environment_is_refused_at_construction():
    tf_env = tf_py_environment.TFPyEnvironment(ClippingEnv(), isolation=True)
    policy = fixed_policy.FixedPolicy(np.int32(POLICY_ACTION), tf_env.time_step_spec(),
                                      tf_env.action_spec())
    with pytest.raises(ValueError, match=r"reports applied steps \(AppliedStep\) but is a "
                                         r"TFPyEnvironment with isolation=True"):
        AsyncOffPolicyDriver(lambda: tf_env, policy, num_envs=1, unroll_length=4)
