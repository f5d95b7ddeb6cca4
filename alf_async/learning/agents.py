"""Agent builders for `train(agent_fn=...)`: they make the networks and
optimizers an agent needs from the specs; every other agent argument
is configured on the agent class itself in gin (`DqnAgent.gamma = 0.99`,
`PPOClipAgent.entropy_regularization = 0.01`, `ImpalaAgent.discount_factor`).
Any callable(time_step_spec, action_spec, train_step_counter) -> TFAgent
plugs in the same way.

Two kinds of agent: replay agents (`dqn_agent`, `sac_agent`) train on
windows sampled from a replay buffer, as often as the schedule says;
unroll agents (`ppo_agent`, `impala_agent`; `trains_on_unrolls`) train on
each batch of unrolls the driver delivers, once.
"""

import gin
import tensorflow as tf
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.dqn import dqn_agent as dqn_agent_lib
from tf_agents.agents.ppo import ppo_actor_network, ppo_agent as ppo_agent_lib
from tf_agents.agents.sac import sac_agent as sac_agent_lib
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network, q_network, value_network
from tf_agents.trajectories.time_step import StepType
from tf_agents.utils import common

from alf_async import roles
from alf_async.learning import impala
from alf_async.learning import optimizers
# optimizer_hyperparameters: read here by resume.py; build_optimizer: the
# name the builders call (benchmarks/trace_time.py replaces it here).
from alf_async.learning.builder_parts import (LEARNING_RATE_BINDINGS, build_optimizer,
                                              check_conv, check_count, check_layers,
                                              check_number, check_reward_clip, linear_decay,
                                              optimizer_hyperparameters, scale_pixels,
                                              torso_dtype)
from alf_async.learning.ppo import (ADVANTAGE_NORMALIZATIONS, FreshOrthogonal,
                                    MinibatchPPOClipAgent,
                                    OrthogonalCategoricalProjectionNetwork,
                                    TorsoSharingActorNetwork, TorsoValueNetwork)

# tf-agents' TD losses, for `DqnAgent.td_errors_loss_fn = @element_wise_squared_loss`.
for _loss_fn in (common.element_wise_squared_loss, common.element_wise_huber_loss):
    gin.external_configurable(_loss_fn, module="tf_agents.utils.common")

# Optimizers a gin file may pass as `dqn_agent.optimizer_fn` (Atari's
# published DQN settings use centered RMSprop).
gin.external_configurable(tf.keras.optimizers.RMSprop, module="tf.keras.optimizers")
gin.external_configurable(tf.keras.optimizers.Adam, module="tf.keras.optimizers")


