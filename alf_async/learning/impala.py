"""ImpalaAgent: an actor-critic TFAgent trained with V-trace (Espeholt et al.
2018), on the learner's batches of linked unrolls.

    net = ActorCriticNetwork(obs_spec, action_spec, conv_layer_params=..., fc_layer_params=(256,))
    agent = ImpalaAgent(time_step_spec, action_spec, net, tf.keras.optimizers.Adam(6e-4))

The network is IMPALA's: one torso (convolutions and dense layers) with a
policy head (logits over the discrete actions) and a value head, so a
train step runs the torso once for both. The collect policy samples from
the logits and records the behaviour log-probability of each action in
`policy_info.log_probability` at act time (tf-agents' `emit_log_probability`);
`policy` acts greedily (the most probable action).

`train(experience)` takes a batch [B, T + 1] whose rows' last step only
bootstraps (`OneTimeReplayer`'s linked unrolls) and makes one gradient step
of IMPALA's loss on its B x T transitions, with the current network's
log-probabilities pi and values V and the recorded behaviour's mu:

    log_rhos       log pi(a_t|x_t) - log mu(a_t|x_t)
    vs, pg_adv     vtrace_returns(log_rhos, gamma * discount_t, r_t, V(x_t), V(x_T))
    loss           - mean(pg_adv * log pi(a_t|x_t))                  policy gradient
                   + value_pred_loss_coef * mean(0.5 (vs - V(x_t))^2)  baseline
                   - entropy_regularization * mean(entropy(pi(.|x_t)))

means over the transitions that are not episode boundaries (LAST ->
FIRST, no transition of the environment). A boundary step neither trains
nor leaks into its neighbours: its TD error is made 0 (discount 0, reward
V), so its V-trace target is its own value, which is what a transition cut
by a time limit (discount 1 into a LAST step) bootstraps from.

Each train step's summaries (at its train step, when the learner records):
`Losses/loss`, `Losses/policy_gradient_loss`, `Losses/value_estimation_loss`,
`Losses/entropy`, and V-trace's `Learner/mean_rho` and
`Learner/clipped_rho_fraction` beside the learner's `Learner/policy_lag`.

Threads: the collect policy runs on the actor threads; `train` on the
learner's (inside its traced train step).
"""

import collections

import gin
import tensorflow as tf
import tensorflow_probability as tfp
from tf_agents.agents import tf_agent
from tf_agents.distributions import shifted_categorical
from tf_agents.networks import encoding_network, network
from tf_agents.policies import greedy_policy, tf_policy
from tf_agents.trajectories import policy_step
from tf_agents.utils import eager_utils

from alf_async import roles
from alf_async.learning.vtrace import vtrace_returns

ImpalaLossInfo = collections.namedtuple("ImpalaLossInfo", [
    "policy_gradient_loss", "value_estimation_loss", "entropy", "mean_rho",
    "clipped_rho_fraction"])
ImpalaLossInfo.__doc__ = """`LossInfo.extra` of an ImpalaAgent train step (scalars).

policy_gradient_loss, value_estimation_loss: the two terms (before coefficients).
entropy: the policy's mean entropy.
mean_rho: mean importance ratio pi/mu of the trained actions (1: on-policy).
clipped_rho_fraction: the fraction of ratios above 1 (clipped by V-trace).
"""


class ActorCriticNetwork(network.Network):
    """A shared torso with a policy-logits head and a value head.

    Args:
        observation_spec: the observation's TensorSpec; uint8 observations
            (pixels) are scaled to [0, 1] inside the network.
        action_spec: a scalar discrete BoundedTensorSpec.
        conv_layer_params: (filters, kernel size, stride) tuples, or None.
        fc_layer_params: the torso's dense layer sizes (after the convolutions).
        activation_fn: the torso's activation.
        kernel_initializer: the torso's kernel initializer (None:
            tf-agents' EncodingNetwork's: He, truncated normal).
        dtype: the torso's conv and dense layers' dtype or Keras dtype
            policy (the heads are float32).
        name: the network's name.

    Calling it on observations [..., obs] returns ((logits [..., A], values [...]), state).
    """

    def __init__(self, observation_spec, action_spec, conv_layer_params=None,
                 fc_layer_params=(256,), activation_fn=tf.keras.activations.relu,
                 kernel_initializer=None, dtype=tf.float32, name="ActorCriticNetwork"):
        super().__init__(input_tensor_spec=observation_spec, state_spec=(), name=name)
        if action_spec.shape.rank != 0 or not action_spec.dtype.is_integer:
            raise ValueError(f"ActorCriticNetwork needs one discrete action (a scalar integer "
                             f"spec), got {action_spec}")
        num_actions = int(action_spec.maximum) - int(action_spec.minimum) + 1
        # Pixels are scaled in the torso's dtype (builder_parts.scale_pixels).
        scale = (tf.keras.layers.Rescaling(1.0 / 255.0, dtype=dtype)
                 if observation_spec.dtype == tf.uint8 else None)
        self._torso = encoding_network.EncodingNetwork(
            observation_spec, preprocessing_layers=scale,
            conv_layer_params=None if conv_layer_params is None else tuple(
                tuple(c) for c in conv_layer_params),
            fc_layer_params=tuple(fc_layer_params), activation_fn=activation_fn,
            kernel_initializer=kernel_initializer, dtype=dtype)
        self._logits = tf.keras.layers.Dense(
            num_actions, kernel_initializer=tf.keras.initializers.Orthogonal(0.01),
            name="policy_logits")
        self._value = tf.keras.layers.Dense(
            1, kernel_initializer=tf.keras.initializers.Orthogonal(1.0), name="value")

    def call(self, observation, step_type=None, network_state=(), training=False):
        hidden, _ = self._torso(observation, step_type=step_type, training=training)
        return (self._logits(hidden), tf.squeeze(self._value(hidden), -1)), network_state


