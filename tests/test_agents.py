"""The agent builders: their train step traces once and trains every variable."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import suite_gym
from tf_agents.specs import tensor_spec
from tf_agents.utils import common

from alf_async.learning import agents


def _specs(env_name):
    env = suite_gym.load(env_name)
    try:
        return (tensor_spec.from_spec(env.time_step_spec()),
                tensor_spec.from_spec(env.action_spec()))
    finally:
        env.close()


def _traces_and_train(agent, variables, steps=3):
    """(traces of a tf.function around agent.train, how many of `variables` changed)."""
    spec = agent.collect_data_spec
    experience = tensor_spec.sample_spec_nest(
        spec, outer_dims=(8, agent.train_sequence_length or 2), seed=1)
    # Every step of the windows is a mid-episode step (tf-agents' n-step
    # transitions need them), with a discount of 1; observations and rewards
    # are standard normal (the specs' bounds are +-3.4e38 for CartPole).
    shape = tf.shape(experience.reward)
    experience = experience._replace(
        step_type=tf.ones_like(experience.step_type),
        next_step_type=tf.ones_like(experience.next_step_type),
        discount=tf.ones_like(experience.discount),
        reward=tf.random.stateless_normal(shape, seed=(1, 2)),
        observation=tf.random.stateless_normal(tf.shape(experience.observation), seed=(3, 4)))
    traces = []

    def train(exp):
        traces.append(1)
        return agent.train(exp)

    train_fn = common.function(train)
    before = [v.numpy() for v in variables]
    losses = [float(train_fn(experience).loss) for _ in range(steps)]
    changed = sum(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
    assert all(np.isfinite(losses))
    return len(traces), changed


@pytest.mark.timeout(120)
def test_dqn_train_step_traces_once():
    time_step_spec, action_spec = _specs("CartPole-v0")
    step = tf.Variable(0, dtype=tf.int64)
    agent = agents.dqn_agent(time_step_spec, action_spec, step, fc_layer_params=(8,),
                             agent_kwargs=dict(n_step_update=2))
    agent.initialize()
    q_variables = agent._q_network.trainable_variables
    traces, changed = _traces_and_train(agent, q_variables)
    # Without the optimizer built in advance: 2 (a function that creates
    # variables is traced again).
    assert traces == 1
    assert changed == len(q_variables) == 4  # 2 layers: kernels and biases
    assert int(step) == 3


@pytest.mark.timeout(120)
def test_dqn_without_prebuild_traces_twice():
    """What the builder saves (tf-agents' examples build the optimizer lazily)."""
    time_step_spec, action_spec = _specs("CartPole-v0")
    agent = agents.dqn_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64),
                             fc_layer_params=(8,), agent_kwargs=dict(n_step_update=2),
                             prebuild_optimizer=False)
    agent.initialize()
    traces, changed = _traces_and_train(agent, agent._q_network.trainable_variables)
    assert (traces, changed) == (2, 4)


@pytest.mark.timeout(120)
def test_sac_train_step_traces_once():
    time_step_spec, action_spec = _specs("Pendulum-v1")
    step = tf.Variable(0, dtype=tf.int64)
    agent = agents.sac_agent(time_step_spec, action_spec, step, actor_fc_layer_params=(8,),
                             critic_joint_fc_layer_params=(8,))
    agent.initialize()
    variables = (agent._actor_network.trainable_variables +
                 agent._critic_network_1.trainable_variables +
                 agent._critic_network_2.trainable_variables + [agent._log_alpha])
    traces, changed = _traces_and_train(agent, variables)
    assert traces == 1
    # Each optimizer moved every variable it was built for.
    assert changed == len(variables) == 4 + 4 + 4 + 1
    assert int(step) == 3


@pytest.mark.timeout(120)
def test_sac_does_not_train_on_episode_boundaries():
    """A window from an episode's LAST step to the next FIRST is no transition:
    weight 0 in SAC's losses, as DqnAgent masks it. A batch of boundaries
    only has zero losses and leaves every variable as it was; the same batch
    as mid-episode windows trains them."""
    import gin  # pylint: disable=import-outside-toplevel
    time_step_spec, action_spec = _specs("Pendulum-v1")
    with gin.unlock_config():
        gin.bind_parameter("SacAgent.gamma", 0.5)   # SacAgent.* bindings still apply
    try:
        agent = agents.sac_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64),
                                 actor_fc_layer_params=(8,), critic_joint_fc_layer_params=(8,))
    finally:
        gin.clear_config()
    assert isinstance(agent, agents.BoundaryMaskedSacAgent) and agent._gamma == 0.5
    agent.initialize()
    variables = (agent._actor_network.trainable_variables +
                 agent._critic_network_1.trainable_variables +
                 agent._critic_network_2.trainable_variables + [agent._log_alpha])
    experience = tensor_spec.sample_spec_nest(agent.collect_data_spec, outer_dims=(8, 2), seed=1)
    experience = experience._replace(
        reward=tf.random.stateless_normal([8, 2], seed=(1, 2)),
        discount=tf.ones([8, 2]),
        observation=tf.random.stateless_normal([8, 2, 3], seed=(3, 4)))
    boundaries = experience._replace(step_type=tf.constant([[2, 0]] * 8),
                                     next_step_type=tf.constant([[0, 1]] * 8))
    before = [v.numpy() for v in variables]
    loss = agent.train(boundaries)
    assert float(loss.loss) == 0.0
    assert all(float(x) == 0.0 for x in tf.nest.flatten(loss.extra))
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
    mid = experience._replace(step_type=tf.ones([8, 2], tf.int32),
                              next_step_type=tf.ones([8, 2], tf.int32))
    assert float(agent.train(mid).loss) != 0.0
    assert all(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
