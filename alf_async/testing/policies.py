"""Deterministic TFPolicies for CountingEnv (see alf_async.testing.envs).

- `CountingPolicy`: action = counter % 1000, so each trajectory's action
  proves it was computed from that row's own observation.
- `StatefulCountingPolicy`: carries an int32 policy state per row, reset to 0
  at FIRST and +1 on every other step; action = the new state. With state
  carried per environment the action equals the observation's
  step_in_episode; states mixed between environments would not.
- `FailingPolicy`: fails at run time (an InvalidArgumentError from a
  tf.debugging assertion) once an observation's counter reaches `fail_at`.
"""

import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step

from alf_async.testing.envs import NUM_ACTIONS, OBS_COUNTER


def expected_counting_action(observation, action=None):
    """The action CountingPolicy takes for `observation` (numpy or tensor)."""
    return observation[..., OBS_COUNTER] % NUM_ACTIONS


class CountingPolicy(tf_policy.TFPolicy):

    def __init__(self, time_step_spec, action_spec):
        super().__init__(time_step_spec, action_spec)

    def _action(self, time_step, policy_state, seed):
        action = tf.cast(expected_counting_action(time_step.observation), tf.int32)
        return policy_step.PolicyStep(action, policy_state, ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


class StatefulCountingPolicy(tf_policy.TFPolicy):

    def __init__(self, time_step_spec, action_spec):
        super().__init__(time_step_spec, action_spec,
                         policy_state_spec=tf.TensorSpec([], tf.int32, name="count"))

    def _action(self, time_step, policy_state, seed):
        count = tf.where(time_step.is_first(), tf.zeros_like(policy_state), policy_state + 1)
        return policy_step.PolicyStep(tf.math.floormod(count, NUM_ACTIONS), count, ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


class FailingPolicy(CountingPolicy):

    def __init__(self, time_step_spec, action_spec, fail_at):
        super().__init__(time_step_spec, action_spec)
        self._fail_at = fail_at

    def _action(self, time_step, policy_state, seed):
        counter = time_step.observation[..., OBS_COUNTER]
        check = tf.debugging.assert_less(
            counter, self._fail_at, message="FailingPolicy: injected failure")
        with tf.control_dependencies([check]):
            return super()._action(time_step, policy_state, seed)


def dqn_collect_policy(tf_env, fc_layer_params=(64, 64)):
    """A freshly initialised tf-agents DQN agent's collect policy for `tf_env`
    (QNetwork fc_layer_params, Adam 1e-3): what the benchmarks collect with."""
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import q_network
    q_net = q_network.QNetwork(tf_env.observation_spec(), tf_env.action_spec(),
                               fc_layer_params=fc_layer_params)
    agent = dqn_agent.DqnAgent(tf_env.time_step_spec(), tf_env.action_spec(), q_network=q_net,
                               optimizer=tf.keras.optimizers.Adam(1e-3))
    agent.initialize()
    return agent.collect_policy
