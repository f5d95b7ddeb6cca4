"""MinibatchPPOClipAgent: tf-agents' PPOClipAgent trained on a batch of
unrolls the way the standard recipe does (Schulman et al. 2017; OpenAI
baselines' ppo2; CleanRL's ppo_atari).

tf-agents' `PPOAgent.train` runs `num_epochs` gradient steps, each on the
whole batch; its minibatching lives in a separate learner
(`tf_agents.agents.ppo.ppo_learner`) that splits a dataset pipeline and
needs the advantages computed at collection time. Here the batch is
whatever the learner dequeued (`OneTimeReplayer`: [B, T + 1], each row's
unroll preceded by the step its previous unroll ended with), and one
`train()` call does what ppo2 does with it:

1. values of every step under the current value network, then returns and
   GAE advantages once for the batch (tf-agents' own `_preprocess`);
2. the B x T transitions (each row's last step only bootstraps; episode
   boundaries are masked out) are shuffled, `num_epochs` times, and split
   into `num_minibatches` minibatches of transitions;
3. one gradient step of tf-agents' clipped PPO loss (`get_loss`: the
   policy-gradient, value and entropy terms, ratio against the behaviour
   policy's `dist_params` recorded at act time) per minibatch, with the
   advantages normalized over each minibatch's valid transitions (ppo2,
   CleanRL: `advantage_normalization='minibatch'`) or over the batch's
   (tf-agents' PPOAgent: 'batch').

So one `train()` is num_epochs x num_minibatches gradient steps and
advances `train_step_counter` by as many, as tf-agents' PPO advances it
once per epoch. Its `LossInfo` and its summaries (tf-agents' PPO tags,
`Losses/policy_gradient_loss` ... `Losses/total_abs_loss`, and
`Losses/clip_fraction`) are the means over those steps, written at the
train step the update ends on, as tf-agents' PPO writes its epochs' means.

One correction to tf-agents 0.19: `PPOAgent.compute_advantages` bootstraps
GAE with the value of the unroll's second-to-last step (it slices the last
one off before reading it; tensorflow/agents#953). Here the last step's
value bootstraps the unroll, as in GAE's definition.

Threads: the learner's (inside its traced train step).
"""

import threading

import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.ppo import ppo_clip_agent, ppo_utils
from tf_agents.agents.ppo.ppo_agent import PPOLossInfo
from tf_agents.networks import actor_distribution_network, categorical_projection_network, network
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common, nest_utils, object_identity, value_ops


class TorsoSharingActorNetwork(actor_distribution_network.ActorDistributionNetwork):
    """tf-agents' `ActorDistributionNetwork` whose torso output a
    `TorsoValueNetwork` reuses: each call remembers, for the calling thread,
    its observations and the torso's output, so that a value head called
    next on the same observations (PPO's loss calls the actor, then the
    value network, on one minibatch) reads that output instead of running
    the torso again (the convolutions are most of a train step). The memo
    only matches the very same tensor, in the trace or eager call that made
    it; anything else runs the torso. Arguments: `ActorDistributionNetwork`'s.
    """

    def __init__(self, input_tensor_spec, output_tensor_spec, **kwargs):
        super().__init__(input_tensor_spec, output_tensor_spec, **kwargs)
        self._torso_memo = threading.local()

    def call(self, observations, step_type, network_state, training=False, mask=None):
        hidden, network_state = self._encoder(observations, step_type=step_type,
                                              network_state=network_state, training=training)
        self._torso_memo.last = (observations, hidden, training)
        outer_rank = nest_utils.get_outer_rank(observations, self.input_tensor_spec)
        distributions = tf.nest.map_structure(
            lambda net: net(hidden, outer_rank, training=training, mask=mask)[0],
            self._projection_networks)
        return distributions, network_state

    def torso(self, observations, step_type=None, training=False):
        """The torso's output for `observations`: the remembered one if the
        last call of this thread was on the same tensor, else computed."""
        last = getattr(self._torso_memo, "last", None)
        if last is not None and last[0] is observations and last[2] == training:
            return last[1]
        hidden, _ = self._encoder(observations, step_type=step_type, training=training)
        return hidden


