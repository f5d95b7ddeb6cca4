"""Policy lag: how many train steps older the variables that chose an action
were than the train step that trains on it.

    policy = TrainStepStampedPolicy(agent.collect_policy, agent.train_step_counter)
    replayer = PolicyLag(OneTimeReplayer(policy.trajectory_spec, num_rows), agent.train_step_counter)
    driver = AsyncOffPolicyDriver(env_constructor, policy, exp_observers=[replayer])
    ...
    mean, most = replayer.policy_lag()

An actor reads the learner's variables as they are when it runs its
forward pass, so in one process the lag comes from what is queued between
acting and training (the unrolls in flight, the learn queue, the batch the
learner is training on); a collector process acts with the variables it
last pulled, together with the train step they were pushed at. Either way
it is measured, not assumed:

- `TrainStepStampedPolicy` wraps the collect policy and records, in each
  step's `policy_info`, the train step counter it read just before its
  forward pass (`StampedInfo(info, train_step)`; the wrapped policy's own
  info, e.g. PPO's `dist_params`, is kept whole). In a collector the
  counter is the pulled one.
- `PolicyLag` wraps the replayer the learner samples from: each `sample()`
  (traced into the train step) measures, over the steps the agent trains
  on (every step of a row but its last, which only bootstraps; episode
  boundaries excluded), the learner's train step minus each stamp, keeps
  the mean and the maximum, and returns the experience without the stamps
  (`policy_info` as the agent's `collect_data_spec` has it).

Threads: the stamped policy runs on the actor threads; `sample` inside the
learner's train step; `policy_lag()` on the learner's thread (hooks).
"""

import collections

import tensorflow as tf
from tf_agents.policies import tf_policy

from alf_async.learning.replayer_base import Replayer

StampedInfo = collections.namedtuple("StampedInfo", ["info", "train_step"])
StampedInfo.__doc__ = """A stamped policy's `policy_info`.

info: the wrapped policy's own policy_info.
train_step: int64, the train step counter when the action was chosen.
"""


class TrainStepStampedPolicy(tf_policy.TFPolicy):
    """`policy`, its `policy_info` stamped with `train_step` at act time.

    Args:
        policy: the TFPolicy that acts (e.g. an agent's `collect_policy`).
        train_step: an int64 tf.Variable: the learner's train step counter,
            or in a collector the train step its variables were pulled at.
        name: the policy's name.
    """

    def __init__(self, policy, train_step, name=None):
        if not isinstance(train_step, tf.Variable) or train_step.dtype != tf.int64:
            raise TypeError(f"TrainStepStampedPolicy needs the train step counter as an int64 "
                            f"tf.Variable, got {train_step!r}")
        self._policy = policy
        self._train_step = train_step
        super().__init__(policy.time_step_spec, policy.action_spec,
                         policy_state_spec=policy.policy_state_spec,
                         info_spec=StampedInfo(policy.info_spec,
                                               tf.TensorSpec([], tf.int64, name="train_step")),
                         clip=False, name=name)

    @property
    def wrapped_policy(self):
        return self._policy

    def _variables(self):
        return self._policy.variables()

    def _action(self, time_step, policy_state, seed):
        stamp = self._train_step.read_value()
        with tf.control_dependencies([stamp]):  # read before the forward pass reads the weights
            step = self._policy.action(time_step, policy_state, seed=seed)
        rows = tf.shape(tf.nest.flatten(time_step)[0])[:1]
        return step._replace(info=StampedInfo(step.info, tf.fill(rows, stamp)))

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError("TrainStepStampedPolicy only acts: call action()")


def strip_stamps(experience):
    """The experience (a Trajectory) with the wrapped policy's own policy_info."""
    return experience._replace(policy_info=experience.policy_info.info)


class PolicyLag(Replayer):
    """A `Replayer` over `replayer` (whose experience is stamped by a
    `TrainStepStampedPolicy`): samples without the stamps, measuring the
    policy lag of each (see module docstring).

    Args:
        replayer: the `Replayer` the driver feeds (`OneTimeReplayer`, or a
            `ReverbReplayer` fed by collectors).
        train_step: the learner's train step counter (an int64 tf.Variable).
        name: the module's name.
    """

    def __init__(self, replayer, train_step, name="policy_lag"):
        super().__init__(name=name)
        self._replayer = replayer
        self._train_step = train_step
        with self.name_scope:
            self._mean = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="mean")
            self._max = tf.Variable(0, dtype=tf.int64, trainable=False, name="max")
            self._measured = tf.Variable(False, trainable=False, name="measured")

    @property
    def traceable_before_data(self):
        return self._replayer.traceable_before_data

    @property
    def replayer(self):
        return self._replayer

    def __call__(self, exp, env_ids):
        self._replayer(exp, env_ids)

    def can_sample(self, num_steps):
        return self._replayer.can_sample(num_steps)

    def num_frames(self):
        return self._replayer.num_frames()

    def trace(self):
        self._replayer.trace()

    def sample(self, sample_batch_size=None, num_steps=None):
        """`replayer.sample(...)` without the stamps; measures its lag."""
        exp = self._replayer.sample(sample_batch_size, num_steps)
        lag = self._train_step.read_value() - exp.policy_info.train_step[:, :-1]
        trained = tf.logical_not(exp.is_boundary()[:, :-1])
        lags = tf.boolean_mask(lag, trained)
        count = tf.size(lags)
        mean = tf.math.divide_no_nan(tf.reduce_sum(tf.cast(lags, tf.float64)),
                                     tf.cast(count, tf.float64))
        updates = [self._mean.assign(mean), self._max.assign(
            tf.reduce_max(tf.concat([lags, tf.zeros([1], tf.int64)], axis=0))),
                   self._measured.assign(count > 0)]
        with tf.control_dependencies(updates):
            return tf.nest.map_structure(tf.identity, strip_stamps(exp))

    def policy_lag(self):
        """(mean, max) policy lag of the latest sample, in train steps; None
        before any sample measured one."""
        if not bool(self._measured.numpy()):
            return None
        return float(self._mean.numpy()), int(self._max.numpy())