@gin.configurable
def dqn_agent(time_step_spec, action_spec, train_step_counter, fc_layer_params=(64, 64),
              learning_rate=1e-3, epsilon_greedy=0.1, epsilon_final=None,
              epsilon_decay_steps=0, agent_class=dqn_agent_lib.DqnAgent, agent_kwargs=None,
              prebuild_optimizer=True, conv_layer_params=None, optimizer_fn=None,
              reward_clip=None):
    """A DqnAgent (or `agent_class`, e.g. DdqnAgent) with a QNetwork and Adam.

    Image observations (uint8) are scaled to [0, 1] inside the QNetwork, so
    the environments, the queues and the replay keep bytes.

    Args:
        time_step_spec: the environment's TimeStep spec.
        action_spec: the environment's (discrete) action spec.
        train_step_counter: the global step variable the agent increments.
        fc_layer_params: the QNetwork's hidden layer sizes.
        learning_rate: the optimizer's learning rate.
        epsilon_greedy: exploration rate of the collect policy (at train step 0).
        epsilon_final: if set, epsilon decays linearly from `epsilon_greedy` to
            this over `epsilon_decay_steps` train steps (the collect policy
            reads the counter, so running actors follow the decay).
        epsilon_decay_steps: length of the decay in train steps.
        agent_class: the tf-agents agent class.
        agent_kwargs: more arguments of `agent_class` (in gin, bind them on the
            class instead: `DqnAgent.n_step_update = 3`).
        prebuild_optimizer: make the optimizer's slot variables now (see
            `build_optimizer`); False leaves them to the first train step, as
            in tf-agents' own examples.
        conv_layer_params: convolutions before the hidden layers, as
            (filters, kernel size, stride) tuples (the Nature CNN:
            ((32, 8, 4), (64, 4, 2), (64, 3, 1)) with fc_layer_params (512,));
            None: none.
        optimizer_fn: callable(learning_rate) -> a Keras optimizer
            (`@tf.keras.optimizers.RMSprop`, its other arguments bound in
            gin); None: Adam.
        reward_clip: (low, high): the agent trains on rewards clipped to this
            range (Atari's [-1, 1]); the environments, metrics and
            evaluation keep the game's rewards. None: no clipping.
    """
    check_layers("dqn_agent.fc_layer_params", fc_layer_params)
    check_number("dqn_agent.learning_rate", learning_rate, low=0.0, low_open=True)
    check_number("dqn_agent.epsilon_greedy", epsilon_greedy, low=0.0, high=1.0)
    if epsilon_final is not None:
        check_number("dqn_agent.epsilon_final", epsilon_final, low=0.0, high=1.0)
    if not isinstance(epsilon_decay_steps, int) or isinstance(epsilon_decay_steps, bool) or (
            epsilon_decay_steps < 0):
        raise ValueError(f"dqn_agent.epsilon_decay_steps must be an int >= 0, "
                         f"got {epsilon_decay_steps!r}")
    conv = check_conv("dqn_agent.conv_layer_params", conv_layer_params)
    check_reward_clip("dqn_agent.reward_clip", reward_clip)
    # Pixels reach the network as uint8 and are scaled there (Rescaling casts).
    q_net = q_network.QNetwork(
        time_step_spec.observation, action_spec,
        preprocessing_layers=scale_pixels(time_step_spec.observation),
        conv_layer_params=conv, fc_layer_params=tuple(fc_layer_params))
    epsilon = epsilon_greedy
    if epsilon_final is not None and epsilon_decay_steps > 0:
        start, end, steps = float(epsilon_greedy), float(epsilon_final), float(epsilon_decay_steps)

        def epsilon():
            frac = tf.minimum(tf.cast(train_step_counter, tf.float32) / steps, 1.0)
            return start + (end - start) * frac

    optimizer = (optimizer_fn or tf.keras.optimizers.Adam)(learning_rate)
    if reward_clip is not None:
        agent_class = _reward_clipped(agent_class, float(reward_clip[0]), float(reward_clip[1]))
    agent = agent_class(time_step_spec, action_spec, q_network=q_net, optimizer=optimizer,
                        epsilon_greedy=epsilon, train_step_counter=train_step_counter,
                        **(agent_kwargs or {}))
    LEARNING_RATE_BINDINGS[agent._optimizer] = "dqn_agent.learning_rate"
    if prebuild_optimizer:
        # DqnAgent._train applies gradients to exactly these variables.
        build_optimizer(optimizer, q_net.trainable_weights)
    return agent


def _reward_clipped(agent_class, low, high):
    """`agent_class` training on rewards clipped to [low, high]: the clip is
    applied to the experience of each train step (DqnAgent has no option
    for it), so everything upstream of training sees the game's rewards."""

    class RewardClipped(agent_class):

        def _train(self, experience, weights=None):
            experience = experience._replace(
                reward=tf.clip_by_value(experience.reward, low, high))
            return super()._train(experience, weights)

    RewardClipped.__name__ = RewardClipped.__qualname__ = f"RewardClipped{agent_class.__name__}"
    return RewardClipped