class FreshOrthogonal(tf.keras.initializers.Initializer):
    """Keras' `Orthogonal(gain)`, a new one for each kernel: one unseeded
    Keras initializer returns the same values on every call, and tf-agents'
    networks call their one `kernel_initializer` for every layer.

    Args:
        gain: the orthogonal matrix's multiplier.
    """

    def __init__(self, gain=1.0):
        self.gain = gain

    def __call__(self, shape, dtype=None, **kwargs):
        return tf.keras.initializers.Orthogonal(self.gain)(shape, dtype=dtype, **kwargs)

    def get_config(self):
        return {"gain": self.gain}


class OrthogonalCategoricalProjectionNetwork(
        categorical_projection_network.CategoricalProjectionNetwork):
    """tf-agents' categorical (logits) head with an orthogonal kernel of
    `gain` and zero biases: ppo2's and CleanRL's policy head (gain 0.01, so
    the first policy is near uniform whatever the torso gives). tf-agents'
    own head scales a variance-scaling kernel by `logits_init_output_factor`
    (0.1) and offers no orthogonal one.

    Args:
        sample_spec: the discrete action spec.
        gain: the orthogonal initializer's gain.
        name: the network's name.
    """

    def __init__(self, sample_spec, gain=0.01, name="OrthogonalCategoricalProjectionNetwork"):
        super().__init__(sample_spec, name=name)
        self._projection_layer = tf.keras.layers.Dense(
            self._output_shape.num_elements(),
            kernel_initializer=tf.keras.initializers.Orthogonal(gain),
            bias_initializer=tf.keras.initializers.Zeros(), name="logits")


class TorsoValueNetwork(network.Network):
    """A value head on the torso of a `TorsoSharingActorNetwork`: one torso
    for the policy and the value, as OpenAI baselines' ppo2, CleanRL's
    ppo_atari and IMPALA have it, so the value loss (a dense signal) trains
    the features the policy reads, and a minibatch runs the torso once for
    both. tf-agents' PPO examples give the value its own network, whose
    features the policy never sees.

    Args:
        actor_net: the `TorsoSharingActorNetwork` whose torso is shared.
        name: the network's name.
    """

    def __init__(self, actor_net, name="TorsoValueNetwork"):
        super().__init__(input_tensor_spec=actor_net.input_tensor_spec, state_spec=(),
                         name=name)
        self._actor = actor_net
        self._head = tf.keras.layers.Dense(
            1, kernel_initializer=tf.keras.initializers.Orthogonal(1.0), name="value")

    def call(self, observation, step_type=None, network_state=(), training=False):
        hidden = self._actor.torso(observation, step_type=step_type, training=training)
        return tf.squeeze(self._head(hidden), -1), network_state


ADVANTAGE_NORMALIZATIONS = ("batch", "minibatch", "none")


