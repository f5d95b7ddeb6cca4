"""The AppliedStep capability on an ordinary in-process environment: the
applied (clipped) action is what the learner and the metrics see, vetoed
transitions reach the learner only as inert boundaries, exactly."""

import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import (batched_py_environment, py_environment,
                                    tf_py_environment)
from tf_agents.policies import fixed_policy
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from alf_async import AsyncOffPolicyDriver

from alf_async.driver import applied_steps
from alf_async.driver.env_rows import row_envs
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


def make_driver(tf_env, seen):
    """One env thread over `tf_env` acting POLICY_ACTION; its log rows go to `seen`."""
    policy = fixed_policy.FixedPolicy(np.int32(POLICY_ACTION), tf_env.time_step_spec(),
                                      tf_env.action_spec())
    return AsyncOffPolicyDriver(lambda: tf_env, policy, num_envs=1, unroll_length=4,
                                observers=[lambda t: seen.append(t)],
                                stop_grace_period_secs=1.0)


def run(tf_env, batches=2):
    seen = []
    driver = make_driver(tf_env, seen)
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


# ------------------------------------- rows stepped one by one (env_rows.py)


class BlockingClippingEnv(ClippingEnv):
    """ClippingEnv whose step blocks (a short sleep): the driver steps a batch
    of them row by row, each on its own worker (EnvThread._rows_loop)."""
    blocking_step = True

    def _step(self, action):
        time.sleep(0.001)
        return super()._step(action)


def test_rows_stepped_one_by_one_record_applied_actions_and_vetoes_exactly():
    rows = 3
    tf_env = tf_py_environment.TFPyEnvironment(batched_py_environment.BatchedPyEnvironment(
        [BlockingClippingEnv() for _ in range(rows)], multithreading=False))
    assert row_envs(tf_env) is not None   # the rows loop steps it
    seen = []
    driver = make_driver(tf_env, seen)
    by_row = {r: [] for r in range(rows)}   # each row's unrolls, in order
    driver.start()
    try:
        while min(len(u) for u in by_row.values()) < 3:
            exp, env_ids, _ = driver.get_training_exps()
            exp = tf.nest.map_structure(np.asarray, exp)
            for i, r in enumerate(np.asarray(env_ids)):
                by_row[int(r)].append(tf.nest.map_structure(lambda a, i=i: a[i], exp))
    finally:
        driver.stop()
    for r, unrolls in by_row.items():
        for e, exp in enumerate(unrolls[:3]):   # unroll e of every row is episode e
            # The same exact learner rows as the batch stepped in lockstep.
            np.testing.assert_array_equal(exp.observation[:, 0],
                                          [10 * e, 10 * e + 1, 10 * e + 2, 10 * e + 3])
            np.testing.assert_array_equal(exp.step_type, [0, 1, 2, 2])
            np.testing.assert_array_equal(exp.next_step_type, [1, 1, 0, 0])
            np.testing.assert_array_equal(exp.action, [CLIP, CLIP, 0, POLICY_ACTION])
            np.testing.assert_array_equal(exp.reward, [1, 1, 0, 0])
            np.testing.assert_array_equal(exp.discount, [1, 1, 1, 1])
    # The log thread got every row's episodes as they happened.
    logged = [tf.nest.map_structure(lambda a, i=i: np.asarray(a)[i], t)
              for t in seen for i in range(np.asarray(t.step_type).shape[0])]
    assert len(logged) >= 3 * rows
    for traj in logged:
        e = int(traj.observation[0, 0]) // 10
        np.testing.assert_array_equal(traj.observation[:, 0], 10 * e + np.arange(4))
        np.testing.assert_array_equal(traj.step_type, [0, 1, 1, 2])
        np.testing.assert_array_equal(traj.action, [CLIP, CLIP, CLIP, POLICY_ACTION])
        np.testing.assert_array_equal(traj.reward, [1, 1, 1, 0])


def test_inert_boundaries_carry_each_rows_state_across_unrolls_in_one_call():
    """A row shipped twice in one call is made inert exactly as in two calls."""
    spec = trajectory.Trajectory(
        step_type=tf.TensorSpec([2], tf.int32), observation=tf.TensorSpec([2], tf.int32),
        action=tf.TensorSpec([2], tf.int32), policy_info=(),
        next_step_type=tf.TensorSpec([2], tf.int32), reward=tf.TensorSpec([2], tf.float32),
        discount=tf.TensorSpec([2], tf.float32))
    action_spec = tf.TensorSpec([], tf.int32)

    def unroll(obs, n=1):
        return [np.ones([n, 2], np.int32), np.array([obs] * n, np.int32),
                np.full([n, 2], 4, np.int32), np.ones([n, 2], np.int32),
                np.ones([n, 2], np.float32), np.ones([n, 2], np.float32), np.zeros([n], np.int32)]

    # Row 0: (trainable, trainable) then (untrainable, untrainable): the
    # second unroll's first observation is the trainable step's next one.
    together = applied_steps.InertBoundaries(spec, action_spec, num_rows=2)
    both = [np.concatenate([a, b]) for a, b in zip(unroll([1, 2]), unroll([3, 4]))]
    got = together.for_learner(both, np.array([[True, True], [False, False]]),
                               np.array([0, 0]))
    apart = applied_steps.InertBoundaries(spec, action_spec, num_rows=2)
    first = apart.for_learner(unroll([1, 2]), np.array([[True, True]]), np.array([0]))
    second = apart.for_learner(unroll([3, 4]), np.array([[False, False]]), np.array([0]))
    for g, a, b in zip(got, first, second):
        np.testing.assert_array_equal(g, np.concatenate([a, b]))
    np.testing.assert_array_equal(got[1], [[1, 2], [3, 0]])   # 3 kept, 4 blanked
    np.testing.assert_array_equal(got[0], [[1, 1], [2, 2]])
    # Row 1 was never shipped: its first untrainable step needs nothing.
    other = together.for_learner(unroll([5, 6]), np.array([[False, True]]), np.array([1]))
    np.testing.assert_array_equal(other[1], [[0, 6]])
