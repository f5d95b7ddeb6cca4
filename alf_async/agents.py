"""Agent builders for `train(agent_fn=...)`: they make the networks and
optimizers a tf-agents agent needs from the specs; every other agent argument
is configured on the tf-agents class itself in gin (`DqnAgent.gamma = 0.99`).
Any callable(time_step_spec, action_spec, train_step_counter) -> TFAgent
plugs in the same way.
"""

import gin
import tensorflow as tf
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.dqn import dqn_agent as dqn_agent_lib
from tf_agents.agents.sac import sac_agent as sac_agent_lib
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network, q_network
from tf_agents.utils import common

# tf-agents' TD losses, for `DqnAgent.td_errors_loss_fn = @element_wise_squared_loss`.
for _loss_fn in (common.element_wise_squared_loss, common.element_wise_huber_loss):
    gin.external_configurable(_loss_fn, module="tf_agents.utils.common")



@gin.configurable
def dqn_agent(time_step_spec, action_spec, train_step_counter, fc_layer_params=(64, 64),
              learning_rate=1e-3, epsilon_greedy=0.1, epsilon_final=None,
              epsilon_decay_steps=0, agent_class=dqn_agent_lib.DqnAgent, agent_kwargs=None,
              prebuild_optimizer=True):
    """A DqnAgent (or `agent_class`, e.g. DdqnAgent) with a QNetwork and Adam.

    Args:
        time_step_spec: the environment's TimeStep spec.
        action_spec: the environment's (discrete) action spec.
        train_step_counter: the global step variable the agent increments.
        fc_layer_params: the QNetwork's hidden layer sizes.
        learning_rate: Adam's learning rate.
        epsilon_greedy: exploration rate of the collect policy (at train step 0).
        epsilon_final: if set, epsilon decays linearly from `epsilon_greedy` to
            this over `epsilon_decay_steps` train steps (the collect policy
            reads the counter, so running actors follow the decay).
        epsilon_decay_steps: length of the decay in train steps.
        agent_class: the tf-agents agent class.
        agent_kwargs: more arguments of `agent_class` (in gin, bind them on the
            class instead: `DqnAgent.n_step_update = 3`).
        prebuild_optimizer: make Adam's slot variables now (see
            `build_optimizer`); False leaves them to the first train step, as
            in tf-agents' own examples.
    """
    q_net = q_network.QNetwork(time_step_spec.observation, action_spec,
                               fc_layer_params=tuple(fc_layer_params))
    epsilon = epsilon_greedy
    if epsilon_final is not None and epsilon_decay_steps > 0:
        start, end, steps = float(epsilon_greedy), float(epsilon_final), float(epsilon_decay_steps)

        def epsilon():
            frac = tf.minimum(tf.cast(train_step_counter, tf.float32) / steps, 1.0)
            return start + (end - start) * frac

    optimizer = tf.keras.optimizers.Adam(learning_rate)
    agent = agent_class(time_step_spec, action_spec, q_network=q_net, optimizer=optimizer,
                        epsilon_greedy=epsilon, train_step_counter=train_step_counter,
                        **(agent_kwargs or {}))
    if prebuild_optimizer:
        # DqnAgent._train applies gradients to exactly these variables.
        build_optimizer(optimizer, q_net.trainable_weights)
    return agent


@gin.configurable
def sac_agent(time_step_spec, action_spec, train_step_counter,
              actor_fc_layer_params=(256, 256), critic_joint_fc_layer_params=(256, 256),
              actor_learning_rate=3e-4, critic_learning_rate=3e-4, alpha_learning_rate=3e-4):
    """A SacAgent with tf-agents' standard SAC networks (tanh-normal actor) and Adams."""
    observation_spec = time_step_spec.observation
    actor_net = actor_distribution_network.ActorDistributionNetwork(
        observation_spec, action_spec, fc_layer_params=tuple(actor_fc_layer_params),
        continuous_projection_net=tanh_normal_projection_network.TanhNormalProjectionNetwork)
    critic_net = critic_network.CriticNetwork(
        (observation_spec, action_spec), joint_fc_layer_params=tuple(critic_joint_fc_layer_params),
        kernel_initializer="glorot_uniform", last_kernel_initializer="glorot_uniform")
    agent = sac_agent_lib.SacAgent(
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
    build_optimizer(agent._actor_optimizer, actor_net.trainable_variables)
    build_optimizer(agent._critic_optimizer, critic_variables)
    build_optimizer(agent._alpha_optimizer, [agent._log_alpha])
    return agent


def build_optimizer(optimizer, variables):
    """Creates a Keras optimizer's slot variables for `variables` now.

    Otherwise the optimizer creates them in the first `apply_gradients`, that
    is inside the first trace of the train step, and a tf.function that
    creates variables is traced twice. `python benchmarks/trace_time.py`:
    DdqnAgent.train (CartPole) 0.49 -> 0.24 s, SacAgent.train (Pendulum)
    1.24 -> 0.57 s.
    `variables` must be exactly the list the agent applies gradients to (a
    built Keras optimizer refuses variables it was not built with).
    """
    if isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        optimizer._create_all_weights(variables)  # legacy optimizers have no public build()
    elif isinstance(optimizer, tf.keras.optimizers.Optimizer):
        optimizer.build(variables)


# ------------------------------------------------------------------ evaluation