@gin.configurable
def sac_agent(time_step_spec, action_spec, train_step_counter,
              actor_fc_layer_params=(256, 256), critic_joint_fc_layer_params=(256, 256),
              actor_learning_rate=3e-4, critic_learning_rate=3e-4, alpha_learning_rate=3e-4):
    """A SacAgent with tf-agents' standard SAC networks (tanh-normal actor) and
    Adams; it does not train on episode boundaries (BoundaryMaskedSacAgent)."""
    check_layers("sac_agent.actor_fc_layer_params", actor_fc_layer_params)
    check_layers("sac_agent.critic_joint_fc_layer_params", critic_joint_fc_layer_params)
    for name, value in (("actor_learning_rate", actor_learning_rate),
                        ("critic_learning_rate", critic_learning_rate),
                        ("alpha_learning_rate", alpha_learning_rate)):
        check_number(f"sac_agent.{name}", value, low=0.0, low_open=True)
    observation_spec = time_step_spec.observation
    actor_net = actor_distribution_network.ActorDistributionNetwork(
        observation_spec, action_spec, fc_layer_params=tuple(actor_fc_layer_params),
        continuous_projection_net=tanh_normal_projection_network.TanhNormalProjectionNetwork)
    critic_net = critic_network.CriticNetwork(
        (observation_spec, action_spec), joint_fc_layer_params=tuple(critic_joint_fc_layer_params),
        kernel_initializer="glorot_uniform", last_kernel_initializer="glorot_uniform")
    agent = BoundaryMaskedSacAgent(
        time_step_spec, action_spec, actor_network=actor_net, critic_network=critic_net,
        actor_optimizer=tf.keras.optimizers.Adam(actor_learning_rate),
        critic_optimizer=tf.keras.optimizers.Adam(critic_learning_rate),
        alpha_optimizer=tf.keras.optimizers.Adam(alpha_learning_rate),
        train_step_counter=train_step_counter)
    # The variables SacAgent._train applies each optimizer's gradients to (the
    # agent builds its second critic network in its constructor; it dedupes
    # the two critics' variables, as here).
    critic_variables = [ref.deref() for ref in dict.fromkeys(
        v.ref() for v in agent._critic_network_1.trainable_variables +
        agent._critic_network_2.trainable_variables)]
    # (SacAgent converts the optimizers to legacy Keras ones: build its copies.)
    for name in ("actor", "critic", "alpha"):
        LEARNING_RATE_BINDINGS[getattr(agent, f"_{name}_optimizer")] = (
            f"sac_agent.{name}_learning_rate")
    build_optimizer(agent._actor_optimizer, actor_net.trainable_variables)
    build_optimizer(agent._critic_optimizer, critic_variables)
    build_optimizer(agent._alpha_optimizer, [agent._log_alpha])
    return agent


class BoundaryMaskedSacAgent(sac_agent_lib.SacAgent):
    """tf-agents' SacAgent that does not train on episode boundaries.

    A replay buffer's windows of 2 steps include the one from an episode's
    LAST step to the next episode's FIRST, which is no transition of the
    environment: trained on, it teaches the critics that the state an
    episode ended in (a Hopper that fell) is worth the discounted value of
    the next episode's start, whatever the action. tf-agents' DqnAgent
    masks these windows out of its loss (`valid_mask = ~time_steps.is_last()`
    in DqnAgent._loss); SacAgent does not, so this gives them weight 0 in
    all three of its losses (critic, actor, alpha: `weights` of SacAgent's
    train). Every gin binding of `SacAgent.*` applies unchanged (its
    __init__ is tf-agents').
    """

    def _train(self, experience, weights=None):
        # [batch, 2] windows; a window whose first step is LAST is a boundary.
        valid = tf.cast(~tf.equal(experience.step_type[:, 0], StepType.LAST), tf.float32)
        return super()._train(experience, valid if weights is None else weights * valid)


# tf-agents' PPO agents train on each batch of unrolls once.
roles.UnrollAgent.register(ppo_agent_lib.PPOAgent)


def trains_on_unrolls(agent):
    """True for agents that train on each batch of unrolls once (a
    `roles.UnrollAgent`: tf-agents' PPO agents, `impala.ImpalaAgent`) rather
    than on a replay buffer's windows."""
    return isinstance(agent, roles.UnrollAgent)