class MinibatchPPOClipAgent(ppo_clip_agent.PPOClipAgent):
    """PPOClipAgent with minibatched epochs over its batch's transitions.

    Args:
        *args: `PPOClipAgent`'s positional arguments.
        num_minibatches: minibatches each pass is split into (transitions
            that do not divide evenly are left out of that pass).
        advantage_normalization: where the advantages are normalized to
            mean 0 and standard deviation 1: 'batch' (over the batch's valid
            transitions, once, as tf-agents' PPOAgent), 'minibatch' (over
            each minibatch's, as ppo2 and CleanRL) or 'none'.
        **kwargs: `PPOClipAgent`'s keyword arguments (num_epochs: passes
            over each batch; compute_value_and_advantage_in_train must
            stay True).
    """

    def __init__(self, *args, num_minibatches=1, advantage_normalization="batch", **kwargs):
        if not isinstance(num_minibatches, int) or isinstance(num_minibatches, bool) or (
                num_minibatches < 1):
            raise ValueError(f"num_minibatches must be an int >= 1, got {num_minibatches!r}")
        if advantage_normalization not in ADVANTAGE_NORMALIZATIONS:
            raise ValueError(f"advantage_normalization must be one of "
                             f"{ADVANTAGE_NORMALIZATIONS}, got {advantage_normalization!r}")
        if not kwargs.get("compute_value_and_advantage_in_train", True):
            raise ValueError("MinibatchPPOClipAgent computes values and advantages in train(): "
                             "compute_value_and_advantage_in_train must be True")
        super().__init__(*args, **kwargs)
        if self._observation_normalizer is not None and any(
                spec.dtype == tf.uint8 for spec in tf.nest.flatten(self.time_step_spec.observation)):
            # tf-agents' normalizer casts what it normalized (a few units
            # around 0) back to the observation's dtype: uint8 pixels would
            # be lost. It would also give the policy and the value head two
            # tensors, so a shared torso would run twice.
            raise ValueError("PPOClipAgent.normalize_observations: these observations are uint8 "
                             "pixels (scaled in the network), which tf-agents' normalizer casts "
                             "back to uint8 after normalizing: bind "
                             "PPOClipAgent.normalize_observations = False, or leave it unbound")
        self._num_minibatches = num_minibatches
        self._advantage_normalization = advantage_normalization

    @property
    def num_minibatches(self):
        return self._num_minibatches

    @property
    def num_epochs(self):
        return self._num_epochs

    @property
    def advantage_normalization(self):
        return self._advantage_normalization

    def variables_to_train(self):
        """The actor's and value network's trainable variables, deduplicated
        and sorted by name (what each gradient step updates; `build_optimizer`
        builds the optimizer for exactly these)."""
        return sorted(object_identity.ObjectIdentitySet(
            self._actor_net.trainable_weights + self._value_net.trainable_weights),
                      key=lambda v: v.name)

    def compute_advantages(self, rewards, returns, discounts, value_preds):
        """GAE (or returns - values), bootstrapped with the last step's value.

        Args:
            rewards: [B, T].
            returns: [B, T] (used without GAE).
            discounts: [B, T].
            value_preds: [B, T + 1], the last the unroll's bootstrap value.
        """
        final_value = value_preds[:, -1]
        values = value_preds[:, :-1]
        if not self._use_gae:
            return returns - values
        return value_ops.generalized_advantage_estimation(
            values=values, final_value=final_value, rewards=rewards, discounts=discounts,
            td_lambda=self._lambda, time_major=False)

    def _train(self, experience, weights):
        experience = self._as_trajectory(experience)
        processed = self._preprocess(experience)   # [B, T + 1]; the last step's are 0
        valid = tf.cast(tf.logical_not(processed.is_boundary()), tf.float32)
        if weights is not None:
            valid *= tf.broadcast_to(tf.cast(weights, tf.float32), tf.shape(valid))
        old_distribution = ppo_utils.distribution_from_spec(
            self._action_distribution_spec, processed.policy_info["dist_params"],
            legacy_distribution_network=isinstance(self._actor_net, network.DistributionNetwork))
        old_log_probs = common.log_probability(old_distribution, processed.action,
                                               self._action_spec)
        time_steps = ts.TimeStep(step_type=processed.step_type, reward=processed.reward,
                                 discount=processed.discount, observation=processed.observation)

        def transitions(t):
            """[B, T + 1, ...] -> the B x T transitions [N, ...] (last steps dropped)."""
            t = t[:, :-1]
            return tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], axis=0))

        batch = tf.nest.map_structure(transitions, dict(
            time_steps=time_steps, actions=processed.action, old_log_probs=old_log_probs,
            returns=processed.policy_info["return"],
            advantages=processed.policy_info["advantage"],
            dist_params=processed.policy_info["dist_params"],
            old_values=processed.policy_info["value_prediction"], weights=valid))
        if self._advantage_normalization == "batch":
            batch["advantages"] = _normalized(batch["advantages"], batch["weights"])
        n = tf.shape(batch["weights"])[0]
        size = n // self._num_minibatches
        order = tf.concat([tf.random.shuffle(tf.range(n)) for _ in range(self._num_epochs)],
                          axis=0)
        variables = self.variables_to_train()

        def minibatch_step(i, sums):
            # Minibatch i % num_minibatches of epoch i // num_minibatches.
            start = (i // self._num_minibatches) * n + (i % self._num_minibatches) * size
            index = order[start:start + size]
            mb = tf.nest.map_structure(lambda t: tf.gather(t, index)[:, None], batch)
            if self._advantage_normalization == "minibatch":
                mb["advantages"] = _normalized(mb["advantages"], mb["weights"])
            # One minibatch's summaries would stand for the update: the update's
            # means are written after the loop instead.
            with tf.GradientTape() as tape, tf.summary.record_if(False):
                loss_info = self.get_loss(
                    mb["time_steps"], mb["actions"], mb["old_log_probs"], mb["returns"],
                    mb["advantages"], mb["dist_params"], mb["weights"],
                    self.train_step_counter, self._debug_summaries,
                    old_value_predictions=mb["old_values"], training=True)
            grads = tape.gradient(loss_info.loss, variables)
            if self._gradient_clipping > 0:
                grads, _ = tf.clip_by_global_norm(grads, self._gradient_clipping)
            self._optimizer.apply_gradients(zip(grads, variables))
            self.train_step_counter.assign_add(1)
            return i + 1, [a + b for a, b in zip(sums, _flat_loss(loss_info))]

        steps = self._num_epochs * self._num_minibatches
        zero = tf.constant(0.0)
        _, sums = tf.while_loop(lambda i, _: i < steps, minibatch_step,
                                (tf.constant(0), [zero] * len(_LOSS_FIELDS)),
                                parallel_iterations=1)
        means = [total / float(steps) for total in sums]
        _summarize(dict(zip(_LOSS_FIELDS, means)), self.train_step_counter)
        if self.update_normalizers_in_train:
            self.update_observation_normalizer(time_steps.observation)
            self.update_reward_normalizer(processed.reward)
        return tf_agent.LossInfo(means[0], PPOLossInfo(*means[1:]))


_LOSS_FIELDS = ("loss", "policy_gradient_loss", "value_estimation_loss",
                "l2_regularization_loss", "entropy_regularization_loss", "kl_penalty_loss",
                "clip_fraction")


def _summarize(means, step):
    """The update's mean losses under tf-agents' PPO tags (`Losses/...`,
    with its `total_abs_loss`), and `Losses/clip_fraction`."""
    terms = ("policy_gradient_loss", "value_estimation_loss", "l2_regularization_loss",
             "entropy_regularization_loss", "kl_penalty_loss")
    with tf.name_scope("Losses/"):
        for name in terms + ("clip_fraction",):
            tf.summary.scalar(name, means[name], step=step)
        tf.summary.scalar("total_abs_loss", tf.add_n([tf.abs(means[n]) for n in terms]),
                          step=step)


def _flat_loss(loss_info):
    """A PPO LossInfo as the scalars of `_LOSS_FIELDS` (the while loop carries them)."""
    extra = loss_info.extra
    return [tf.cast(tf.reshape(v, []), tf.float32) for v in (
        loss_info.loss, extra.policy_gradient_loss, extra.value_estimation_loss,
        extra.l2_regularization_loss, extra.entropy_regularization_loss,
        extra.kl_penalty_loss, extra.clip_fraction)]


def _normalized(advantages, weights):
    """Advantages normalized to mean 0, std 1 over the valid (weight > 0) ones."""
    count = tf.maximum(tf.reduce_sum(weights), 1.0)
    mean = tf.reduce_sum(advantages * weights) / count
    variance = tf.reduce_sum(tf.square(advantages - mean) * weights) / count
    return (advantages - mean) / (tf.sqrt(variance) + 1e-8)