class _ShiftedCategorical(shifted_categorical.ShiftedCategorical):
    """tf-agents' ShiftedCategorical with its own parameters and their
    properties: TFP logs a 25-line warning each time it asks a subclass that
    redefines `__init__` for the `_parameter_properties` it inherits (the
    policy's distribution's batch shape asks), and would rebuild a copy
    without `shift`. `shift` is a Python int, not a batch parameter.

    Args:
        logits: the logits [..., num_actions].
        dtype: the action dtype.
        shift: the smallest action.
    """

    def __init__(self, logits, dtype, shift):
        parameters = dict(locals())
        super().__init__(logits=logits, dtype=dtype, shift=shift)
        self._parameters = parameters

    @classmethod
    def _parameter_properties(cls, dtype, num_classes=None):
        # pylint: disable-next=protected-access
        return tfp.distributions.Categorical._parameter_properties(dtype, num_classes=num_classes)


class ActorCriticPolicy(tf_policy.TFPolicy):
    """Samples actions from an `ActorCriticNetwork`'s logits.

    Args:
        time_step_spec: the environment's TimeStep spec.
        action_spec: the environment's action spec.
        actor_critic_network: the `ActorCriticNetwork`.
        emit_log_probability: record log pi(a|x) of each action in
            `policy_info.log_probability` (the collect policy does).
        name: the policy's name.
    """

    def __init__(self, time_step_spec, action_spec, actor_critic_network,
                 emit_log_probability=False, name=None):
        self._network = actor_critic_network
        self._minimum = int(action_spec.minimum)
        super().__init__(time_step_spec, action_spec, clip=False,
                         emit_log_probability=emit_log_probability, name=name)

    def _variables(self):
        return self._network.variables

    def _distribution(self, time_step, policy_state):
        (logits, _), _ = self._network(time_step.observation, step_type=time_step.step_type)
        return policy_step.PolicyStep(
            _ShiftedCategorical(logits=logits, dtype=self.action_spec.dtype, shift=self._minimum),
            policy_state, ())