@gin.configurable
def ppo_agent(time_step_spec, action_spec, train_step_counter, actor_fc_layer_params=(64, 64),
              value_fc_layer_params=(64, 64), conv_layer_params=None, learning_rate=3e-4,
              adam_epsilon=1e-5, num_epochs=4, num_minibatches=4, shared_torso=None,
              orthogonal_init=False, advantage_normalization="batch",
              learning_rate_decay_steps=None, torso_dtype_policy="float32", reward_clip=None):
    """tf-agents' PPOClipAgent with an actor-distribution and a value network
    and Adam (`optimizers.FusedAdam`), trained in minibatches
    (`ppo.MinibatchPPOClipAgent`).

    Networks: for discrete actions an `ActorDistributionNetwork`
    (categorical): the convolutions, if any, then the dense layers, ReLU
    with convolutions and tanh without (CleanRL's ppo_atari and ppo);
    uint8 observations are scaled to [0, 1] inside it (and tf-agents'
    observation normalizer is off for them unless bound, which is
    refused). The value network is
    either a head on the actor's torso (`ppo.TorsoValueNetwork`: one
    torso, as OpenAI baselines' ppo2 and CleanRL's ppo_atari have it, so
    the value loss trains the features the policy sees and a minibatch runs
    the torso once) or a `ValueNetwork` of its own (tf-agents' PPO
    examples). For continuous actions tf-agents' own
    MuJoCo PPO actor (`PPOActorNetwork`: tanh layers, a state-independent
    standard deviation) and a tanh `ValueNetwork`, as in its
    ppo_clip_train_eval. Every other PPO argument (clipping, GAE lambda,
    discount, entropy, value coefficient, gradient clipping, normalizers)
    is bound on `PPOClipAgent.*` in gin; the epochs and minibatches are
    this builder's.

    Args:
        time_step_spec: the environment's TimeStep spec.
        action_spec: the environment's action spec.
        train_step_counter: the global step variable (one per minibatch step).
        actor_fc_layer_params: the actor network's dense layers.
        value_fc_layer_params: the value network's dense layers.
        conv_layer_params: (filters, kernel size, stride) tuples before the
            dense layers of both networks (discrete actions only), or None.
        learning_rate: Adam's learning rate.
        adam_epsilon: Adam's epsilon (1e-5 in ppo2 and CleanRL).
        num_epochs: passes over each batch of unrolls.
        num_minibatches: minibatches (of transitions) per pass.
        shared_torso: the value network is a head on the actor's torso
            (`value_fc_layer_params` then unused); None: shared with
            convolutions (pixels), separate without.
        orthogonal_init: ppo2's and CleanRL's initialization of the
            discrete actor: orthogonal kernels of gain sqrt(2) in the torso
            and 0.01 for the logits, zero biases (a separate value
            network's hidden layers get gain sqrt(2) too; the shared value
            head is orthogonal of gain 1 either way). False: tf-agents'
            (Glorot-uniform torso, variance-scaling logits scaled by 0.1).
        advantage_normalization: 'batch', 'minibatch' (ppo2, CleanRL) or
            'none' (`MinibatchPPOClipAgent`).
        learning_rate_decay_steps: the learning rate falls linearly from
            `learning_rate` to 0 over this many gradient steps (ppo2's and
            CleanRL's annealing over the whole run: num_env_steps / batch x
            epochs x minibatches), then stays 0; None: constant.
        torso_dtype_policy: the Keras dtype policy of the discrete
            networks' conv and dense layers (`builder_parts.TORSO_DTYPE_POLICIES`):
            'mixed_bfloat16' computes them in bfloat16 over float32
            variables (the heads, losses and optimizer stay float32);
            'auto' does so where the CPU has AMX or AVX-512 BF16
            (`kernels.bf16_torsos`). The variables are float32 either way, so a
            checkpoint restores under any of them.
        reward_clip: (low, high): the agent trains on rewards clipped to this
            (baselines' ClipRewardEnv for Atari scores: (-1, 1)); metrics,
            replay and evaluation keep the environment's rewards. None: no
            clipping.
    """
    check_layers("ppo_agent.actor_fc_layer_params", actor_fc_layer_params)
    check_reward_clip("ppo_agent.reward_clip", reward_clip)
    check_layers("ppo_agent.value_fc_layer_params", value_fc_layer_params)
    conv = check_conv("ppo_agent.conv_layer_params", conv_layer_params)
    check_number("ppo_agent.learning_rate", learning_rate, low=0.0, low_open=True)
    check_number("ppo_agent.adam_epsilon", adam_epsilon, low=0.0, low_open=True)
    check_count("ppo_agent.num_epochs", num_epochs)
    check_count("ppo_agent.num_minibatches", num_minibatches)
    if learning_rate_decay_steps is not None:
        check_count("ppo_agent.learning_rate_decay_steps", learning_rate_decay_steps)
    if advantage_normalization not in ADVANTAGE_NORMALIZATIONS:
        raise ValueError(f"ppo_agent.advantage_normalization must be one of "
                         f"{ADVANTAGE_NORMALIZATIONS}, got {advantage_normalization!r}")
    observation_spec = time_step_spec.observation
    discrete = action_spec.dtype.is_integer
    if conv is not None and not discrete:
        raise ValueError("ppo_agent.conv_layer_params: convolutional networks are for "
                         "discrete actions (pixels); this environment's actions are continuous")
    activation = tf.keras.activations.relu if conv else tf.keras.activations.tanh
    if shared_torso is None:
        shared_torso = conv is not None
    if shared_torso and not discrete:
        raise ValueError("ppo_agent.shared_torso: the value head shares the torso of the "
                         "discrete actor (ActorDistributionNetwork); continuous actions have "
                         "tf-agents' MuJoCo actor, with no torso to share")
    if orthogonal_init and not discrete:
        raise ValueError("ppo_agent.orthogonal_init: ppo2's initialization is for the discrete "
                         "actor; continuous actions have tf-agents' MuJoCo actor")
    dtype = torso_dtype("ppo_agent.torso_dtype_policy", torso_dtype_policy)
    if torso_dtype_policy != "float32" and not discrete:
        raise ValueError("ppo_agent.torso_dtype_policy: a bfloat16 torso is for the discrete "
                         "actor; continuous actions have tf-agents' MuJoCo actor")
    scale = scale_pixels(observation_spec, dtype)
    initializers = {}
    if orthogonal_init:
        initializers = dict(
            kernel_initializer=FreshOrthogonal(2.0 ** 0.5),
            discrete_projection_net=OrthogonalCategoricalProjectionNetwork)
    if discrete:
        actor_class = (TorsoSharingActorNetwork if shared_torso else
                       actor_distribution_network.ActorDistributionNetwork)
        actor_net = actor_class(
            observation_spec, action_spec, preprocessing_layers=scale, conv_layer_params=conv,
            fc_layer_params=tuple(actor_fc_layer_params), activation_fn=activation,
            dtype=dtype, **initializers)
    else:
        actor_net = ppo_actor_network.PPOActorNetwork().create_sequential_actor_net(
            tuple(actor_fc_layer_params), action_spec)
    if shared_torso:
        value_net = TorsoValueNetwork(actor_net)
    else:
        value_net = value_network.ValueNetwork(
            observation_spec, preprocessing_layers=scale_pixels(observation_spec, dtype),
            conv_layer_params=conv, fc_layer_params=tuple(value_fc_layer_params),
            activation_fn=activation, dtype=dtype,
            kernel_initializer=initializers.get("kernel_initializer"))
    optimizer = optimizers.FusedAdam(
        linear_decay(learning_rate, learning_rate_decay_steps), epsilon=adam_epsilon)
    agent_class = MinibatchPPOClipAgent
    if reward_clip is not None:
        agent_class = _reward_clipped(agent_class, float(reward_clip[0]), float(reward_clip[1]))
    agent = agent_class(
        time_step_spec, action_spec, optimizer=optimizer, actor_net=actor_net,
        value_net=value_net, num_epochs=num_epochs, num_minibatches=num_minibatches,
        advantage_normalization=advantage_normalization,
        train_step_counter=train_step_counter, **_pixel_normalization(observation_spec))
    LEARNING_RATE_BINDINGS[agent._optimizer] = "ppo_agent.learning_rate"
    build_optimizer(agent._optimizer, agent.variables_to_train())
    return agent


