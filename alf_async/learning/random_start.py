"""RandomStartPolicy: uniform random actions until training starts.

Published off-policy results on continuous control (SAC: Haarnoja et al.
2018; tf-agents' sac train_eval; Tianshou's `start_timesteps`) fill the
replay buffer with actions drawn uniformly from the action spec before the
first gradient step, not with the untrained actor's. With the asynchronous
driver the policy the actors act with is fixed when the driver is built, so
the switch happens inside the policy: while the agent's train step counter
is 0 it acts like tf-agents' `RandomTFPolicy`, afterwards like the wrapped
policy. The learner trains once `initial_collect_steps` env steps were
dequeued, so those steps (plus the few in flight) are random ones; a run
resumed from a checkpoint (counter > 0) never acts randomly.

Threads: the actor threads call `action` (in their graphs); the counter is
read there, so they switch as soon as the learner's first train step
increments it.
"""

import tensorflow as tf
from tf_agents.policies import random_tf_policy, tf_policy


class RandomStartPolicy(tf_policy.TFPolicy):
    """Uniform random actions while `train_step_counter` is 0, then `policy`'s.

    Args:
        policy: the TFPolicy to act with once training started (e.g. an
            agent's `collect_policy`); its specs are this policy's.
        train_step_counter: the agent's train step counter (a tf.Variable).
        name: the policy's name.
    """

    def __init__(self, policy, train_step_counter, name=None):
        self._policy = policy
        self._train_step_counter = train_step_counter
        self._random = random_tf_policy.RandomTFPolicy(
            policy.time_step_spec, policy.action_spec,
            policy_state_spec=policy.policy_state_spec, info_spec=policy.info_spec,
            emit_log_probability=policy.emit_log_probability)
        super().__init__(policy.time_step_spec, policy.action_spec,
                         policy_state_spec=policy.policy_state_spec,
                         info_spec=policy.info_spec, clip=False,
                         emit_log_probability=policy.emit_log_probability, name=name)

    @property
    def wrapped_policy(self):
        return self._policy

    def _variables(self):
        return self._policy.variables()

    def _action(self, time_step, policy_state, seed):
        def act_randomly():
            step = self._random.action(time_step, policy_state, seed=seed)
            # The wrapped policy's state goes on unchanged (RandomTFPolicy keeps it too).
            return step._replace(state=policy_state)

        def act():
            return self._policy.action(time_step, policy_state, seed=seed)

        return tf.cond(self._train_step_counter > 0, act, act_randomly)

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError("RandomStartPolicy only acts (it switches policies with "
                                  "tf.cond): call action()")