@gin.configurable
class ImpalaAgent(tf_agent.TFAgent, roles.UnrollAgent):
    """Actor-critic with V-trace on batches of linked unrolls (module docstring).

    Args:
        time_step_spec: the environment's TimeStep spec.
        action_spec: the environment's action spec (one discrete action).
        actor_critic_network: an `ActorCriticNetwork`.
        optimizer: a Keras optimizer.
        discount_factor: gamma.
        entropy_regularization: the entropy bonus's coefficient.
        value_pred_loss_coef: the baseline loss's coefficient.
        gradient_clipping: clip the gradient's global norm to this (None: no clip).
        clip_rho_threshold: V-trace's rho_bar (`vtrace_returns`).
        clip_pg_rho_threshold: V-trace's clip of the policy-gradient ratio.
        clip_c_threshold: V-trace's c_bar.
        reward_clip: (low, high): rewards are clipped to this for training
            (Atari's [-1, 1]); None: not clipped.
        train_step_counter: the global step variable (incremented by each train).
        debug_summaries: as tf-agents' agents.
        summarize_grads_and_vars: as tf-agents' agents.
        name: the agent's name.
    """

    def __init__(self, time_step_spec, action_spec, actor_critic_network, optimizer,
                 discount_factor=0.99, entropy_regularization=0.01, value_pred_loss_coef=0.5,
                 gradient_clipping=None, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0,
                 clip_c_threshold=1.0, reward_clip=None, train_step_counter=None,
                 debug_summaries=False, summarize_grads_and_vars=False, name="ImpalaAgent"):
        tf.Module.__init__(self, name=name)
        self._network = actor_critic_network
        self._network.create_variables(time_step_spec.observation)
        self._optimizer = optimizer
        self._discount = float(discount_factor)
        self._entropy_coef = float(entropy_regularization)
        self._value_coef = float(value_pred_loss_coef)
        self._gradient_clipping = gradient_clipping
        self._clips = dict(clip_rho_threshold=clip_rho_threshold,
                           clip_pg_rho_threshold=clip_pg_rho_threshold,
                           clip_c_threshold=clip_c_threshold)
        self._reward_clip = reward_clip
        collect_policy = ActorCriticPolicy(time_step_spec, action_spec, actor_critic_network,
                                           emit_log_probability=True)
        policy = greedy_policy.GreedyPolicy(
            ActorCriticPolicy(time_step_spec, action_spec, actor_critic_network))
        super().__init__(time_step_spec, action_spec, policy, collect_policy,
                         train_sequence_length=None, debug_summaries=debug_summaries,
                         summarize_grads_and_vars=summarize_grads_and_vars,
                         train_step_counter=train_step_counter)
        self._minimum = int(action_spec.minimum)

    @property
    def network(self):
        return self._network

    def _initialize(self):
        pass

    def _train(self, experience, weights):
        variables = self._network.trainable_variables
        with tf.GradientTape() as tape:
            loss, extra = self._loss(experience, weights)
        grads = tape.gradient(loss, variables)
        if self._gradient_clipping:
            grads, _ = tf.clip_by_global_norm(grads, self._gradient_clipping)
        if self._summarize_grads_and_vars:
            grads_and_vars = list(zip(grads, variables))
            eager_utils.add_variables_summaries(grads_and_vars, self.train_step_counter)
            eager_utils.add_gradients_summaries(grads_and_vars, self.train_step_counter)
        with tf.name_scope("Losses/"):
            tf.summary.scalar("loss", loss, step=self.train_step_counter)
            for name in ("policy_gradient_loss", "value_estimation_loss", "entropy"):
                tf.summary.scalar(name, getattr(extra, name), step=self.train_step_counter)
        with tf.name_scope("Learner/"):
            for name in ("mean_rho", "clipped_rho_fraction"):
                tf.summary.scalar(name, getattr(extra, name), step=self.train_step_counter)
        self._optimizer.apply_gradients(zip(grads, variables))
        self.train_step_counter.assign_add(1)
        return tf_agent.LossInfo(loss, extra)

    def _loss(self, experience, weights):
        """IMPALA's loss of a [B, T + 1] batch and its `ImpalaLossInfo`."""
        (logits, values), _ = self._network(experience.observation,
                                            step_type=experience.step_type, training=True)
        logits, bootstrap, values = logits[:, :-1], values[:, -1], values[:, :-1]
        distribution = _ShiftedCategorical(logits=logits, dtype=self.action_spec.dtype,
                                           shift=self._minimum)
        log_pi = distribution.log_prob(experience.action[:, :-1])
        boundary = experience.is_boundary()[:, :-1]
        valid = tf.cast(tf.logical_not(boundary), tf.float32)
        if weights is not None:
            valid *= tf.broadcast_to(tf.cast(weights, tf.float32),
                                     tf.shape(experience.reward))[:, :-1]
        count = tf.maximum(tf.reduce_sum(valid), 1.0)
        rewards = tf.cast(experience.reward[:, :-1], tf.float32)
        if self._reward_clip is not None:
            rewards = tf.clip_by_value(rewards, *self._reward_clip)
        # Boundary steps: a TD error of 0 (see the module docstring).
        fixed_values = tf.stop_gradient(values)
        rewards = tf.where(boundary, fixed_values, rewards)
        discounts = tf.where(boundary, 0.0, self._discount * experience.discount[:, :-1])
        log_rhos = tf.where(boundary, 0.0, tf.stop_gradient(log_pi) -
                            experience.policy_info.log_probability[:, :-1])
        returns = vtrace_returns(log_rhos, discounts, rewards, fixed_values,
                                 tf.stop_gradient(bootstrap), **self._clips)

        def mean(t):
            return tf.reduce_sum(t * valid) / count

        pg_loss = -mean(returns.pg_advantages * log_pi)
        value_loss = mean(0.5 * tf.square(returns.vs - values))
        entropy = mean(distribution.entropy())
        loss = pg_loss + self._value_coef * value_loss - self._entropy_coef * entropy
        rhos = tf.exp(log_rhos)
        return loss, ImpalaLossInfo(
            policy_gradient_loss=pg_loss, value_estimation_loss=value_loss, entropy=entropy,
            mean_rho=mean(rhos), clipped_rho_fraction=mean(tf.cast(rhos > 1.0, tf.float32)))