def _pixel_normalization(observation_spec):
    """{'normalize_observations': False} for uint8 observations (pixels, scaled
    in the network), unless `PPOClipAgent.normalize_observations` is bound,
    which `MinibatchPPOClipAgent` then refuses; {} otherwise. tf-agents'
    default normalizer would cast the normalized pixels back to uint8."""
    if not any(s.dtype == tf.uint8 for s in tf.nest.flatten(observation_spec)):
        return {}
    try:
        gin.query_parameter("PPOClipAgent.normalize_observations")
    except ValueError:   # not bound: the pixels are scaled in the network
        return {"normalize_observations": False}
    return {}


@gin.configurable
def impala_agent(time_step_spec, action_spec, train_step_counter, conv_layer_params=None,
                 fc_layer_params=(64, 64), learning_rate=6e-4, optimizer_fn=None,
                 orthogonal_init=False, learning_rate_decay_steps=None,
                 torso_dtype_policy="float32"):
    """An `impala.ImpalaAgent` (V-trace actor-critic) with one shared-torso
    `ActorCriticNetwork`; discrete actions only. Its other arguments (discount,
    entropy, coefficients, V-trace clips, gradient clipping, reward clipping)
    are bound on `ImpalaAgent.*` in gin.

    Args:
        time_step_spec: the environment's TimeStep spec.
        action_spec: the environment's (discrete) action spec.
        train_step_counter: the global step variable (one per batch).
        conv_layer_params: (filters, kernel size, stride) tuples, or None.
        fc_layer_params: the torso's dense layers after the convolutions.
        learning_rate: the optimizer's learning rate.
        optimizer_fn: callable(learning_rate) -> a Keras optimizer
            (`@TF1RMSprop`, as a2c's and IMPALA's code: TensorFlow 1's
            RMSprop, `alf_async.learning.optimizers`); None: Adam (`FusedAdam`).
        orthogonal_init: OpenAI baselines' a2c initialization of the torso:
            orthogonal kernels of gain sqrt(2), one initializer per kernel.
            False: tf-agents' EncodingNetwork's (He: truncated normal,
            variance scaling 2 over fan in). The heads are orthogonal
            either way (gain 0.01 for the logits, 1 for the value).
        learning_rate_decay_steps: the learning rate falls linearly from
            `learning_rate` to 0 over this many gradient steps (one per
            batch), as a2c's; None: constant.
        torso_dtype_policy: the Keras dtype policy of the torso's conv and
            dense layers, as `ppo_agent`'s.
    """
    conv = check_conv("impala_agent.conv_layer_params", conv_layer_params)
    check_layers("impala_agent.fc_layer_params", fc_layer_params)
    check_number("impala_agent.learning_rate", learning_rate, low=0.0, low_open=True)
    if learning_rate_decay_steps is not None:
        check_count("impala_agent.learning_rate_decay_steps", learning_rate_decay_steps)
    if not action_spec.dtype.is_integer or action_spec.shape.rank != 0:
        raise ValueError(f"impala_agent takes one discrete action; this environment's action "
                         f"spec is {action_spec}")
    net = impala.ActorCriticNetwork(
        time_step_spec.observation, action_spec, conv_layer_params=conv,
        fc_layer_params=fc_layer_params,
        kernel_initializer=FreshOrthogonal(2.0 ** 0.5) if orthogonal_init else None,
        dtype=torso_dtype("impala_agent.torso_dtype_policy", torso_dtype_policy))
    optimizer = (optimizer_fn or optimizers.FusedAdam)(
        linear_decay(learning_rate, learning_rate_decay_steps))
    agent = impala.ImpalaAgent(time_step_spec, action_spec, net, optimizer,
                               train_step_counter=train_step_counter)
    LEARNING_RATE_BINDINGS[agent._optimizer] = "impala_agent.learning_rate"
    build_optimizer(agent._optimizer, net.trainable_variables)
    return agent


